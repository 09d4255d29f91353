#!/usr/bin/python3
"""The Helm chart (deploy/helm/tandem), checked with the real helm and promtool.

  1. `helm lint --strict` passes.
  2. `helm template` with the defaults renders the KV-store as a StatefulSet
     with a volume, the scheduler+worker replica as one Deployment, and
     their Services; every flag the chart passes is one the built binary's
     --help lists; the worker's GPU requests equal its limits; every
     container has gRPC probes on the health service names the binaries
     set; the scheduler reaches its worker on the pod's loopback and both
     reach the KV-store through its Service, whose bulk port keeps its
     number (clients use the advertised one).
  3. Other values: the cpu backend asks for no GPU; without the KV-store
     nothing refers to it; the ServiceMonitor scrapes ports the Services
     name; the PrometheusRule carries files/rules.yaml, which promtool
     accepts.

Usage: helm_test.py BUILD_DIR SOURCE_DIR
"""
import os
import re
import shutil
import subprocess
import sys

import yaml


def find_helm(source_dir):
    local = os.path.join(source_dir, ".cache", "tools", "helm")
    helm = local if os.access(local, os.X_OK) else shutil.which("helm")
    assert helm, "helm not found: run tools/install-deps.sh (it puts helm in .cache/tools)"
    return helm


def render(helm, chart, *sets):
    args = [helm, "template", "t", chart]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True)
    assert out.returncode == 0, f"helm template {sets}: {out.stderr}"
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def one(objs, kind):
    found = [o for (k, _), o in objs.items() if k == kind]
    assert len(found) == 1, f"{len(found)} {kind} objects"
    return found[0]


def containers(obj):
    return {c["name"]: c for c in obj["spec"]["template"]["spec"]["containers"]}


def flags_of(build_dir, binary):
    out = subprocess.run([os.path.join(build_dir, binary), "--help"], capture_output=True,
                         text=True)
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


def main():
    build_dir, source_dir = sys.argv[1], sys.argv[2]
    chart = os.path.join(source_dir, "deploy", "helm", "tandem")
    helm = find_helm(source_dir)

    # 1. Lint.
    lint = subprocess.run([helm, "lint", "--strict", chart], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    print("helm lint --strict: clean")

    # 2. Defaults.
    objs = render(helm, chart)
    kinds = sorted(k for k, _ in objs)
    assert kinds == ["ConfigMap", "Deployment", "Service", "Service", "StatefulSet"], kinds
    sts, dep = one(objs, "StatefulSet"), one(objs, "Deployment")
    binaries = {"kvstore": "services/kvstore/tandem-kvstore",
                "scheduler": "services/scheduler/tandem-scheduler",
                "worker": "services/worker/tandem-worker"}
    pods = {**containers(sts), **containers(dep)}
    assert sorted(pods) == ["kvstore", "scheduler", "worker"], sorted(pods)
    health = {"kvstore": "tandem.v1.KvStore", "scheduler": "tandem.v1.Generation",
              "worker": "tandem.v1.Worker"}
    for name, c in pods.items():
        assert c["command"] == [os.path.basename(binaries[name])], c["command"]
        known = flags_of(build_dir, binaries[name])
        for a in c["args"]:
            flag = a.split("=", 1)[0].lstrip("-")
            assert flag in known, f"{name}: the chart passes --{flag}, which --help does not list"
        ready = c["readinessProbe"]["grpc"]
        assert ready["service"] == health[name], (name, ready)
        assert "grpc" in c["livenessProbe"], name
        assert arg(c, "metrics-listen").startswith("0.0.0.0:"), name
        # A probe's port is one the container listens on.
        assert ready["port"] in [p["containerPort"] for p in c["ports"]], name
        assert arg(c, "listen") == f"0.0.0.0:{ready['port']}", name
    w, s, kv = pods["worker"], pods["scheduler"], pods["kvstore"]
    res = w["resources"]
    assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"] == 1, res
    assert "startupProbe" in w, "the worker loads weights before it is SERVING"
    assert arg(s, "worker") == f"127.0.0.1:{arg(w, 'listen').split(':')[1]}"
    kv_svc = objs[("Service", "t-tandem-kvstore")]
    kv_addr = f"t-tandem-kvstore:{kv_svc['spec']['ports'][0]['port']}"
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
    dash = one(objs, "ConfigMap")
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert all(v.lstrip().startswith("{") for v in dash["data"].values())
    print("defaults: StatefulSet + volume, one Deployment (scheduler + worker), flags all known "
          "to the binaries, GPU requests = limits, gRPC probes on the services' health names")

    # 3. Other values.
    cpu = render(helm, chart, "worker.backend=cpu", "worker.gpus=0")
    wc = containers(one(cpu, "Deployment"))["worker"]
    assert "nvidia.com/gpu" not in str(wc["resources"]) and arg(wc, "backend") == "cpu"
    nokv = render(helm, chart, "kvstore.enabled=false")
    assert "StatefulSet" not in [k for k, _ in nokv]
    assert "--kvstore" not in str(containers(one(nokv, "Deployment"))), "refers to a store"
    mon = render(helm, chart, "serviceMonitor.enabled=true", "prometheusRule.enabled=true")
    sm, pr = one(mon, "ServiceMonitor"), one(mon, "PrometheusRule")
    port_names = {p["name"] for (k, _), o in mon.items() if k == "Service"
                  for p in o["spec"]["ports"]}
    for ep in sm["spec"]["endpoints"]:
        assert ep["port"] in port_names, (ep, port_names)
    rules_file = os.path.join(chart, "files", "rules.yaml")
    with open(rules_file) as f:
        assert pr["spec"] == yaml.safe_load(f), "the PrometheusRule differs from files/rules.yaml"
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found (Debian package prometheus)"
    check = subprocess.run([promtool, "check", "rules", rules_file], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    print("values: cpu backend without GPUs, no KV-store, ServiceMonitor ports, PrometheusRule = "
          "files/rules.yaml; " + check.stdout.strip().splitlines()[-1].strip())
    print("helm_test: OK")


if __name__ == "__main__":
    main()
