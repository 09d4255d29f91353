#!/usr/bin/python3
"""The image recipe (deploy/docker/Dockerfile), checked without Docker.

  1. The runtime base's glibc, stated once in the Dockerfile (ARG
     RUNTIME_GLIBC), is what that base ships (a table of known bases below),
     and the build stage's base is the same release, so binaries built there
     load in the runtime stage.
  2. The built binaries (BUILD_DIR, built on CI's Debian 12 as the image's
     build stage is) need no GLIBC_ symbol version newer than RUNTIME_GLIBC
     (objdump -T).
  3. The default build and the chart agree: the default image has the CUDA
     kernels (ARG CUDA=ON) exactly when the chart's default backend is cuda.

Usage: image_test.py BUILD_DIR SOURCE_DIR
"""
import glob
import os
import re
import subprocess
import sys

import yaml

# glibc of the bases the Dockerfile may name, by release (Debian and Ubuntu
# package versions of libc6).
GLIBC_OF_RELEASE = {
    "bullseye": "2.31", "bookworm": "2.36", "trixie": "2.41",
    "ubuntu20.04": "2.31", "ubuntu22.04": "2.35", "ubuntu24.04": "2.39",
}


def version(v):
    return tuple(int(x) for x in v.split("."))


def dockerfile_args(text):
    """ARG NAME=default lines, each name once."""
    args = {}
    for name, value in re.findall(r"^ARG\s+([A-Z_]+)=(\S+)\s*$", text, re.M):
        assert name not in args, f"ARG {name} has two defaults"
        args[name] = value
    return args


def release_of(image):
    """debian:bookworm-slim -> bookworm; nvidia/cuda:13.0.0-devel-ubuntu24.04
    -> ubuntu24.04; ubuntu:24.04 -> ubuntu24.04."""
    repo, _, tag = image.partition(":")
    if repo.endswith("ubuntu"):
        return "ubuntu" + tag.split("-")[0]
    m = re.search(r"(ubuntu\d+\.\d+)", tag)
    if m:
        return m.group(1)
    for release in GLIBC_OF_RELEASE:
        if re.search(rf"(^|-){release}($|-)", tag):
            return release
    raise AssertionError(f"{image}: unknown release; add it to GLIBC_OF_RELEASE")


def glibc_needed(binary):
    out = subprocess.run(["objdump", "-T", binary], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    versions = set(re.findall(r"\bGLIBC_(\d+(?:\.\d+)+)\b", out.stdout))
    assert versions, f"{binary}: no GLIBC_ symbols (not dynamically linked?)"
    return max(versions, key=version)


def main():
    build_dir, source_dir = sys.argv[1], sys.argv[2]
    with open(os.path.join(source_dir, "deploy", "docker", "Dockerfile")) as f:
        text = f.read()
    args = dockerfile_args(text)
    for name in ("BASE", "RUNTIME_BASE", "RUNTIME_GLIBC", "CUDA"):
        assert name in args, f"the Dockerfile has no ARG {name}=..."
    runtime_glibc = args["RUNTIME_GLIBC"]

    # 1.
    build_release, runtime_release = release_of(args["BASE"]), release_of(args["RUNTIME_BASE"])
    assert GLIBC_OF_RELEASE[runtime_release] == runtime_glibc, \
        f"RUNTIME_GLIBC={runtime_glibc}, but {args['RUNTIME_BASE']} ships glibc " \
        f"{GLIBC_OF_RELEASE[runtime_release]}"
    assert version(GLIBC_OF_RELEASE[build_release]) <= version(runtime_glibc), \
        f"the build stage ({args['BASE']}, glibc {GLIBC_OF_RELEASE[build_release]}) is newer " \
        f"than the runtime ({args['RUNTIME_BASE']}, glibc {runtime_glibc})"
    assert "io.tandem.runtime-glibc=\"${RUNTIME_GLIBC}\"" in text, "the label states the glibc"
    print(f"Dockerfile: build stage {args['BASE']} ({build_release}), runtime "
          f"{args['RUNTIME_BASE']} ({runtime_release}, glibc {runtime_glibc})")

    # 2.
    binaries = sorted(glob.glob(os.path.join(build_dir, "services", "*", "tandem-*"))
                      + glob.glob(os.path.join(build_dir, "tools", "cli", "tandem")))
    binaries = [b for b in binaries if os.access(b, os.X_OK) and os.path.isfile(b)]
    assert len(binaries) >= 4, f"built binaries not found under {build_dir}: {binaries}"
    for b in binaries:
        need = glibc_needed(b)
        assert version(need) <= version(runtime_glibc), \
            f"{b} needs GLIBC_{need}, the runtime base ({args['RUNTIME_BASE']}) has {runtime_glibc}"
        print(f"{os.path.relpath(b, build_dir)}: needs GLIBC_{need} <= {runtime_glibc}")

    # 3.
    with open(os.path.join(source_dir, "deploy", "helm", "tandem", "values.yaml")) as f:
        backend = yaml.safe_load(f)["worker"]["backend"]
    cuda_default = args["CUDA"] == "ON"
    assert cuda_default == (backend == "cuda"), \
        f"the default image is built with CUDA={args['CUDA']}, the chart's default backend is " \
        f"{backend}: they must agree (deploy/README.md)"
    print(f"default image CUDA={args['CUDA']}, chart default backend {backend}: they agree")
    print("image_test: OK")


if __name__ == "__main__":
    main()
