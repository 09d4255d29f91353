#!/usr/bin/python3
"""OpenAI logprobs from the real model (issue 30), through `tandem serve`.

  1. Greedy completions (temperature 0, logprobs 5) of random32k: at every
     position the sampled token is the most likely one (its logprob equals
     the largest of top_logprobs, within 1e-4), top_logprobs has 5 or 6
     entries (the top 5, plus the sampled token when not among them), every
     value <= 0, and text_offset grows by each token's length.
  2. Chat with logprobs + top_logprobs 5, greedy: each content entry's
     top_logprobs is sorted descending, its first entry is the sampled token
     (rank 1) with the same logprob, and `bytes` decode to the token's text
     when that text is not U+FFFD.
  3. vLLM's prompt_logprobs: the sampled token's rank is 1 in the
     completion's own positions, and the prompt's entries have ranks >= 1.
  4. echo + logprobs (lm-evaluation-harness's loglikelihood request,
     max_tokens 1, logprobs 1, temperature 0) of prompt + completion scores
     the completion's tokens with the logprobs the completion returned
     (within 1e-4): prompt scoring and decoding agree.

Usage: logprobs_test.py BUILD_DIR SHARED_DIR
"""
import json
import math
import os
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from python_client_test import free_port  # noqa: E402
from serve_test import post  # noqa: E402

TOL = 1e-4
PROMPTS = ["Once upon a time", "The little dog", "Lily and Ben went to the park"]


def start(tandem, models, port, log_path):
    cmd = [tandem, "serve", os.path.join(models, "random32k.bin"),
           "--tokenizer", os.path.join(models, "tokenizer.model"), "--chat-template", "llama-2",
           "--host", "127.0.0.1", "--port", str(port)]
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    line = proc.stdout.readline()  # "serving URL", or EOF when it failed
    assert line.startswith("serving http://127.0.0.1:"), \
        f"tandem serve did not come up ({line!r}):\n{open(log_path).read()}"
    return proc, line.split()[1].rstrip("/")


def check_greedy(base):
    for prompt in PROMPTS:
        status, r = post(base + "/v1/completions",
                         {"prompt": prompt, "max_tokens": 12, "temperature": 0, "logprobs": 5})
        assert status == 200, r
        lp = r["choices"][0]["logprobs"]
        n = len(lp["tokens"])
        assert n == r["usage"]["completion_tokens"], (n, r["usage"])
        assert all(len(lp[k]) == n for k in ("token_logprobs", "top_logprobs", "text_offset")), lp
        for i in range(n):
            top = lp["top_logprobs"][i]
            own = lp["token_logprobs"][i]
            assert 5 <= len(top) <= 6, top
            assert all(v <= 0 for v in top.values()), top
            # Greedy: the sampled token is the most likely one.
            assert abs(own - max(top.values())) <= TOL, (prompt, i, own, top)
            assert abs(top[lp["tokens"][i]] - own) <= TOL, (prompt, i, own, top)
            if i > 0:
                assert lp["text_offset"][i] == lp["text_offset"][i - 1] + len(lp["tokens"][i - 1])
    print(f"completions: greedy tokens are each position's most likely ({len(PROMPTS)} prompts)")


def check_chat(base):
    status, r = post(base + "/v1/chat/completions",
                     {"messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": 12,
                      "temperature": 0, "logprobs": True, "top_logprobs": 5})
    assert status == 200, r
    content = r["choices"][0]["logprobs"]["content"]
    assert len(content) == r["usage"]["completion_tokens"], (len(content), r["usage"])
    for e in content:
        top = e["top_logprobs"]
        assert len(top) == 5, e
        values = [t["logprob"] for t in top]
        assert values == sorted(values, reverse=True), values
        assert abs(top[0]["logprob"] - e["logprob"]) <= TOL, e
        assert top[0]["token"] == e["token"], e
        if "\ufffd" not in e["token"]:
            assert bytes(e["bytes"]).decode() == e["token"], e
    print("chat: top_logprobs sorted, the greedy token first with its own logprob")


def check_prompt_logprobs(base):
    status, r = post(base + "/v1/completions",
                     {"prompt": PROMPTS[1], "max_tokens": 4, "temperature": 0,
                      "prompt_logprobs": 3, "return_token_ids": True})
    assert status == 200, r
    choice = r["choices"][0]
    pl = choice["prompt_logprobs"]
    ids = choice["prompt_token_ids"]  # in the choice, as vLLM's completions put it
    assert len(pl) == len(ids) and pl[0] is None, pl
    for pos in range(1, len(ids)):
        d = pl[pos]
        own = d[str(ids[pos])]
        assert own["rank"] >= 1 and own["logprob"] <= 0, d
        ranked = sorted((v for v in d.values()), key=lambda v: v["rank"])
        values = [v["logprob"] for v in ranked]
        assert values == sorted(values, reverse=True), d
    print("prompt_logprobs: one dict per prompt position after the first, ranks in order")


def check_echo(base):
    for prompt in PROMPTS:
        status, r = post(base + "/v1/completions",
                         {"prompt": prompt, "max_tokens": 8, "temperature": 0, "logprobs": 1,
                          "return_token_ids": True})
        assert status == 200, r
        completion = r["choices"][0]
        want = completion["logprobs"]["token_logprobs"]
        out_ids = completion["token_ids"]
        # lm-evaluation-harness: score prompt + completion (as token ids, so
        # the tokens are the same), one more token generated.
        status, e = post(base + "/v1/completions",
                         {"prompt": completion["prompt_token_ids"] + out_ids, "max_tokens": 1,
                          "temperature": 0, "logprobs": 1, "echo": True})
        assert status == 200, e
        lp = e["choices"][0]["logprobs"]
        p = len(completion["prompt_token_ids"])
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None, lp
        got = lp["token_logprobs"][p:p + len(out_ids)]
        assert len(got) == len(want), (got, want)
        for i, (a, b) in enumerate(zip(got, want)):
            assert math.isclose(a, b, abs_tol=TOL), (prompt, i, a, b)
        # max_tokens 0 (echo without generation): the same prompt scores,
        # and nothing generated.
        status, z = post(base + "/v1/completions",
                         {"prompt": completion["prompt_token_ids"] + out_ids, "max_tokens": 0,
                          "temperature": 0, "logprobs": 1, "echo": True})
        assert status == 200, z
        assert z["usage"]["completion_tokens"] == 0, z["usage"]
        zl = z["choices"][0]["logprobs"]["token_logprobs"]
        assert len(zl) == p + len(out_ids), (len(zl), p, len(out_ids))
        assert zl[0] is None, zl
        for i, (a, b) in enumerate(zip(zl[1:], lp["token_logprobs"][1:len(zl)])):
            assert math.isclose(a, b, abs_tol=TOL), (prompt, i, a, b)
        assert z["choices"][0]["text"] == e["choices"][0]["text"][:len(z["choices"][0]["text"])]
    print(f"echo: scoring prompt + completion gives the completion's logprobs within {TOL}; "
          "max_tokens 0 gives the prompt's alone")


def main():
    build, shared = sys.argv[1], sys.argv[2]
    models = os.path.join(shared, "models")
    tandem = os.path.join(build, "tools", "cli", "tandem")
    tmp = tempfile.mkdtemp(prefix="tandem-logprobs-test-")
    proc, url = start(tandem, models, free_port(), os.path.join(tmp, "serve.log"))
    base = url[:-3] if url.endswith("/v1") else url
    try:
        check_greedy(base)
        check_chat(base)
        check_prompt_logprobs(base)
        check_echo(base)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    print("OK")


if __name__ == "__main__":
    main()
