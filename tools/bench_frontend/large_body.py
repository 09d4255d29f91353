#!/usr/bin/python3
"""The large-body attack of issue 29, measured: what unauthenticated big
bodies cost tandem-frontend.

Starts `tandem serve` (random32k, llama2.c tokenizer, max_model_len 256),
then sends CONCURRENT requests at once, half to /v1/completions and half to
/tokenize, each a prompt of BODY_MB MiB of text, while a prober asks /health
every 50 ms. Prints each answer's status and time, /health's median and
worst latency during the attack, and the frontend's peak RSS (VmHWM) and
RSS once idle again. Issue 29 measured 84 s of CPU and 3.4 GB for one 30 MB
text before the size bound, and 13.5 s /health answers under two 4 MB ones.

Usage: large_body.py BUILD_DIR SHARED_DIR [BODY_MB=30] [CONCURRENT=4]
"""
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                                "integration"))
from python_client_test import free_port  # noqa: E402
from serve_test import children  # noqa: E402


def status_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def post(url, data):
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError as e:
        return f"error: {e}"


def main():
    build, shared = sys.argv[1], sys.argv[2]
    body_mb = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    concurrent = int(sys.argv[4]) if len(sys.argv) > 4 else 4
    models = os.path.join(shared, "models")
    tmp = tempfile.mkdtemp(prefix="tandem-large-body-")
    log = open(os.path.join(tmp, "serve.log"), "w")
    proc = subprocess.Popen(
        [os.path.join(build, "tools", "cli", "tandem"), "serve",
         os.path.join(models, "random32k.bin"), "--tokenizer",
         os.path.join(models, "tokenizer.model"), "--host", "127.0.0.1", "--port",
         str(free_port()), "--max-model-len", "256"],
        stdout=subprocess.PIPE, stderr=log, text=True)
    line = proc.stdout.readline()
    assert line.startswith("serving "), f"tandem serve did not come up: {line!r}"
    base = line.split()[1].rstrip("/")
    base = base[:-3] if base.endswith("/v1") else base
    frontend = next(p for p, cmd in children(proc.pid).items() if "tandem-frontend" in cmd)
    try:
        text = ("Once upon a time there was a little dog. " * (body_mb * 1024 * 1024 // 42 + 1))
        body = json.dumps({"prompt": text[:body_mb << 20], "max_tokens": 4}).encode()
        idle_kib = status_kib(frontend, "VmRSS")
        done = threading.Event()
        health = []

        def probe():
            while not done.is_set():
                t = time.monotonic()
                try:
                    urllib.request.urlopen(base + "/health", timeout=60).read()
                except OSError:
                    pass
                health.append(time.monotonic() - t)
                time.sleep(0.05)

        results = []

        def attack(i):
            path = "/v1/completions" if i % 2 == 0 else "/tokenize"
            t = time.monotonic()
            results.append((path, post(base + path, body), time.monotonic() - t))

        prober = threading.Thread(target=probe)
        prober.start()
        attackers = [threading.Thread(target=attack, args=(i,)) for i in range(concurrent)]
        for a in attackers:
            a.start()
        for a in attackers:
            a.join()
        done.set()
        prober.join()
        time.sleep(1.0)
        peak = status_kib(frontend, "VmHWM")
        after = status_kib(frontend, "VmRSS")
        for path, status, seconds in results:
            print(f"{path}: {status} in {seconds:.2f} s")
        print(f"{concurrent} bodies of {body_mb} MiB: /health median "
              f"{statistics.median(health) * 1e3:.1f} ms, worst {max(health) * 1e3:.1f} ms "
              f"over {len(health)} probes; frontend RSS idle {idle_kib / 1024:.0f} MiB, peak "
              f"{peak / 1024:.0f} MiB, after {after / 1024:.0f} MiB")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)


if __name__ == "__main__":
    main()
