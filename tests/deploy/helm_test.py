#!/usr/bin/python3
"""The Helm chart (deploy/helm/tandem), checked with the real helm.

  1. `helm lint --strict` passes, with the defaults and with every option on
     (golden/all-on.values.yaml).
  2. Golden renders: `helm template` with the defaults and with all options
     on equals golden/default.yaml and golden/all-on.yaml. After a deliberate
     change, regenerate them with
         TANDEM_UPDATE_GOLDEN=1 tests/deploy/helm_test.py BUILD_DIR SOURCE_DIR
     and review the diff.
  3. values.schema.json: every object in it says which keys it takes
     (additionalProperties), and each bad value fails `helm template` with a
     schema error: replicas=-1, worker.backend=tpu, kvstore.durability=never,
     scheduler.maxNumSeqss=4 (a typo), worker.gpus=2,
     frontend.toolCallParser=granite (a parser the frontend refuses).
  4. Flags: every flag the chart passes (defaults and all-on, extraArgs
     included) is one the built binary's --help lists.
  5. Probes: liveness and startup on "tandem.liveness", readiness on the
     service's own name, every probe on the port the container listens on.
  6. Security: the defaults pass Pod Security "restricted" (checked here,
     rule by rule); the pods run as the image's user (deploy/docker/Dockerfile
     USER), with fsGroup so the KV-store can write its volume, and a /tmp
     emptyDir under the read-only root file system.
  7. The rest of the defaults: StatefulSet + volume for the KV-store, GPU
     requests = limits, the scheduler reaches its worker on loopback and the
     store through its Service (bulk port under its own number), no surge
     of GPU pods, the drain fits the grace period.
  8. Other values: cpu backend, no KV-store, ServiceMonitor ports,
     PrometheusRule = files/rules.yaml, KEDA and HPA on queue depth (the
     query parses), NetworkPolicies (only replicas reach the store, only the
     frontend reaches the schedulers, metrics from the monitoring peers).
  9. The local socket (kvstore.localSocket): off by default (no hostPath
     anywhere); on, the store binds it in the node's directory, which the
     store and the workers mount at the same path, and only a chown runs
     as root.

Usage: helm_test.py BUILD_DIR SOURCE_DIR
"""
import difflib
import os
import re
import subprocess
import sys
import tempfile

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deploy_common import (NAMESPACE, RELEASE, all_containers, by_kind_name, chart_dir,  # noqa: E402
                           find_helm, find_promtool, helm_template, objects, pod_specs,
                           render_text)

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "golden")
ALL_ON = os.path.join(GOLDEN, "all-on.values.yaml")
BINARIES = {"kvstore": "services/kvstore/tandem-kvstore",
            "scheduler": "services/scheduler/tandem-scheduler",
            "worker": "services/worker/tandem-worker",
            "frontend": "services/frontend/tandem-frontend"}
# The frontend speaks HTTP: its probes are HTTP GETs of these paths.
FRONTEND_PROBES = {"livenessProbe": "/health?live=1", "readinessProbe": "/health"}
READINESS = {"kvstore": "tandem.v1.KvStore", "scheduler": "tandem.v1.Generation",
             "worker": "tandem.v1.Worker"}
LIVENESS = "tandem.liveness"


def one(objs, kind):
    found = [o for o in objs if o["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind} objects"
    return found[0]


def replica(objs):
    """The scheduler+worker Deployment (the frontend has its own)."""
    found = [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == RELEASE]
    assert len(found) == 1, [o["metadata"]["name"] for o in objs if o["kind"] == "Deployment"]
    return found[0]


def containers(obj):
    return {c["name"]: c for c in obj["spec"]["template"]["spec"]["containers"]}


def flags_of(build_dir, binary, *subcommand):
    out = subprocess.run([os.path.join(build_dir, binary), *subcommand, "--help"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    # "  --name[, --no-name][, --alias] (default: ...)": every spelling.
    names = set()
    for head in re.findall(r"^  (--[a-z0-9-]+(?:, --[a-z0-9-]+)*) ", out.stdout, re.M):
        names |= set(re.findall(r"--([a-z0-9-]+)", head))
    return names


def arg(c, flag):
    for a in c["args"]:
        if a.startswith(f"--{flag}="):
            return a.split("=", 1)[1]
    return None


# 1. ------------------------------------------------------------------------
def check_lint(helm, chart):
    for extra in ([], ["-f", ALL_ON]):
        lint = subprocess.run([helm, "lint", "--strict", chart] + extra, capture_output=True,
                              text=True)
        assert lint.returncode == 0, lint.stdout + lint.stderr
    print("helm lint --strict: clean (defaults, all options on)")


# 2. ------------------------------------------------------------------------
def check_golden(helm, chart):
    update = os.environ.get("TANDEM_UPDATE_GOLDEN") == "1"
    for name, files in (("default", []), ("all-on", [ALL_ON])):
        got = render_text(helm, chart, files)
        path = os.path.join(GOLDEN, f"{name}.yaml")
        if update:
            with open(path, "w") as f:
                f.write(got)
            print(f"golden: wrote {os.path.relpath(path, HERE)}")
            continue
        with open(path) as f:
            want = f.read()
        if got != want:
            diff = "".join(list(difflib.unified_diff(
                want.splitlines(True), got.splitlines(True), f"golden/{name}.yaml",
                "helm template"))[:80])
            raise AssertionError(
                f"the {name} render differs from golden/{name}.yaml (if intended, regenerate "
                f"with TANDEM_UPDATE_GOLDEN=1 and review):\n{diff}")
    if not update:
        print("golden: the default and all-on renders equal golden/default.yaml, "
              "golden/all-on.yaml")


# 3. ------------------------------------------------------------------------
def open_objects(node, path="$"):
    """Paths of object schemas that do not say which keys they take."""
    found = []
    if isinstance(node, dict):
        if node.get("type") == "object" and "additionalProperties" not in node:
            found.append(path)
        for k, v in node.items():
            found += open_objects(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            found += open_objects(v, f"{path}[{i}]")
    return found


def closed_everywhere(schema):
    """Every object with properties is closed (additionalProperties false);
    the open ones are maps of a typed value or Kubernetes types passed through
    to the API server, each saying so in its description."""
    missing = open_objects(schema)
    assert not missing, f"schema objects without additionalProperties: {missing}"

    def walk(node, path):
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node and path != "$.properties.global":
                assert node["additionalProperties"] is False, f"{path}: takes unknown keys"
            if node.get("additionalProperties") is True and path != "$.properties.global":
                assert "Kubernetes" in node.get("description", ""), \
                    f"{path}: open object that is not a Kubernetes pass-through"
            for k, v in node.items():
                walk(v, f"{path}.{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")
    walk(schema, "$")


BAD_VALUES = {
    "replicas=-1": "/replicas",
    "worker.backend=tpu": "/worker/backend",
    "kvstore.durability=never": "/kvstore/durability",
    "scheduler.maxNumSeqss=4": "maxNumSeqss",
    "worker.gpus=2": "/worker/gpus",
    "frontend.toolCallParser=granite": "/frontend/toolCallParser",
}


def check_schema(helm, chart):
    import json
    with open(os.path.join(chart, "values.schema.json")) as f:
        schema = json.load(f)
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#", schema["$schema"]
    closed_everywhere(schema)
    for bad, where in BAD_VALUES.items():
        out = helm_template(helm, chart, sets=[bad])
        assert out.returncode != 0 and "don't meet the specifications of the schema" in out.stderr \
            and where in out.stderr, f"--set {bad}: expected a schema error at {where}: " \
            f"rc={out.returncode} {out.stderr.strip()}"
    # The description of worker.gpus says why.
    gpus = schema["properties"]["worker"]["properties"]["gpus"]
    assert gpus["maximum"] == 1 and "tensor parallelism" in gpus["description"], gpus
    print(f"values.schema.json: draft-07, closed objects; {len(BAD_VALUES)} bad values fail "
          f"with schema errors ({', '.join(BAD_VALUES)})")


# 4 and 5. ------------------------------------------------------------------
def check_flags_and_probes(build_dir, objs, label):
    known = {name: flags_of(build_dir, path) for name, path in BINARIES.items()}
    pods = {}
    for _, spec in pod_specs(objs):
        pods.update({c["name"]: c for c in spec["containers"]})
    assert {"kvstore", "scheduler", "worker"} <= set(pods) <= set(BINARIES), sorted(pods)
    for name, c in pods.items():
        assert c["command"] == [os.path.basename(BINARIES[name])], c["command"]
        for a in c["args"]:
            flag = a.split("=", 1)[0].lstrip("-")
            assert flag in known[name], \
                f"{label}: {name}: the chart passes --{flag}, which --help does not list"
        listen_port = int(arg(c, "listen").rsplit(":", 1)[1])
        assert arg(c, "listen") == f"0.0.0.0:{listen_port}", name
        assert listen_port in [p["containerPort"] for p in c["ports"]], name
        if name == "frontend":  # HTTP: /metrics and the probes on its one port
            port_name = {p["containerPort"]: p["name"] for p in c["ports"]}[listen_port]
            for probe, path in FRONTEND_PROBES.items():
                get = c[probe]["httpGet"]
                assert get["path"] == path and get["port"] in (listen_port, port_name), \
                    f"{label}: frontend {probe} is {get}, want GET {path} on {listen_port}"
            continue
        assert arg(c, "metrics-listen").startswith("0.0.0.0:"), name
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert probe in c, f"{label}: {name} has no {probe}"
            port, service = probe_target(build_dir, c, c[probe], f"{label}: {name} {probe}")
            assert port == listen_port, (name, probe, c[probe])
            want = READINESS[name] if probe == "readinessProbe" else LIVENESS
            assert service == want, f"{label}: {name} {probe} on {service}, want {want}"
    return pods


def probe_target(build_dir, c, handler, what):
    """(port, health name) of a probe: the kubelet's gRPC probe, or under TLS
    `tandem health` with the container's own --tls-* files."""
    if "grpc" in handler:
        return handler["grpc"]["port"], handler["grpc"].get("service")
    cmd = handler["exec"]["command"]
    assert cmd[:2] == ["tandem", "health"], f"{what}: {cmd}"
    known = flags_of(build_dir, "tools/cli/tandem", "health")
    opts = dict(a[2:].split("=", 1) for a in cmd[2:])
    assert set(opts) <= known, f"{what}: `tandem health --help` lacks {set(opts) - known}"
    for f in ("tls-cert", "tls-key", "tls-ca"):
        assert opts[f] == arg(c, f), f"{what}: --{f}={opts[f]} but the container has {arg(c, f)}"
    host, port = opts["server"].rsplit(":", 1)
    assert host == "127.0.0.1", f"{what}: {opts['server']}"
    return int(port), opts.get("service", "")


# 6. ------------------------------------------------------------------------
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
                "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
                "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"}


def pod_security_restricted(owner, spec):
    """The Pod Security Standards' baseline and restricted rules
    (kubernetes.io/docs/concepts/security/pod-security-standards), as a list
    of violations."""
    bad = []
    psc = spec.get("securityContext") or {}
    # baseline
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(host):
            bad.append(f"{host}: true")
    for vol in spec.get("volumes", []):
        kinds = set(vol) - {"name"}
        if "hostPath" in kinds:
            bad.append(f"volume {vol['name']}: hostPath")
        if not kinds <= RESTRICTED_VOLUMES:
            bad.append(f"volume {vol['name']}: {sorted(kinds - RESTRICTED_VOLUMES)} not allowed")
    for s in psc.get("sysctls", []):
        if s["name"] not in SAFE_SYSCTLS:
            bad.append(f"sysctl {s['name']}")
    if (psc.get("windowsOptions") or {}).get("hostProcess"):
        bad.append("pod hostProcess")
    pod_non_root = psc.get("runAsNonRoot") is True
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type")
    if psc.get("runAsUser") == 0:
        bad.append("pod runAsUser 0")
    if pod_seccomp not in (None, "RuntimeDefault", "Localhost"):
        bad.append(f"pod seccomp {pod_seccomp}")
    if (psc.get("appArmorProfile") or {}).get("type") == "Unconfined":
        bad.append("pod AppArmor Unconfined")
    if (psc.get("seLinuxOptions") or {}).get("type") not in (
            None, "", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"):
        bad.append("pod SELinux type")
    for c in all_containers(spec):
        sc = c.get("securityContext") or {}
        n = c["name"]
        if sc.get("privileged"):
            bad.append(f"{n}: privileged")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            bad.append(f"{n}: hostPort")
        if sc.get("procMount", "Default") != "Default":
            bad.append(f"{n}: procMount")
        if (sc.get("appArmorProfile") or {}).get("type") == "Unconfined":
            bad.append(f"{n}: AppArmor Unconfined")
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            bad.append(f"{n}: hostProcess")
        # restricted
        if sc.get("allowPrivilegeEscalation") is not False:
            bad.append(f"{n}: allowPrivilegeEscalation is not false")
        if sc.get("runAsNonRoot") is False or (not pod_non_root and sc.get("runAsNonRoot") is not True):
            bad.append(f"{n}: runAsNonRoot not set")
        if sc.get("runAsUser") == 0:
            bad.append(f"{n}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or {}).get("type") or pod_seccomp
        if seccomp not in ("RuntimeDefault", "Localhost"):
            bad.append(f"{n}: seccomp profile {seccomp}")
        caps = sc.get("capabilities") or {}
        if "ALL" not in caps.get("drop", []):
            bad.append(f"{n}: capabilities do not drop ALL")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            bad.append(f"{n}: adds capabilities {caps['add']}")
    return [f"{owner}: {b}" for b in bad]


def dockerfile_user(source_dir):
    with open(os.path.join(source_dir, "deploy", "docker", "Dockerfile")) as f:
        users = re.findall(r"^USER\s+(\d+):(\d+)\s*$", f.read(), re.M)
    assert len(users) == 1, f"the Dockerfile should set one numeric USER uid:gid, found {users}"
    return int(users[0][0]), int(users[0][1])


def check_security(source_dir, objs, label):
    violations = [v for owner, spec in pod_specs(objs) for v in pod_security_restricted(owner, spec)]
    assert not violations, f"{label}: Pod Security restricted: {violations}"
    uid, gid = dockerfile_user(source_dir)
    for owner, spec in pod_specs(objs):
        psc = spec["securityContext"]
        assert (psc["runAsUser"], psc["runAsGroup"], psc["fsGroup"]) == (uid, gid, gid), \
            f"{owner}: runs as {psc}, the image's user is {uid}:{gid}"
        assert psc["fsGroupChangePolicy"] == "OnRootMismatch", owner
        tmp = [v for v in spec["volumes"] if v["name"] == "tmp"]
        assert tmp and "emptyDir" in tmp[0], f"{owner}: no /tmp emptyDir"
        for c in spec["containers"]:
            assert c["securityContext"]["readOnlyRootFilesystem"] is True, (owner, c["name"])
            mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
            assert mounts.get("/tmp") == "tmp", f"{owner}/{c['name']}: /tmp not on the emptyDir"
    print(f"{label}: Pod Security restricted holds for {len(pod_specs(objs))} pod templates; "
          f"they run as the image's user {uid}:{gid} (fsGroup {gid}, OnRootMismatch), read-only "
          "root with /tmp on an emptyDir")


# 7. ------------------------------------------------------------------------
def check_defaults(build_dir, source_dir, objs):
    kinds = sorted(o["kind"] for o in objs)
    # The replicas, the KV-store, and the frontend (the OpenAI API) with its
    # Service and the replicas' headless one.
    assert kinds == ["ConfigMap", "Deployment", "Deployment", "PodDisruptionBudget", "Service",
                     "Service", "Service", "Service", "StatefulSet"], kinds
    pods = check_flags_and_probes(build_dir, objs, "defaults")
    named = by_kind_name(objs)
    sts, dep = one(objs, "StatefulSet"), replica(objs)
    w, s, kv = pods["worker"], pods["scheduler"], pods["kvstore"]
    res = w["resources"]
    assert arg(w, "backend") == "cuda", "the default image is the CUDA one (deploy/README.md)"
    assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"] == 1, res
    # A GPU replica must not surge onto a second GPU.
    strategy = dep["spec"]["strategy"]
    assert strategy["type"] == "Recreate" or strategy["rollingUpdate"]["maxSurge"] == 0, strategy
    assert arg(s, "worker") == f"127.0.0.1:{arg(w, 'listen').split(':')[1]}"
    kv_svc = named[("Service", f"{RELEASE}-kvstore")]
    kv_addr = f"{RELEASE}-kvstore:{kv_svc['spec']['ports'][0]['port']}"
    assert arg(s, "kvstore") == kv_addr and arg(w, "kvstore") == kv_addr, (kv_addr, s, w)
    bulk = {p["name"]: p for p in kv_svc["spec"]["ports"]}["bulk"]
    bulk_listen = int(arg(kv, "bulk-load-listen").split(":")[1])
    assert bulk["port"] == bulk_listen, "the Service must expose the bulk port under its own number"
    claim = sts["spec"]["volumeClaimTemplates"][0]
    mount = {m["name"]: m["mountPath"] for m in kv["volumeMounts"]}
    assert mount[claim["metadata"]["name"]] == arg(kv, "data-dir"), "data dir not on the volume"
    assert claim["spec"]["resources"]["requests"]["storage"] == "200Gi"
    grace = dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > int(arg(s, "drain-timeout-s")), "pods killed before the scheduler drains"
    model = {m["name"]: m["mountPath"] for m in w["volumeMounts"]}["model"]
    assert arg(w, "model").startswith(model + "/"), (model, arg(w, "model"))
    assert arg(s, "served-model-name") == os.path.basename(arg(w, "model")), \
        "model_name should default to the model's base name"
    pdb = one(objs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"], pdb
    dash = one(objs, "ConfigMap")
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert all(v.lstrip().startswith("{") for v in dash["data"].values())
    print("defaults: StatefulSet + volume, one Deployment (scheduler + worker) that does not "
          "surge, flags all known to the binaries, GPU requests = limits, probes on "
          "tandem.liveness and the services' names, a PodDisruptionBudget")


# 8. ------------------------------------------------------------------------
def promql_parses(promtool, exprs):
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump({"groups": [{"name": "q", "rules": [
            {"record": f"q:{i}", "expr": e} for i, e in enumerate(exprs)]}]}, f)
        f.flush()
        r = subprocess.run([promtool, "check", "rules", f.name], capture_output=True, text=True)
    assert r.returncode == 0, f"{exprs}: {r.stdout}{r.stderr}"


def check_other_values(build_dir, helm, chart):
    promtool = find_promtool()
    cpu = objects(render_text(helm, chart, sets=["worker.backend=cpu", "worker.gpus=0"]))
    wc = containers(replica(cpu))["worker"]
    assert "nvidia.com/gpu" not in str(wc["resources"]) and arg(wc, "backend") == "cpu"
    nokv = objects(render_text(helm, chart, sets=["kvstore.enabled=false",
                                                  "networkPolicy.enabled=true"]))
    assert "StatefulSet" not in [o["kind"] for o in nokv]
    assert "--kvstore" not in str(containers(replica(nokv))), "refers to a store"
    assert [o["metadata"]["name"] for o in nokv if o["kind"] == "NetworkPolicy"] == [RELEASE]
    mon = objects(render_text(helm, chart, sets=["serviceMonitor.enabled=true",
                                                 "prometheusRule.enabled=true"]))
    sm, pr = one(mon, "ServiceMonitor"), one(mon, "PrometheusRule")
    port_names = {p["name"] for o in mon if o["kind"] == "Service" for p in o["spec"]["ports"]}
    for ep in sm["spec"]["endpoints"]:
        assert ep["port"] in port_names, (ep, port_names)
    # With the frontend on, its /metrics (on the API port) is scraped too,
    # over https when it serves https.
    fe_mon = objects(render_text(helm, chart, sets=[
        "serviceMonitor.enabled=true", "frontend.enabled=true",
        "frontend.https.existingSecret=fe-https",
        "serviceMonitor.frontendTlsConfig.serverName=tandem-frontend"]))
    fe_ports = {p["name"] for o in fe_mon if o["kind"] == "Service"
                and o["metadata"]["name"].endswith("-frontend") for p in o["spec"]["ports"]}
    fe_eps = [ep for ep in one(fe_mon, "ServiceMonitor")["spec"]["endpoints"]
              if ep["port"] in fe_ports]
    assert len(fe_eps) == 1 and fe_eps[0]["path"] == "/metrics", fe_eps
    assert fe_eps[0]["scheme"] == "https", fe_eps
    assert fe_eps[0]["tlsConfig"] == {"serverName": "tandem-frontend"}, fe_eps
    no_fe = objects(render_text(helm, chart, sets=["serviceMonitor.enabled=true",
                                                   "frontend.enabled=false"]))
    assert not [ep for ep in one(no_fe, "ServiceMonitor")["spec"]["endpoints"]
                if ep["port"] == "http"], "a frontend endpoint without the frontend"
    with open(os.path.join(chart, "files", "rules.yaml")) as f:
        assert pr["spec"] == yaml.safe_load(f), "the PrometheusRule differs from files/rules.yaml"

    # Autoscaling on queue depth; the Deployment then leaves replicas to it.
    keda = objects(render_text(helm, chart, sets=["autoscaling.keda.enabled=true"]))
    so = one(keda, "ScaledObject")
    trig = so["spec"]["triggers"][0]
    assert trig["type"] == "prometheus" and so["spec"]["scaleTargetRef"]["name"] == RELEASE
    query = trig["metadata"]["query"]
    assert query.startswith("sum(tandem_scheduler_num_requests_waiting{"), query
    assert f'namespace="{NAMESPACE}"' in query, query
    assert isinstance(trig["metadata"]["threshold"], str), "KEDA takes the threshold as a string"
    promql_parses(promtool, [query])
    assert "replicas" not in replica(keda)["spec"], "helm upgrade would reset replicas"
    hpa = one(objects(render_text(helm, chart, sets=["autoscaling.hpa.enabled=true"])),
              "HorizontalPodAutoscaler")
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == \
        "tandem_scheduler_num_requests_waiting", hpa
    both = helm_template(helm, chart, sets=["autoscaling.hpa.enabled=true",
                                            "autoscaling.keda.enabled=true"])
    assert both.returncode != 0 and "not both" in both.stderr, both.stderr

    # All options on: NetworkPolicies say who reaches what.
    objs = objects(render_text(helm, chart, [ALL_ON]))
    check_flags_and_probes(build_dir, objs, "all-on")
    with open(ALL_ON) as f:
        values = yaml.safe_load(f)
    pols = {o["metadata"]["name"]: o["spec"] for o in objs if o["kind"] == "NetworkPolicy"}
    kv_pol, rep_pol = pols[f"{RELEASE}-kvstore"], pols[RELEASE]
    kv_ports = {values["kvstore"].get("port", 50070), values["kvstore"].get("bulkPort", 50071)}

    def rules_for(pol, port):
        return [r for r in pol["ingress"] if port in [p["port"] for p in r["ports"]]]

    for port in kv_ports:
        (rule,) = rules_for(kv_pol, port)
        assert rule["from"] == [{"podSelector": {"matchLabels": {
            "app.kubernetes.io/name": "tandem", "app.kubernetes.io/instance": RELEASE,
            "app.kubernetes.io/component": "replica"}}}], rule
    (rule,) = rules_for(rep_pol, 50051)
    frontend = {"podSelector": {"matchLabels": {
        "app.kubernetes.io/name": "tandem", "app.kubernetes.io/instance": RELEASE,
        "app.kubernetes.io/component": "frontend"}}}
    assert rule["from"] == [frontend] + values["networkPolicy"]["schedulerClients"], rule
    assert not rules_for(rep_pol, 50061), "the worker's port is reached over loopback only"
    for pol, port in ((rep_pol, 9091), (rep_pol, 9092), (kv_pol, 9093)):
        (rule,) = rules_for(pol, port)
        assert rule["from"] == values["networkPolicy"]["metricsFrom"], rule
    check_frontend(objs, values)
    check_frontend_model_dir(build_dir, helm, chart)
    dep = by_kind_name(objs)[("Deployment", RELEASE)]
    assert dep["spec"]["strategy"] == {"type": "Recreate"}, dep["spec"]["strategy"]
    spread = dep["spec"]["template"]["spec"]["topologySpreadConstraints"][0]
    assert spread["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "replica"
    print("values: cpu backend without GPUs, no KV-store, ServiceMonitor ports, PrometheusRule "
          "= files/rules.yaml, KEDA/HPA on queue depth (query parses), NetworkPolicies "
          "(store from replicas only, schedulers from the frontend, metrics from monitoring)")


def check_frontend(objs, values):
    """frontend.enabled: a Deployment on 8000 behind a Service, a headless
    Service listing the replicas that the frontend resolves (dns:///), the
    API key from the Secret, and a CPU HPA."""
    fe = values["frontend"]
    named = by_kind_name(objs)
    svc = named[("Service", f"{RELEASE}-frontend")]
    assert svc["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http"}], svc
    assert svc["spec"]["selector"]["app.kubernetes.io/component"] == "frontend"
    headless = named[("Service", f"{RELEASE}-replicas")]
    assert headless["spec"]["clusterIP"] == "None", headless
    assert headless["spec"]["selector"]["app.kubernetes.io/component"] == "replica"
    port = headless["spec"]["ports"][0]["port"]
    dep = named[("Deployment", f"{RELEASE}-frontend")]
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert arg(c, "scheduler") == \
        f"dns:///{RELEASE}-replicas.{NAMESPACE}.svc.cluster.local:{port}", arg(c, "scheduler")
    key = fe["apiKey"]
    assert arg(c, "api-key-file") == f"/etc/tandem/api-key/{key['key']}", c["args"]
    vols = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    assert vols["api-key"]["secret"]["secretName"] == key["existingSecret"], vols
    assert c["resources"]["requests"]["cpu"], "an HPA on CPU needs CPU requests"
    hpa = named[("HorizontalPodAutoscaler", f"{RELEASE}-frontend")]
    assert hpa["spec"]["scaleTargetRef"]["name"] == f"{RELEASE}-frontend", hpa
    assert hpa["spec"]["maxReplicas"] == fe["autoscaling"]["maxReplicas"], hpa
    assert "replicas" not in dep["spec"], "the HPA owns the frontend's replica count"
    print("frontend: Deployment + Service on 8000, headless Service for the replicas "
          "(dns:/// target), API key from its Secret, CPU HPA")


def check_frontend_model_dir(build_dir, helm, chart):
    """frontend.tokenizerPath "": the frontend gets --model=<model.path> (a
    Hugging Face directory: its tokenizer and chat template, as `vllm serve
    DIR`) and no --tokenizer; set, --tokenizer as before."""
    hf = "/models/Llama-3.2-1B-Instruct"
    objs = objects(render_text(helm, chart, sets=["frontend.enabled=true",
                                                  "frontend.tokenizerPath=", f"model.path={hf}"]))
    fe = check_flags_and_probes(build_dir, objs, "model-dir")["frontend"]
    assert arg(fe, "model") == hf and arg(fe, "tokenizer") is None, fe["args"]
    worker = containers(by_kind_name(objs)[("Deployment", RELEASE)])["worker"]
    assert arg(worker, "model") == hf, worker["args"]
    named = objects(render_text(helm, chart, sets=["frontend.enabled=true"]))
    fe = containers(by_kind_name(named)[("Deployment", f"{RELEASE}-frontend")])["frontend"]
    assert arg(fe, "tokenizer") == "/models/tokenizer.model" and arg(fe, "model") is None, \
        fe["args"]
    print("frontend: tokenizerPath \"\" passes --model=<model.path> (the directory's tokenizer "
          "and chat template), else --tokenizer")


def check_serves_openai(build_dir, helm, chart):
    """The defaults serve the OpenAI API (the frontend and its Service, the
    NOTES' curl); frontend.ingress routes to its Service's http port;
    model.download fills an emptyDir in every pod from the Hub with the
    token from its Secret (the frontend's pods only the tokenizer files), and
    refuses a missing repo or a path outside mountPath."""
    defaults = objects(render_text(helm, chart))
    named = by_kind_name(defaults)
    assert ("Deployment", f"{RELEASE}-frontend") in named and \
        ("Service", f"{RELEASE}-frontend") in named, "the default install serves no OpenAI API"
    assert not [o for o in defaults if o["kind"] == "Ingress"], "an Ingress nobody asked for"
    notes = subprocess.run([helm, "install", RELEASE, chart, "--dry-run", "--namespace",
                            NAMESPACE], capture_output=True, text=True)
    assert notes.returncode == 0, notes.stderr
    assert "/v1/completions" in notes.stdout and "curl" in notes.stdout, notes.stdout[-2000:]

    ing = one(objects(render_text(helm, chart, [ALL_ON])), "Ingress")
    assert ing["spec"]["ingressClassName"] == "nginx"
    assert ing["spec"]["tls"] == [{"hosts": ["llm.example.com"], "secretName": "llm-tls"}]
    (rule,) = ing["spec"]["rules"]
    assert rule["host"] == "llm.example.com"
    (path,) = rule["http"]["paths"]
    assert path["path"] == "/v1" and path["pathType"] == "Prefix"
    assert path["backend"]["service"] == {"name": f"{RELEASE}-frontend", "port": {"name": "http"}}

    hf = "/models/Qwen2.5-0.5B-Instruct"
    sets = ["model.download.enabled=true", "model.download.repo=Qwen/Qwen2.5-0.5B-Instruct",
            f"model.path={hf}", "model.download.tokenSecret.name=hf-token",
            "model.download.sizeLimit=20Gi"]
    objs = objects(render_text(helm, chart, sets=sets))
    check_flags_and_probes(build_dir, objs, "download")
    named = by_kind_name(objs)
    for dep_name, only_tokenizer in ((RELEASE, False), (f"{RELEASE}-frontend", True)):
        spec = named[("Deployment", dep_name)]["spec"]["template"]["spec"]
        (init,) = spec["initContainers"]
        env = {e["name"]: e for e in init["env"]}
        assert env["HF_REPO"]["value"] == "Qwen/Qwen2.5-0.5B-Instruct" and \
            env["MODEL_PATH"]["value"] == hf, env
        assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf-token", "key": "token"}
        assert bool(env["HF_ALLOW_PATTERNS"]["value"]) == only_tokenizer, (dep_name, env)
        assert "snapshot_download" in init["args"][0]
        vols = {v["name"]: v for v in spec["volumes"]}
        assert vols["model"] == {"name": "model", "emptyDir": {"sizeLimit": "20Gi"}}, vols
        mounts = {m["name"]: m for m in init["volumeMounts"]}
        assert mounts["model"]["mountPath"] == "/models" and not mounts["model"].get("readOnly")
        bad = pod_security_restricted(dep_name + "/download", spec)
        assert not bad, bad
    fe = containers(named[("Deployment", f"{RELEASE}-frontend")])["frontend"]
    assert arg(fe, "model") == hf and arg(fe, "tokenizer") is None, fe["args"]
    for bad, message in ((["model.download.enabled=true"], "needs model.download.repo"),
                         (["model.download.enabled=true", "model.download.repo=a/b",
                           "model.path=/elsewhere/m"], "must lie under model.mountPath")):
        r = subprocess.run([helm, "template", RELEASE, chart, *sum((["--set", s] for s in bad), [])],
                           capture_output=True, text=True)
        assert r.returncode != 0 and message in r.stderr, (bad, r.stderr)
    print("serves OpenAI by default (frontend, Service, NOTES curl); Ingress to the frontend's "
          "http port; model.download: an init container per pod fills an emptyDir from the Hub "
          "(token from its Secret; the frontend fetches only tokenizer files)")


def check_tls(build_dir, source_dir, helm, chart):
    """tls.enabled: every part gets --tls-* from its own Secret, the probes
    run `tandem health`, the KV-store's bulk port stays open (it speaks TLS), and
    cert-manager's Certificates give each part its role's URI SAN and the
    names the others dial it by."""
    sets = ["tls.enabled=true", "tls.source=certManager", "tls.certManager.issuerRef.name=ca",
            "kvstore.enabled=true", "frontend.enabled=true", "networkPolicy.enabled=true"]
    objs = objects(render_text(helm, chart, sets=sets))
    pods = check_flags_and_probes(build_dir, objs, "tls")
    check_security(source_dir, objs, "tls")
    certs = {o["metadata"]["labels"]["app.kubernetes.io/component"]: o["spec"]
             for o in objs if o["kind"] == "Certificate"}
    assert set(certs) == {"kvstore", "scheduler", "worker", "frontend"}, sorted(certs)
    volumes = {}
    for _, spec in pod_specs(objs):
        volumes.update({v["name"]: v for v in spec.get("volumes", [])})
    for name, c in pods.items():
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert arg(c, "tls-cert") == "/etc/tandem/tls/tls.crt" and arg(c, "tls-ca"), c["args"]
        assert arg(c, "tls-trust-domain") == "cluster.local", c["args"]
        secret = volumes[mounts["/etc/tandem/tls"]]["secret"]["secretName"]
        assert secret == certs[name]["secretName"], (name, secret)
        assert certs[name]["uris"] == [f"spiffe://cluster.local/tandem/{name}"], certs[name]
        assert "127.0.0.1" in certs[name]["ipAddresses"], certs[name]
    kv_host = arg(pods["scheduler"], "kvstore").rsplit(":", 1)[0]
    assert kv_host == arg(pods["worker"], "kvstore").rsplit(":", 1)[0]
    assert kv_host in certs["kvstore"]["dnsNames"], (kv_host, certs["kvstore"])
    sched_host = arg(pods["frontend"], "scheduler").removeprefix("dns:///").rsplit(":", 1)[0]
    assert sched_host in certs["scheduler"]["dnsNames"], (sched_host, certs["scheduler"])
    # The bulk port speaks TLS with the store's certificate: open, as without TLS.
    assert arg(pods["kvstore"], "bulk-load-listen") == "0.0.0.0:50071"
    assert "bulk" in [p["name"] for p in pods["kvstore"]["ports"]]
    kv_svc = by_kind_name(objs)[("Service", f"{RELEASE}-kvstore")]
    assert "bulk" in [p["name"] for p in kv_svc["spec"]["ports"]], kv_svc
    # Secrets you make: no Certificate, the names given.
    mine = objects(render_text(helm, chart, sets=["tls.enabled=true", "tls.secrets.worker=w-tls"]))
    assert "Certificate" not in [o["kind"] for o in mine]
    vols = {v["name"]: v for _, s in pod_specs(mine) for v in s.get("volumes", [])}
    assert vols["tls-worker"]["secret"]["secretName"] == "w-tls", vols["tls-worker"]
    assert vols["tls-scheduler"]["secret"]["secretName"] == f"{RELEASE}-scheduler-tls"
    # HTTPS on the frontend's own port, from its Secret; the probes speak it.
    web = objects(render_text(helm, chart, sets=["frontend.enabled=true",
                                                  "frontend.https.existingSecret=web-tls"]))
    fe_pods = check_flags_and_probes(build_dir, web, "https")
    fe = fe_pods["frontend"]
    assert arg(fe, "https-cert") == "/etc/tandem/https/tls.crt", fe["args"]
    assert arg(fe, "https-key") == "/etc/tandem/https/tls.key", fe["args"]
    assert {fe[p]["httpGet"].get("scheme") for p in FRONTEND_PROBES} == {"HTTPS"}, fe
    web_vols = {v["name"]: v for _, s in pod_specs(web) for v in s.get("volumes", [])}
    assert web_vols["https"]["secret"]["secretName"] == "web-tls", web_vols
    bad = helm_template(helm, chart, sets=["tls.enabled=true", "tls.source=certManager"])
    assert bad.returncode != 0 and "issuerRef.name" in bad.stderr, bad.stderr
    print("tls: --tls-* from each part's own Secret, `tandem health` probes, bulk port open (it speaks TLS), "
          "Certificates with the role URI SAN and the names the parts dial; the frontend's "
          "HTTPS from its Secret with HTTPS probes")


# 9. ------------------------------------------------------------------------
def socket_mounts(obj, container):
    c = containers(obj)[container]
    return [m["mountPath"] for m in c.get("volumeMounts", []) if m["name"] == "kvstore-socket"]


def host_paths(objs):
    return {(owner, v["name"]): v["hostPath"]
            for owner, spec in pod_specs(objs) for v in spec.get("volumes", []) if "hostPath" in v}


def check_local_socket(build_dir, helm, chart):
    defaults = objects(render_text(helm, chart))
    assert not host_paths(defaults), host_paths(defaults)
    assert arg(containers(one(defaults, "StatefulSet"))["kvstore"], "local-socket") is None
    objs = objects(render_text(helm, chart, sets=["kvstore.localSocket.enabled=true",
                                                  "kvstore.localSocket.hostPath=/run/llm/"]))
    check_flags_and_probes(build_dir, objs, "local socket")
    store, rep = one(objs, "StatefulSet"), replica(objs)
    sock = arg(containers(store)["kvstore"], "local-socket")
    assert sock == f"/run/llm/{RELEASE}-kvstore.sock", sock
    # The worker learns the path from the store (Stats): it must be the same
    # file at the same path in its container.
    assert socket_mounts(store, "kvstore") == ["/run/llm"], containers(store)["kvstore"]
    assert socket_mounts(rep, "worker") == ["/run/llm"], containers(rep)["worker"]
    assert socket_mounts(rep, "scheduler") == [], "the scheduler loads nothing"
    want = {"path": "/run/llm", "type": "DirectoryOrCreate"}
    assert host_paths(objs) == {(f"StatefulSet/{RELEASE}-kvstore", "kvstore-socket"): want,
                                (f"Deployment/{RELEASE}", "kvstore-socket"): want}, host_paths(objs)
    (init,) = store["spec"]["template"]["spec"]["initContainers"]
    pod_sc = store["spec"]["template"]["spec"]["securityContext"]
    assert init["command"] == ["chown", f"{pod_sc['runAsUser']}:{pod_sc['runAsGroup']}",
                               "/run/llm"], init["command"]
    sc = init["securityContext"]
    assert sc["runAsUser"] == 0 and sc["allowPrivilegeEscalation"] is False, sc
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}, sc
    assert [m["mountPath"] for m in init["volumeMounts"]] == ["/run/llm"], init
    # Without a store there is nothing to mount.
    nokv = objects(render_text(helm, chart, sets=["kvstore.enabled=false",
                                                  "kvstore.localSocket.enabled=true"]))
    assert not host_paths(nokv), host_paths(nokv)
    bad = helm_template(helm, chart, sets=["kvstore.localSocket.hostPath=run/llm"])
    assert bad.returncode != 0 and "hostPath" in bad.stderr, bad.stderr
    print("local socket: off by default; on, bound in the node's directory that the store "
          "and the workers mount at one path, given to the pods' user by a chown alone")


def main():
    build_dir, source_dir = sys.argv[1], sys.argv[2]
    chart = chart_dir(source_dir)
    helm = find_helm(source_dir)
    check_lint(helm, chart)
    check_golden(helm, chart)
    check_schema(helm, chart)
    defaults = objects(render_text(helm, chart))
    check_defaults(build_dir, source_dir, defaults)
    check_security(source_dir, defaults, "defaults")
    check_security(source_dir, objects(render_text(helm, chart, [ALL_ON])), "all-on")
    check_other_values(build_dir, helm, chart)
    check_serves_openai(build_dir, helm, chart)
    check_tls(build_dir, source_dir, helm, chart)
    check_local_socket(build_dir, helm, chart)
    print("helm_test: OK")


if __name__ == "__main__":
    main()
