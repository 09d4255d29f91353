#!/usr/bin/env python3
"""Records llama2.c run.c's encode() of the corpus for tokenizer.bin.

    runc_references.py RUN_C TOKENIZER_BIN > tests/tokenizer/data/runc_encode.json
    runc_references.py --check RUN_C TOKENIZER_BIN   (the CTest check)

RUN_C is llama2.c's run.c (https://github.com/karpathy/llama2.c, MIT; not
committed here: fetch it to regenerate, and configure with
-DTANDEM_LLAMA2C_RUN_C=/path/to/run.c or set LLAMA2C_RUN_C to have CTest's
tokenizer_runc_references check the committed file). The references were
made from the run.c whose sha256 the file's header records. It is compiled
with runc_harness.c, which calls its encode(text, bos=1, eos=0) on every
corpus text; tokenizer_llama2c_test compares our encoder with the result.
The corpus has no NUL characters (run.c takes C strings).

--check regenerates and fails unless the result equals the committed
data/runc_encode.json; it skips (exit 77) when run.c or a C compiler is
missing.
"""
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
committed = os.path.join(here, "..", "data", "runc_encode.json")
SKIP = 77


def generate(cc, run_c, tokenizer_bin):
    texts = json.load(open(os.path.join(here, "..", "data", "corpus.json")))["texts"]
    assert not any("\0" in t for t in texts)
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "runc_harness")
        subprocess.run([cc, "-O2", "-DTESTING", f'-DRUN_C="{os.path.abspath(run_c)}"',
                        os.path.join(here, "runc_harness.c"), "-o", exe, "-lm"], check=True)
        records = b"".join(struct.pack("<I", len(t.encode())) + t.encode() for t in texts)
        out = subprocess.run([exe, tokenizer_bin, "32000"], input=records, capture_output=True,
                             check=True).stdout.decode().splitlines()
    assert len(out) == len(texts), f"{len(out)} lines for {len(texts)} texts"
    sha = hashlib.sha256(open(run_c, "rb").read()).hexdigest()
    header = {"reference": f"llama2.c run.c encode() (sha256 {sha})",
              "tokenizer": "shared/models/tokenizer.bin"}
    cases = [[int(x) for x in line.split()] for line in out]
    text = (json.dumps(header)[:-1] + ',"cases":[\n' + ",\n".join(json.dumps(c) for c in cases) +
            "\n]}\n")
    return text, texts


def check(cc, run_c, tokenizer_bin):
    if not run_c or not os.path.isfile(run_c):
        print(f"runc_references: SKIPPED: no run.c ({run_c!r}); configure with "
              "-DTANDEM_LLAMA2C_RUN_C=/path/to/llama2.c/run.c or set LLAMA2C_RUN_C")
        return SKIP
    if shutil.which(cc) is None:
        print(f"runc_references: SKIPPED: no C compiler ({cc})")
        return SKIP
    fresh, texts = generate(cc, run_c, tokenizer_bin)
    with open(committed, encoding="utf-8") as f:
        old = f.read()
    if fresh == old:
        print(f"runc_references: run.c encodes all {len(texts)} corpus texts as committed")
        return 0
    new_json, old_json = json.loads(fresh), json.loads(old)
    if new_json["reference"] != old_json["reference"]:
        print(f"runc_references: FAILED: {run_c} is not the run.c the references came from:\n"
              f"  committed: {old_json['reference']}\n  given:     {new_json['reference']}",
              file=sys.stderr)
        return 1
    diffs = [i for i, (a, b) in enumerate(zip(new_json["cases"], old_json["cases"])) if a != b]
    if len(new_json["cases"]) != len(old_json["cases"]):
        print(f"runc_references: FAILED: {len(new_json['cases'])} cases, committed "
              f"{len(old_json['cases'])}", file=sys.stderr)
    for i in diffs[:5]:
        print(f"runc_references: FAILED: case {i} {json.dumps(texts[i])}: run.c "
              f"{new_json['cases'][i]}, committed {old_json['cases'][i]}", file=sys.stderr)
    print(f"runc_references: FAILED: {len(diffs)} cases differ from {committed}; regenerate with "
          "tests/tokenizer/tools/runc_references.py RUN_C TOKENIZER_BIN > "
          "tests/tokenizer/data/runc_encode.json and review the diff", file=sys.stderr)
    return 1


def main():
    args = sys.argv[1:]
    cc = os.environ.get("CC") or "cc"
    if args and args[0] == "--check":
        run_c, tokenizer_bin = args[1:3]
        sys.exit(check(cc, run_c or os.environ.get("LLAMA2C_RUN_C", ""), tokenizer_bin))
    run_c, tokenizer_bin = args[0:2]
    sys.stdout.write(generate(cc, run_c, tokenizer_bin)[0])


if __name__ == "__main__":
    main()
