#!/usr/bin/env bash
# Two builds of Ringmaster side by side, alternating in one run (a change's before and after): the
# ResNet-50 step of `ringmaster local --np 2 -- ringmaster-bench` and its 4-byte allreduce latency,
# through each build's own `ringmaster`, `ringmaster-worker`, `ringmaster-coordinator` and
# `ringmaster-bench` (copy those four aside before the change). Prints each run, then the medians.
#   bench/ab_data_plane.sh BEFORE_BIN_DIR [AFTER_BIN_DIR (default build/bin)] [--runs 5] [--steps 10]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
before=${1:?usage: bench/ab_data_plane.sh BEFORE_BIN_DIR [AFTER_BIN_DIR] [--runs N] [--steps N]}
shift
after="$root/build/bin"
if (($#)) && [[ $1 != --* ]]; then after=$1; shift; fi
runs=5
steps=10
while (($#)); do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    *) echo "ab_data_plane.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for ((i = 1; i <= runs; i++)); do
  for which in before after; do
    bin=$before
    [[ $which == after ]] && bin=$after
    step=$("$bin/ringmaster" local --np 2 -- "$bin/ringmaster-bench" \
      --profile "$root/bench/profiles/resnet50.json" --steps "$steps" --warmup 2 --baseline=false \
      --json 2>/dev/null | sed 's/^\[0\] //' | grep '"system":"ringmaster"' | head -1 |
      python3 -c 'import sys, json; print(round(json.loads(sys.stdin.readline())["step_time_s_median"] * 1000, 2))')
    p50=$("$bin/ringmaster" local --np 2 -- "$bin/ringmaster-bench" --latency-iterations 2000 \
      --json 2>/dev/null | sed 's/^\[0\] //' | grep '"bench":"latency"' | head -1 |
      python3 -c 'import sys, json; print(json.loads(sys.stdin.readline())["p50_ms"])')
    echo "$which run $i: resnet50 step $step ms, 4-byte p50 $p50 ms"
    echo "$which $step $p50" >>"$out"
  done
done
python3 - "$out" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
med = {w: (statistics.median(float(r[1]) for r in rows if r[0] == w),
           statistics.median(float(r[2]) for r in rows if r[0] == w)) for w in ("before", "after")}
print(f"medians: step before {med['before'][0]:.2f} ms, after {med['after'][0]:.2f} ms "
      f"(after/before {med['after'][0] / med['before'][0]:.3f}); 4-byte p50 before "
      f"{med['before'][1]:.4f} ms, after {med['after'][1]:.4f} ms "
      f"(after/before {med['after'][1] / med['before'][1]:.3f})")
PY
