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
     dashboards in deploy/ query is one the services export.

Usage: metrics_test.py BUILD_DIR SOURCE_DIR SHARED_DIR
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

import grpc
from grpc_tools import protoc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from python_client_test import free_port, start  # noqa: E402


def scrape(port):
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()


def value(text, name):
    """The sum of a metric's series (labelled or not), or None."""
    found = re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    return sum(float(v) for v in found) if found else None


def promtool_check(name, text):
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found (Debian package prometheus; tools/install-deps.sh)"
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    problems = (r.stdout + r.stderr).strip()
    assert r.returncode == 0 and not problems, f"{name}: promtool check metrics:\n{problems}"
    series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    print(f"{name}: {series} series, promtool check metrics clean")


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
                              "--metrics-listen", f"127.0.0.1:{ports['scheduler']}"],
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
