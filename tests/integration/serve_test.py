#!/usr/bin/python3
"""`tandem serve MODEL` (issue 33), as a vLLM user runs `vllm serve MODEL`.

  1. Bad command lines exit 2 naming what is wrong: an unknown flag, a second
     positional argument, a vLLM flag we cannot honour (--seed), a value the
     worker refuses (--gpu-memory-utilization on the cpu backend),
     a flag serve sets itself (--listen), a llama2.c model without
     --tokenizer.
  2. `tandem serve random32k.bin --tokenizer ... --kv-store
     --served-model-name tiny other --disable-log-requests --max-num-seqs 8`
     starts the KV-store, worker, scheduler and frontend as its children and
     prints "serving URL" once /health answers.
  3. The npm `openai` SDK (a client we did not write) gets the reference
     tokens of every case in random32k.reference.json (llama2.c's run.c),
     streamed and not, and a chat completion each way; /v1/models lists both
     names, a request naming the second gets it back, another name is a 404.
     The routed flags reached their parts (the scheduler's command line), and
     --disable-log-requests left no per-request line in the scheduler's log.
  4. The API port's /metrics serves the scheduler's vllm:* and tandem_*
     series after the frontend's, each family once, promtool clean.
  5. SIGINT stops every child (each exits 0) and serve exits 0; no child is
     left. Killing the worker instead makes serve stop the rest and exit 1.

Usage: serve_test.py BUILD_DIR SHARED_DIR
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from python_client_test import free_port  # noqa: E402
from metrics_test import parse_samples, promtool_check  # noqa: E402


def children(pid):
    """{pid: command line} of `pid`'s children."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            if ppid == pid:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    out[int(entry)] = f.read().decode().replace("\0", " ")
        except (OSError, ValueError):
            pass
    return out


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def bad_usage(tandem, models):
    model = os.path.join(models, "random32k.bin")
    tok = os.path.join(models, "tokenizer.model")
    for args, needle in (
            ([model, "--tokenizer", tok, "--nope"], "unknown flag --nope"),
            ([model, "--tokenizer", tok, "extra"], "unexpected argument 'extra'"),
            ([model, "--tokenizer", tok, "--seed", "1"], "--seed: not supported"),
            ([model, "--tokenizer", tok, "--listen", "0.0.0.0:1"], "--listen: tandem serve sets it"),
            ([model], "is a llama2.c file: give its tokenizer with --tokenizer"),
            ([model, "--tokenizer", tok, "--generation-config", "vllm"], "--generation-config vllm"),
    ):
        r = subprocess.run([tandem, "serve", *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and needle in r.stderr, (args, r.returncode, r.stderr)
        assert not r.stdout.startswith("serving"), r.stdout
    print("bad command lines: exit 2, each naming its flag or argument")


def start(tandem, models, port, log_path):
    cmd = [tandem, "serve", os.path.join(models, "random32k.bin"),
           "--tokenizer", os.path.join(models, "tokenizer.model"), "--chat-template", "llama-2",
           "--host", "127.0.0.1", "--port", str(port), "--kv-store",
           "--served-model-name", "tiny", "other", "--disable-log-requests", "--max-num-seqs", "8"]
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    line = proc.stdout.readline()  # "serving URL", or EOF when it failed
    assert line.startswith("serving http://127.0.0.1:"), \
        f"tandem serve did not come up ({line!r}):\n{open(log_path).read()}"
    return proc


def post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def check_openai(build, models, base, tmp):
    npm = os.path.join(build, "frontend_npm")
    out = os.path.join(tmp, "openai_cases.json")
    reference_path = os.path.join(models, "random32k.reference.json")
    r = subprocess.run(["node", os.path.join(npm, "openai_cases.mjs"), base, reference_path, out],
                       env={**os.environ, "NODE_PATH": os.path.join(npm, "node_modules")},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    with open(out) as f:
        got = json.load(f)
    with open(reference_path) as f:
        reference = json.load(f)
    reference = reference["cases"] if isinstance(reference, dict) else reference
    assert got["model"] == "tiny", got["model"]
    assert len(got["cases"]) == len(reference)
    for ref, case in zip(reference, got["cases"]):
        expected = ref["expected_output_token_ids"]
        assert case["nonstream"]["token_ids"] == expected, (ref["prompt_text"], case["nonstream"])
        assert case["stream"]["token_ids"] == expected, (ref["prompt_text"], case["stream"])
        assert case["nonstream"]["text"] == case["stream"]["text"]
    chat = got["chat"]
    assert chat["nonstream"]["token_ids"] and chat["stream"]["token_ids"] == chat["nonstream"]["token_ids"]
    assert chat["stream"]["text"] == chat["nonstream"]["text"]
    print(f"openai SDK through tandem serve: {len(reference)} reference cases token for token, "
          "streamed and not; chat both ways")


def check_names(base):
    with urllib.request.urlopen(base + "/models", timeout=30) as r:
        ids = [m["id"] for m in json.loads(r.read())["data"]]
    assert ids == ["tiny", "other"], ids
    status, body = post(base + "/completions", {"model": "other", "prompt": "Once", "max_tokens": 2})
    assert status == 200 and body["model"] == "other", (status, body)
    status, body = post(base + "/completions", {"model": "nope", "prompt": "Once", "max_tokens": 2})
    assert status == 404 and "'tiny', 'other'" in body["error"]["message"], (status, body)
    print("served names: /v1/models lists tiny and other; 'other' echoed; 'nope' is a 404")


def check_metrics(port):
    """The API port's /metrics holds the frontend's series and, relayed, the
    scheduler's (vllm:*, tandem_scheduler_*), as vllm serve's does: each
    family once, promtool clean."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    families = re.findall(r"^# TYPE (\S+) ", text, re.M)
    dup = sorted({f for f in families if families.count(f) > 1})
    assert not dup, f"families served twice: {dup}"
    for family in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                   "vllm:kv_cache_usage_perc", "vllm:request_success_total",
                   "vllm:cache_config_info", "vllm:request_params_n",
                   "tandem_frontend_requests_total", "tandem_scheduler_requests_finished_total"):
        assert family in families, f"{family} is not on the API port's /metrics"
    samples = parse_samples(text)
    up = [v for (n, _), v in samples.items() if n == "tandem_frontend_metrics_from_up"]
    assert up == [1.0], f"tandem_frontend_metrics_from_up {up}"
    done = sum(v for (n, _), v in samples.items() if n == "vllm:request_success_total")
    assert done > 0, "vllm:request_success_total did not move"
    promtool_check("tandem serve's /metrics", text)
    print(f"API port /metrics: the frontend's and the scheduler's {len(families)} families, "
          f"each once ({int(done)} requests in vllm:request_success_total)")


def main():
    build, shared = sys.argv[1], sys.argv[2]
    models = os.path.join(shared, "models")
    tandem = os.path.join(build, "tools", "cli", "tandem")
    tmp = tempfile.mkdtemp(prefix="tandem-serve-test-")
    bad_usage(tandem, models)

    port = free_port()
    proc = start(tandem, models, port, os.path.join(tmp, "serve.log"))
    try:
        kids = children(proc.pid)
        names = sorted(os.path.basename(c.split()[0]) for c in kids.values())
        assert names == ["tandem-frontend", "tandem-kvstore", "tandem-scheduler",
                         "tandem-worker"], kids
        sched = next(c for c in kids.values() if "tandem-scheduler" in c.split()[0])
        for flag in ("--disable-log-requests", "--max-num-seqs=8", "--served-model-name=tiny",
                     "--kvstore=127.0.0.1:"):
            assert flag in sched, (flag, sched)
        base = f"http://127.0.0.1:{port}/v1"
        check_names(base)
        check_openai(build, models, base, tmp)
        check_metrics(port)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 0, open(os.path.join(tmp, "serve.log")).read()
        log = open(os.path.join(tmp, "serve.log")).read()
        for name in ("tandem-frontend", "tandem-scheduler", "tandem-worker", "tandem-kvstore"):
            assert f"{name} stopped (exit 0)" in log, (name, log[-3000:])
        left = [pid for pid in kids if alive(pid)]
        assert not left, f"children left after SIGINT: {left}"
        print("SIGINT: every part stopped with exit 0, serve exited 0, no child left")
        # The parts log to serve's stderr: --disable-log-requests reached the
        # scheduler and it wrote no line per request.
        assert "scheduler " in log and " finished: reason=" not in log, \
            "the scheduler logged requests despite --disable-log-requests"
        print("--disable-log-requests: no per-request log line from the scheduler")

        # A part that dies stops the rest; serve exits 1.
        proc = start(tandem, models, free_port(), os.path.join(tmp, "serve2.log"))
        kids = children(proc.pid)
        worker = next(p for p, c in kids.items() if "tandem-worker" in c.split()[0])
        os.kill(worker, signal.SIGKILL)
        assert proc.wait(timeout=120) == 1
        log = open(os.path.join(tmp, "serve2.log")).read()
        assert "tandem-worker exited (signal" in log, log[-3000:]
        left = [pid for pid in kids if alive(pid)]
        assert not left, f"children left after the worker died: {left}"
        print("a killed worker: serve stopped the other parts and exited 1, no child left")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    print("serve_test: OK")


if __name__ == "__main__":
    main()
