#!/usr/bin/python3
"""The chart's probes against the real binaries.

Renders the chart with its defaults (and the KV-store's local socket on),
takes each container's args and the gRPC health names of its startup,
liveness and readiness probes, starts tandem-kvstore, tandem-worker and
tandem-scheduler with those args (adapted: loopback addresses and free
ports, temporary directories, the shared model under the chart's mount path,
the cpu backend, small memory budgets) and asks each probe's question with a
gRPC health client in each state:

  1. worker loading (--debug-load-delay-ms): the worker is live but not
     ready; the scheduler is live but not ready. The KV-store is both.
  2. all up: every probe SERVING.
  3. worker dead (SIGKILL): the scheduler turns not ready and stays live;
     it is ready again once a worker is back on the port.
  4. scheduler draining (SIGTERM with an accepted request held in its queue
     by --debug-submit-delay-ms): not ready, still live until it exits; the
     request finishes; after the exit nothing answers.

A liveness probe that followed the worker would have the kubelet restart
healthy schedulers while their worker loads or restarts.

Usage: probe_test.py BUILD_DIR SOURCE_DIR SHARED_DIR
"""
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deploy_common import chart_dir, find_helm, objects, pod_specs, render_text  # noqa: E402

BINARIES = {"kvstore": "services/kvstore/tandem-kvstore",
            "scheduler": "services/scheduler/tandem-scheduler",
            "worker": "services/worker/tandem-worker"}
LOAD_DELAY_MS = 6000
SUBMIT_DELAY_MS = 3000
SERVING, NOT_SERVING = "SERVING", "NOT_SERVING"
STATUS = {0: "UNKNOWN", 1: SERVING, 2: NOT_SERVING, 3: "SERVICE_UNKNOWN"}


# --- a gRPC health client and a Generate call, without generated code --------
def varint(n):
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def fields(data):
    """(field number, wire type, value) of a protobuf message: varints and
    length-delimited values only (all these messages use)."""
    i = 0
    while i < len(data):
        key, i = read_varint(data, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            value, i = read_varint(data, i)
        elif wire == 2:
            n, i = read_varint(data, i)
            value, i = data[i:i + n], i + n
        else:
            raise ValueError(f"wire type {wire}")
        yield num, wire, value


def read_varint(data, i):
    shift = value = 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def health_request(service):
    raw = service.encode()
    return b"\x0a" + varint(len(raw)) + raw if raw else b""  # HealthCheckRequest.service = 1


def health_status(data):
    status = 0
    for num, _, value in fields(data):
        if num == 1:  # HealthCheckResponse.status
            status = value
    return STATUS.get(status, str(status))


def health(port, service):
    """The answer of grpc.health.v1.Health/Check, or the RPC's error code."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                    request_serializer=health_request,
                                    response_deserializer=health_status)
        try:
            return check(service, timeout=2)
        except grpc.RpcError as e:
            return e.code().name


def generate_request(prompt, max_tokens):
    ids = b"".join(varint(t) for t in prompt)
    sampling = b"\x30" + varint(max_tokens)  # SamplingParams.max_tokens = 6
    return (b"\x12" + varint(len(ids)) + ids  # prompt_token_ids = 2 (packed)
            + b"\x1a" + varint(len(sampling)) + sampling)  # sampling = 3


def generate(port, result):
    """Generate on the scheduler; stores (tokens, finish_reason) or the error."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_stream("/tandem.v1.Generation/Generate",
                                    request_serializer=lambda b: b,
                                    response_deserializer=lambda b: b)
        tokens, finish = 0, 0
        try:
            for msg in call(generate_request([1], 8), timeout=60):
                for num, wire, value in fields(msg):
                    if num == 2:  # token_ids, packed or not
                        tokens += len(list(_packed(value))) if wire == 2 else 1
                    elif num == 3:  # finish_reason
                        finish = value
            result["ok"] = (tokens, finish)
        except grpc.RpcError as e:
            result["error"] = f"{e.code().name}: {e.details()}"


def _packed(data):
    i = 0
    while i < len(data):
        v, i = read_varint(data, i)
        yield v


# --- the chart's containers --------------------------------------------------
def rendered(source_dir):
    # The gRPC parts' probes (the frontend's are HTTP: helm_test checks them).
    objs = objects(render_text(find_helm(source_dir), chart_dir(source_dir),
                               sets=["frontend.enabled=false",
                                     "kvstore.localSocket.enabled=true"]))
    out = {}
    for _, spec in pod_specs(objs):
        for c in spec["containers"]:
            probes = {p: c[p]["grpc"].get("service", "")
                      for p in ("startupProbe", "livenessProbe", "readinessProbe")}
            mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
            out[c["name"]] = {"args": c["args"], "probes": probes, "mounts": mounts}
    assert sorted(out) == sorted(BINARIES), sorted(out)
    return out


def adapt(args, overrides, extra=()):
    """The rendered args with some flags' values replaced; every override
    must replace a rendered flag or be listed in extra (TEST-ONLY flags)."""
    out, used = [], set()
    for a in args:
        flag = a.split("=", 1)[0]
        if flag in overrides:
            out.append(f"{flag}={overrides[flag]}")
            used.add(flag)
        else:
            out.append(a)
    unused = set(overrides) - used
    assert not unused, f"the chart no longer passes {unused}"
    return out + list(extra)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Service:
    def __init__(self, name, build_dir, args, tmp):
        self.name = name
        self.port_file = os.path.join(tmp, f"{name}.port")
        if os.path.exists(self.port_file):
            os.unlink(self.port_file)
        self.log = os.path.join(tmp, f"{name}.log")
        argv = [os.path.join(build_dir, BINARIES[name])] + args + [f"--port-file={self.port_file}"]
        self.proc = subprocess.Popen(argv, stdout=open(self.log, "a"), stderr=subprocess.STDOUT)
        self.started = time.time()
        self.port = self._wait_port()

    def _wait_port(self):
        deadline = time.time() + 30
        while time.time() < deadline:
            if os.path.exists(self.port_file):
                with open(self.port_file) as f:
                    text = f.read().strip()
                if text:
                    return int(text)
            assert self.proc.poll() is None, f"{self.name} exited early:\n{self.tail()}"
            time.sleep(0.02)
        raise AssertionError(f"{self.name}: no port file")

    def tail(self):
        with open(self.log) as f:
            return "".join(f.readlines()[-20:])

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def expect(svc, probes, want, state):
    """Each probe of svc answers as want says ({probe: status})."""
    for probe, status in want.items():
        got = health(svc.port, probes[probe])
        assert got == status, f"{state}: {svc.name} {probe} ({probes[probe]!r}) answered " \
                              f"{got}, want {status}\n{svc.tail()}"


def wait_for(svc, service, status, state, timeout=30):
    deadline = time.time() + timeout
    got = None
    while time.time() < deadline:
        got = health(svc.port, service)
        if got == status:
            return
        time.sleep(0.1)
    raise AssertionError(f"{state}: {svc.name} {service!r} still {got} after {timeout} s, "
                         f"want {status}\n{svc.tail()}")


def main():
    build_dir, source_dir, shared_dir = sys.argv[1], sys.argv[2], sys.argv[3]
    chart = rendered(source_dir)
    probes = {name: c["probes"] for name, c in chart.items()}
    live = {"startupProbe": SERVING, "livenessProbe": SERVING}
    ready = {**live, "readinessProbe": SERVING}
    not_ready = {**live, "readinessProbe": NOT_SERVING}
    for name, p in probes.items():
        print(f"{name}: startup {p['startupProbe']!r}, liveness {p['livenessProbe']!r}, "
              f"readiness {p['readinessProbe']!r}")

    with tempfile.TemporaryDirectory(prefix="tandem-probes-") as tmp:
        services = []
        try:
            kv = Service("kvstore", build_dir, adapt(chart["kvstore"]["args"], {
                "--listen": "127.0.0.1:0", "--bulk-load-listen": f"127.0.0.1:{free_port()}",
                "--metrics-listen": "127.0.0.1:0", "--data-dir": os.path.join(tmp, "kv"),
                "--hot-capacity-bytes": str(16 << 20),
                "--local-socket": os.path.join(tmp, "kv.sock")}), tmp)
            services.append(kv)
            wait_for(kv, probes["kvstore"]["readinessProbe"], SERVING, "kvstore start")
            expect(kv, probes["kvstore"], ready, "kvstore up")

            # The chart mounts the model at its mountPath; here the shared one.
            w_args = chart["worker"]["args"]
            model_arg = next(a for a in w_args if a.startswith("--model="))[len("--model="):]
            mount = chart["worker"]["mounts"]["model"]
            model = os.path.join(shared_dir, "models", os.path.relpath(model_arg, mount))
            assert os.path.exists(model), model
            worker_overrides = {
                "--listen": "127.0.0.1:0", "--metrics-listen": "127.0.0.1:0", "--model": model,
                "--backend": "cpu", "--kvstore": f"127.0.0.1:{kv.port}"}
            # The chart sizes a cuda worker's cache by --gpu-memory-utilization,
            # which the cpu backend refuses: a fixed cache stands in for it.
            gpu_util = [a for a in w_args if a.startswith("--gpu-memory-utilization=")]
            assert gpu_util == ["--gpu-memory-utilization=0.9"], w_args
            w_args = [a for a in w_args if a not in gpu_util]
            worker = Service("worker", build_dir, adapt(
                w_args, worker_overrides, [f"--debug-load-delay-ms={LOAD_DELAY_MS}",
                                           f"--kv-cache-bytes={64 << 20}"]), tmp)
            services.append(worker)
            sched = Service("scheduler", build_dir, adapt(chart["scheduler"]["args"], {
                "--listen": "127.0.0.1:0", "--worker": f"127.0.0.1:{worker.port}",
                "--metrics-listen": "127.0.0.1:0", "--kvstore": f"127.0.0.1:{kv.port}"},
                [f"--debug-submit-delay-ms={SUBMIT_DELAY_MS}"]), tmp)
            services.append(sched)

            # 1. The worker loads its weights.
            expect(worker, probes["worker"], not_ready, "worker loading")
            expect(sched, probes["scheduler"], not_ready, "worker loading")
            assert time.time() - worker.started < LOAD_DELAY_MS / 1000, \
                "the worker may have loaded already: the checks above were too slow"
            print("worker loading: worker live, not ready; scheduler live, not ready; "
                  "KV-store live and ready")

            # 2. Up.
            wait_for(worker, probes["worker"]["readinessProbe"], SERVING, "worker loaded")
            wait_for(sched, probes["scheduler"]["readinessProbe"], SERVING, "worker loaded")
            for svc in (kv, worker, sched):
                expect(svc, probes[svc.name], ready, "all up")
            print("all up: every probe SERVING")

            # 3. The worker dies, then comes back on its port.
            worker.stop(signal.SIGKILL)
            wait_for(sched, probes["scheduler"]["readinessProbe"], NOT_SERVING, "worker dead", 20)
            for _ in range(3):
                expect(sched, probes["scheduler"], not_ready, "worker dead")
                time.sleep(0.5)
            print("worker dead: scheduler live, not ready")
            worker_overrides["--listen"] = f"127.0.0.1:{worker.port}"
            worker = Service("worker", build_dir, adapt(w_args, worker_overrides), tmp)
            services.append(worker)
            wait_for(sched, probes["scheduler"]["readinessProbe"], SERVING, "worker back")
            print("worker back: scheduler ready again")

            # 4. The scheduler drains a request it accepted, then exits.
            result = {}
            call = threading.Thread(target=generate, args=(sched.port, result))
            call.start()
            time.sleep(0.5)  # accepted, held in the engine's queue
            sched.proc.send_signal(signal.SIGTERM)
            wait_for(sched, probes["scheduler"]["readinessProbe"], NOT_SERVING, "draining", 2)
            checks = 0
            while True:
                answers = {p: health(sched.port, probes["scheduler"][p]) for p in not_ready}
                if sched.proc.poll() is not None:
                    break
                if answers == not_ready:
                    checks += 1
                elif checks:  # late answers may race the exit
                    assert sched.proc.wait(timeout=5) is not None
                    break
                else:
                    raise AssertionError(f"draining: {answers}, want {not_ready}\n{sched.tail()}")
                time.sleep(0.2)
            assert checks >= 3, f"draining: only {checks} checks before the exit"
            sched.proc.wait(timeout=40)
            call.join(timeout=60)
            assert "ok" in result, f"draining: the accepted request failed: {result}"
            tokens, finish = result["ok"]
            assert tokens > 0 and finish != 0, result
            gone = health(sched.port, probes["scheduler"]["livenessProbe"])
            assert gone == "UNAVAILABLE", f"after the exit liveness answered {gone}"
            print(f"draining: scheduler not ready and live for {checks} checks until it exited; "
                  f"its accepted request finished ({tokens} tokens); then UNAVAILABLE")
        finally:
            for svc in reversed(services):
                svc.stop()
    print("probe_test: OK")


if __name__ == "__main__":
    main()
