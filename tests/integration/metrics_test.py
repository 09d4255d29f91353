#!/usr/bin/python3
"""Every service's /metrics, checked by Prometheus's own linter.

Starts tandem-kvstore, tandem-worker and tandem-scheduler (worker and
scheduler using the store), each with a /metrics port, runs two Generate
calls on one prompt (so the scheduler looks the prefix up in the store and
the worker stores its blocks), then for each service:
  1. scrapes /metrics and runs `promtool check metrics` on the text (DESIGN
     §7: names, types, units, help, clean under promtool),
  2. checks series that the calls must have moved: the scheduler's finished
     requests, and the store's lookups (over the bulk port's lookup
     connection) and stored blocks,
  3. checks that every tandem_* series the Prometheus rules and Grafana
     dashboards in deploy/ query is one the services export,
  4. checks the scheduler's admission/preemption series and that each of its
     series carries model_name (vLLM's label),
  5. scrapes with idle connections open and many scrapes at once (the
     endpoint serves concurrently), over IPv6 too where the host has it,
  6. checks the scheduler's vLLM series (vllm:*, issue 33) against the
     committed list taken from vLLM's own loggers (vllm_metrics.json): the
     same families, types, labels and buckets, and no other vllm:* family,
  7. runs the 12 panels' queries of vLLM's own Grafana dashboard
     (vllm_grafana_queries.json) under `promtool test rules` on two scrapes
     a minute apart with requests between them: every query must give a
     number (a panel with no data fails); a control run without one series
     must fail.

Usage: metrics_test.py BUILD_DIR SOURCE_DIR SHARED_DIR
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import grpc
from grpc_tools import protoc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from python_client_test import free_port, start  # noqa: E402


def scrape(port, host="127.0.0.1", timeout=10):
    return urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout).read().decode()


def has_ipv6():
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


SCHEDULER_SERIES = (
    "tandem_scheduler_num_requests_waiting_by_reason", "tandem_scheduler_requests_admitted_total",
    "tandem_scheduler_admission_blocked_steps_total", "tandem_scheduler_num_async_loads_in_flight",
    "tandem_scheduler_num_lookups_pending", "tandem_scheduler_kv_lookup_duration_seconds",
    "tandem_scheduler_preemptions_total", "tandem_scheduler_recomputed_tokens_total",
    "tandem_scheduler_num_steps_in_flight", "tandem_scheduler_schedule_duration_seconds",
    "tandem_scheduler_output_duration_seconds",
    "tandem_scheduler_inter_token_latency_seconds",
    "tandem_scheduler_time_per_output_token_seconds",
    "tandem_scheduler_time_to_first_token_seconds", "tandem_scheduler_request_latency_seconds")


def check_scheduler_series(text):
    families = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    missing = [n for n in SCHEDULER_SERIES if n not in families]
    assert not missing, f"scheduler does not export {missing}"
    samples = [l for l in text.splitlines() if l.startswith("tandem_scheduler_")]
    unlabelled = [l for l in samples if 'model_name="stories260K.bin"' not in l]
    assert samples and not unlabelled, f"series without model_name: {unlabelled[:5]}"
    for label in ('cause="kv_cache_full"', 'cause="step_failed"', 'cause="worker_lost"'):
        assert re.search(rf"^tandem_scheduler_preemptions_total{{[^}}]*{label}", text, re.M), label
    for label in ("max_num_seqs", "token_budget", "kv_blocks", "async_load_gate"):
        assert f'limit="{label}"' in text, label
    for reason in ("capacity", "lookup", "load"):
        assert f'reason="{reason}"' in text, reason
    # vLLM's buckets: a 120 s request is not read as 60 s.
    assert re.search(r'tandem_scheduler_request_latency_seconds_bucket{[^}]*le="7680"', text), \
        "E2E buckets end before 7680 s"
    assert re.search(r'tandem_scheduler_time_to_first_token_seconds_bucket{[^}]*le="2560"', text)
    assert (value(text, "tandem_scheduler_requests_admitted_total") or 0) >= 2
    assert (value(text, "tandem_scheduler_kv_lookup_duration_seconds_count") or 0) >= 1
    assert (value(text, "tandem_scheduler_inter_token_latency_seconds_count") or 0) >= 1
    assert (value(text, "tandem_scheduler_time_per_output_token_seconds_count") or 0) >= 2
    assert (value(text, "tandem_scheduler_schedule_duration_seconds_count") or 0) >= 1
    assert (value(text, "tandem_scheduler_output_duration_seconds_count") or 0) >= 1
    print(f"scheduler: {len(SCHEDULER_SERIES)} admission/latency families, all with model_name")


def check_worker_device_series(text):
    """The device's own clock (issue 31): its busy time lies within the
    steps' wall time, and it is not zero after steps that ran the model."""
    steps = value(text, "tandem_worker_steps_total")
    busy = value(text, "tandem_worker_device_busy_seconds_total")
    idle = value(text, "tandem_worker_device_idle_seconds_total")
    wall = value(text, "tandem_worker_step_duration_seconds_sum")
    assert steps and steps > 0, text
    assert busy is not None and 0 < busy <= wall, f"device busy {busy} s, steps' wall time {wall} s"
    assert idle is not None and idle > 0, f"device idle {idle} s between {steps:.0f} steps"
    print(f"worker: device busy {busy * 1e3:.1f} ms, idle between steps {idle * 1e3:.1f} ms, "
          f"{steps:.0f} steps taking {wall * 1e3:.1f} ms")


def check_worker_kv_series(port, stored_by_store, deadline):
    """The worker's side of the stores (issue 32): the blocks the store
    acknowledged, mirrored after each step (the engine sends empty steps
    while stores are in flight), none dropped, and the load series present
    (the calls hit the worker's own prefix cache; loads are
    connector_test's)."""
    text = ""
    while time.time() < deadline:
        text = scrape(port)
        if ((value(text, "tandem_worker_kvstore_blocks_stored_total") or 0) >= stored_by_store
                and value(text, "tandem_worker_kvstore_stores_in_flight") == 0):
            break
        time.sleep(0.1)
    stored = value(text, "tandem_worker_kvstore_blocks_stored_total")
    assert stored >= stored_by_store > 0, (stored, stored_by_store)
    assert value(text, "tandem_worker_kvstore_stores_in_flight") == 0, text
    assert value(text, "tandem_worker_kvstore_loads_in_flight") == 0, text
    assert value(text, 'tandem_worker_kvstore_staging_bytes{use="store"}') > 0, text
    assert value(text, 'tandem_worker_kvstore_store_failed_blocks_total{reason="dropped"}') == 0
    for series in ("tandem_worker_kvstore_blocks_loaded_total",
                   'tandem_worker_kvstore_load_seconds_count{phase="read"}',
                   'tandem_worker_kvstore_load_seconds_count{phase="copy"}',
                   'tandem_worker_kvstore_load_failed_blocks_total{reason="checksum"}'):
        assert value(text, series) is not None, (series, text)
    print(f"worker: {stored:.0f} blocks stored (the store wrote {stored_by_store:.0f})")


def check_concurrent_scrapes(port, hosts):
    """Idle connections do not hold scrapes up, and scrapes run at once."""
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
    try:
        start_time = time.time()
        scrape(port, timeout=4)  # one connection at a time would wait out each idle one
        took = time.time() - start_time
        errors = []

        def one(host):
            try:
                assert "tandem_scheduler_steps_total" in scrape(port, host, timeout=10)
            except Exception as e:  # noqa: BLE001
                errors.append(f"{host}: {e!r}")

        threads = [threading.Thread(target=one, args=(hosts[i % len(hosts)],)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
    finally:
        for c in idle:
            c.close()
    print(f"scheduler /metrics: scrape with 3 idle connections open took {took * 1000:.0f} ms; "
          f"16 concurrent scrapes over {hosts} fine")


def value(text, name):
    """The sum of a metric's series (labelled or not), or None."""
    found = re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    return sum(float(v) for v in found) if found else None


def promtool_check(name, text):
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found (Debian package prometheus; tools/install-deps.sh)"
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    # vLLM's own names break two of the linter's rules (its ':' and its
    # vllm:iteration_tokens_total histogram); clients read them by those
    # names, so those two findings, on vllm:* names only, are expected.
    problems = [l for l in (r.stdout + r.stderr).strip().splitlines()
                if not re.match(r"vllm:\S+ (metric names should not contain ':'|"
                                r'non-counter metrics should not have "_total" suffix)$', l)]
    expected_only = r.returncode in (0, 3) and not problems  # 3: lint findings only
    assert expected_only, f"{name}: promtool check metrics (rc {r.returncode}):\n" + "\n".join(problems)
    series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    vllm = len(set(re.findall(r"^# TYPE (vllm:\S+)", text, re.M)))
    print(f"{name}: {series} series, promtool check metrics clean"
          + (f" but for the names of vLLM's {vllm} families" if vllm else ""))


def check_deploy_names(source_dir, families):
    """Every tandem_* series the shipped rules and dashboards query is one a
    service exports (a histogram's _bucket/_sum/_count by its family)."""
    files = os.path.join(source_dir, "deploy", "helm", "tandem", "files")
    paths = [os.path.join(files, "rules.yaml")] + [
        os.path.join(files, "dashboards", f) for f in os.listdir(os.path.join(files, "dashboards"))]
    used = set()
    for path in paths:
        with open(path) as f:
            used |= set(re.findall(r"\btandem_[a-z0-9_]+", f.read()))
    missing = sorted(n for n in used
                     if n not in families and re.sub(r"_(bucket|sum|count)$", "", n) not in families)
    assert not missing, f"deploy/ queries series no service exports: {missing}"
    print(f"deploy/: all {len(used)} tandem_* names in the rules and dashboards are exported")


def parse_samples(text):
    """{(name, frozenset(labels)): value} of a scrape's samples."""
    out = {}
    for m in re.finditer(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:{([^}]*)})? (\S+)$", text, re.M):
        labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def one_two_five(max_value):
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return out
            out.append(float(m * scale))
        scale *= 10


def check_vllm_series(text, spec, model_name, info):
    """The scheduler's vllm:* families as vLLM's loggers define them; `info`
    is the scheduler's GetModelInfo answer."""
    max_model_len = info.max_model_len
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    served = {n for n in types if n.startswith("vllm:")}
    listed = {f["name"] for f in spec["families"]}
    assert served == listed, (f"vllm:* families: missing {sorted(listed - served)}, "
                              f"not in vLLM's list {sorted(served - listed)}")
    samples = parse_samples(text)
    base = {("model_name", model_name), ("engine", "0")}
    for f in spec["families"]:
        name, kind = f["name"], f["type"]
        assert types[name] == kind, f"{name}: type {types[name]}, vLLM's is {kind}"
        mine = [(n, dict(l)) for (n, l) in samples
                if n == name or (kind == "histogram" and n in (name + "_bucket", name + "_sum",
                                                              name + "_count"))]
        assert mine, f"{name}: no samples"
        if "info_labels" in f:  # an info gauge: vLLM's config labels, value 1
            assert len(mine) == 1, f"{name}: {mine}"
            labels = mine[0][1]
            assert sorted(labels) == sorted(f["info_labels"]), f"{name}: labels {labels}"
            assert samples[(name, frozenset(labels.items()))] == 1, f"{name} is not 1"
            assert labels["engine"] == "0", labels
            assert labels["block_size"] == str(info.block_size), (labels, info.block_size)
            assert labels["num_gpu_blocks"] == str(info.num_kv_blocks), (labels, info.num_kv_blocks)
            assert labels["enable_prefix_caching"] == "True", labels
            assert labels["cache_dtype"] == "auto", labels
            continue
        extra = f.get("extra_labels", {})
        for n, labels in mine:
            rest = {k: v for k, v in labels.items() if k not in ("le",) and k not in extra}
            assert set(rest.items()) == base, f"{n}: labels {labels}, vLLM's are model_name, engine"
            for k in extra:
                assert labels.get(k) in extra[k], f"{n}: {k}={labels.get(k)}"
        for k, values in extra.items():
            assert {l[k] for _, l in mine} == set(values), f"{name}: {k} values"
        if kind == "histogram":
            buckets = f["buckets"]
            if buckets == "1-2-5":
                buckets = one_two_five(max_model_len)
            elif buckets == "request":
                buckets = spec["request_buckets"]
            les = sorted(float(l["le"]) for n, l in mine if n == name + "_bucket" and l["le"] != "+Inf")
            assert les == [float(b) for b in buckets], f"{name}: buckets {les}, vLLM's {buckets}"
    # The four requests so far went through every phase.
    for phase in ("queue", "prefill", "decode", "inference"):
        n = value(text, f"vllm:request_{phase}_time_seconds_count")
        assert n is not None and n >= 4, f"vllm:request_{phase}_time_seconds_count: {n}"
    length = [v for (n, l), v in samples.items()
              if n == "vllm:request_success_total" and ("finished_reason", "length") in l]
    assert length and length[0] >= 4, f"requests finished by length: {length}"
    print(f"scheduler: all {len(listed)} vLLM families with vLLM's types, labels and buckets "
          f"(1-2-5 buckets to max_model_len {max_model_len})")


def vllm_dashboard_run(promtool, tmp, panels, before, after, model_name, leave_out=None):
    """`promtool test rules`: one alert per dashboard query that fires when
    the query gives no number at the second scrape. True when none fires."""
    rules, tests = [], []
    for i, panel in enumerate(panels):
        for j, expr in enumerate(panel["exprs"]):
            expr = expr.replace("$model_name", model_name).replace("$__rate_interval", "2m")
            name = f"Panel{i}Query{j}"
            rules.append({"alert": name, "expr": f"absent(({expr}) >= 0)",
                          "annotations": {"panel": panel["title"]}})
            tests.append({"eval_time": "1m", "alertname": name, "exp_alerts": []})
    series = []
    for key in sorted(set(after), key=str):
        name, labels = key
        if not name.startswith("vllm:") or name == leave_out:
            continue
        desc = name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels)) + "}"
        first = before.get(key)
        series.append({"series": desc,
                       "values": f"{'_' if first is None else repr(first)} {repr(after[key])}"})
    rules_path = os.path.join(tmp, "vllm_dashboard_rules.yaml")
    test_path = os.path.join(tmp, "vllm_dashboard_test.yaml")
    with open(rules_path, "w") as f:
        json.dump({"groups": [{"name": "vllm-dashboard", "rules": rules}]}, f)
    with open(test_path, "w") as f:
        json.dump({"rule_files": [rules_path], "evaluation_interval": "1m",
                   "tests": [{"interval": "1m", "input_series": series,
                              "alert_rule_test": tests}]}, f)
    r = subprocess.run([promtool, "test", "rules", test_path], capture_output=True, text=True)
    return r.returncode == 0, r.stdout + r.stderr, len(tests)


def check_vllm_dashboard(source_dir, tmp, before, after, model_name):
    with open(os.path.join(source_dir, "tests", "integration", "vllm_grafana_queries.json")) as f:
        panels = json.load(f)["panels"]
    promtool = shutil.which("promtool")
    ok, out, n = vllm_dashboard_run(promtool, tmp, panels, parse_samples(before),
                                    parse_samples(after), model_name)
    assert ok, f"vLLM's dashboard: a query gives no data:\n{out}"
    ok, out, _ = vllm_dashboard_run(promtool, tmp, panels, parse_samples(before),
                                    parse_samples(after), model_name,
                                    leave_out="vllm:request_queue_time_seconds_sum")
    assert not ok and "Panel9Query0" in out, f"the control run without the queue time passed:\n{out}"
    print(f"vLLM's Grafana dashboard: all {len(panels)} panels ({n} queries) have data "
          f"(promtool test rules); without vllm:request_queue_time_seconds_sum its panel has none")


def main():
    build_dir, source_dir, shared_dir = sys.argv[1], sys.argv[2], sys.argv[3]
    model = os.path.join(shared_dir, "models", "stories260K.bin")
    tmp = tempfile.mkdtemp(prefix="tandem-metrics-")
    rc = protoc.main(["protoc", f"-I{source_dir}/protos", f"--python_out={tmp}",
                      f"--grpc_python_out={tmp}", f"{source_dir}/protos/tandem/v1/common.proto",
                      f"{source_dir}/protos/tandem/v1/generation.proto"])
    assert rc == 0, "protoc failed"
    sys.path.insert(0, tmp)
    from tandem.v1 import generation_pb2 as gen, generation_pb2_grpc as gen_grpc

    ports = {name: free_port() for name in ("kvstore", "worker", "scheduler")}
    # "[::]" serves IPv6 and IPv4 (a dual-stack socket).
    ipv6 = has_ipv6()
    metrics_host = "[::]" if ipv6 else "127.0.0.1"
    scrape_hosts = ["127.0.0.1", "[::1]"] if ipv6 else ["127.0.0.1"]
    procs = []
    try:
        kv, kport = start([os.path.join(build_dir, "services/kvstore/tandem-kvstore"),
                           "--listen", "127.0.0.1:0", "--port-file", os.path.join(tmp, "k.port"),
                           "--data-dir", os.path.join(tmp, "kv"),
                           "--metrics-listen", f"127.0.0.1:{ports['kvstore']}"],
                          os.path.join(tmp, "kvstore.log"), os.path.join(tmp, "k.port"))
        procs.append(kv)
        worker, wport = start([os.path.join(build_dir, "services/worker/tandem-worker"),
                               "--model", model, "--listen", "127.0.0.1:0",
                               "--port-file", os.path.join(tmp, "w.port"),
                               "--kvstore", f"127.0.0.1:{kport}",
                               "--metrics-listen", f"127.0.0.1:{ports['worker']}"],
                              os.path.join(tmp, "worker.log"), os.path.join(tmp, "w.port"))
        procs.append(worker)
        sched, sport = start([os.path.join(build_dir, "services/scheduler/tandem-scheduler"),
                              "--worker", f"127.0.0.1:{wport}", "--listen", "127.0.0.1:0",
                              "--port-file", os.path.join(tmp, "s.port"),
                              "--kvstore", f"127.0.0.1:{kport}",
                              "--metrics-listen", f"{metrics_host}:{ports['scheduler']}"],
                             os.path.join(tmp, "scheduler.log"), os.path.join(tmp, "s.port"))
        procs.append(sched)
        stub = gen_grpc.GenerationStub(grpc.insecure_channel(f"127.0.0.1:{sport}"))
        request = gen.GenerateRequest(prompt_token_ids=list(range(1, 70)))
        request.sampling.max_tokens = 8
        deadline = time.time() + 60
        done = 0
        while done < 2:
            try:
                list(stub.Generate(request, timeout=30))
                done += 1
            except grpc.RpcError as e:  # UNAVAILABLE until the worker is up
                assert e.code() == grpc.StatusCode.UNAVAILABLE and time.time() < deadline, e
                time.sleep(0.1)

        # vLLM's series: a scrape, more requests, another scrape (the
        # dashboard's rates need two).
        vllm_before = scrape(ports["scheduler"])
        for max_tokens in (5, 12):
            request.sampling.max_tokens = max_tokens
            list(stub.Generate(request, timeout=30))
        vllm_after = scrape(ports["scheduler"])
        info = stub.GetModelInfo(gen.GetModelInfoRequest(), timeout=10)
        with open(os.path.join(source_dir, "tests", "integration", "vllm_metrics.json")) as f:
            check_vllm_series(vllm_after, json.load(f), "stories260K.bin", info)
        check_vllm_dashboard(source_dir, tmp, vllm_before, vllm_after, "stories260K.bin")

        # The worker stores blocks in the background: wait for them to land.
        kv_text = ""
        while time.time() < deadline:
            kv_text = scrape(ports["kvstore"])
            if (value(kv_text, "tandem_kvstore_blocks_stored_total") or 0) > 0:
                break
            time.sleep(0.1)
        families = set()
        for name in ("kvstore", "worker", "scheduler"):
            text = scrape(ports[name])
            promtool_check(name, text)
            families |= set(re.findall(r"^# TYPE (\S+) ", text, re.M))
        check_deploy_names(source_dir, families)
        kv_text = scrape(ports["kvstore"])
        for series in ("tandem_kvstore_lookups_total", "tandem_kvstore_bulk_lookups_total",
                       "tandem_kvstore_blocks_stored_total", "tandem_kvstore_cold_blocks"):
            assert (value(kv_text, series) or 0) > 0, f"{series} did not move:\n{kv_text}"
        check_worker_kv_series(ports["worker"], value(kv_text, "tandem_kvstore_blocks_stored_total"),
                               deadline)
        check_worker_device_series(scrape(ports["worker"]))
        check_scheduler_series(scrape(ports["scheduler"]))
        check_concurrent_scrapes(ports["scheduler"], scrape_hosts)
        finished = value(scrape(ports["scheduler"]), "tandem_scheduler_requests_finished_total")
        assert finished is not None and finished >= 2, f"requests finished: {finished}"
        print("kvstore: lookups %d (bulk port %d), blocks stored %d; scheduler: %d finished" % (
            value(kv_text, "tandem_kvstore_lookups_total"),
            value(kv_text, "tandem_kvstore_bulk_lookups_total"),
            value(kv_text, "tandem_kvstore_blocks_stored_total"), finished))
    finally:
        for p in reversed(procs):
            p.terminate()
            p.wait(timeout=30)
    print("metrics_test: OK")


if __name__ == "__main__":
    main()
