#!/usr/bin/env bash
# Runs several tools/bench_frontend/run.sh configurations in one go on a
# many-core (GPU) machine, from a --services bundle, and tars the results,
# so that one short device-tool call measures them all:
#
#   here:  PACK=1 tools/gpu/bundle.sh --services     # .gpu and .gpu.tar.xz
#   there, in the checkout's root (the device tool: carry [".gpu.tar.xz"];
#   the unpacked .gpu is 62 MB, too big to travel beside the tree):
#          bash tools/gpu/frontend_sets.sh NAME BACKEND LEVELS REPEAT FE_ARGS PIN EXTRA [...]
#   here:  tar -xzf res.tgz && node tools/bench_frontend/report.mjs res/NAME REPEAT LEVELS...
#
# Seven arguments per configuration: a name; cuda|sim|cpu; the concurrency
# list; pairs per level; more tandem-frontend flags ("" for none); a --pin
# list ("" for none, e.g. "0-1 2-3 4-9 10-15"); more run.sh flags, shell-quoted
# ("--num-requests 8192 --worker-args '--sim-step-us 1750'"). A configuration
# is not started after DEADLINE_S (default 470) seconds, and the tarball
# ($OUT/res.tgz, /tmp/res inside) is rewritten after each, so what ran comes
# back even when the call's limit cuts the last one short.
set -u
# An unpacked .gpu in the current directory is used as it is.
start=$(date +%s)
bundle="${BUNDLE:-.gpu.tar.xz}"
[ -d .gpu ] || tar -xJf "$bundle" || { echo "no bundle: $bundle (run from the checkout's root)" >&2; exit 1; }
out="${OUT:-$PWD/gpu-out}"
mkdir -p /tmp/res "$out"
lscpu > /tmp/res/lscpu.txt 2>&1
nproc; nvidia-smi -L 2>/dev/null || true
while [ $# -ge 7 ]; do
  name="$1" backend="$2" levels="$3" rep="$4" fargs="$5" pin="$6"
  eval "extra=($7)"
  shift 7
  if [ $(( $(date +%s) - start )) -ge "${DEADLINE_S:-470}" ]; then echo "skipped $name (time)"; continue; fi
  t0=$(date +%s)
  echo "=== $name: $backend $levels x$rep frontend [$fargs] pin [$pin] [${extra[*]}]"
  timeout "${SET_TIMEOUT_S:-110}" bash .gpu/run.sh frontend --backend "$backend" --concurrency "$levels" \
    --repeat "$rep" --out-dir "/tmp/res/$name" --frontend-args "$fargs" ${pin:+--pin "$pin"} "${extra[@]}" \
    > "/tmp/res/$name.txt" 2>&1
  echo "rc=$? $(( $(date +%s) - t0 )) s"
  tar -czf "$out/res.tgz" -C /tmp res
done
[ $# -eq 0 ] || { echo "left over (7 arguments per configuration): $*" >&2; exit 2; }
