#!/usr/bin/env bash
# Autotune benchmark, as recorded in docs/benchmarks.md: does autotune, started from a poor setting
# (fusion threshold 64 KiB), end within 10 % of the best hand-picked setting on the ResNet-50 profile?
#
# In one run, on the same ranks of this machine, `--repeats` times each:
#   - hand-picked: ringmaster-bench with each fusion threshold of --thresholds (MiB) and cycle time
#     1 ms, autotune off;
#   - autotune: --autotune --fusion-threshold-bytes 65536 --autotune-start-from-given (Horovod's
#     defaults otherwise: 3 warm-up samples, 10 steps per sample, 20 samples), running --steps
#     steps and measuring only the last --measure-last (after tuning has settled).
# Prints the medians as bytes allreduced per second and the ratio autotune / best hand-picked, and
# the autotune logs (CSV) of the last repeat.
#   bench/autotune.sh [--np 2] [--repeats 3] [--profile resnet50] [--thresholds "1 4 16 32 64 128"]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/build/bin"
np=2
repeats=3
profile=resnet50
thresholds="1 4 16 32 64 128"
steps=320
measure_last=60
while (($#)); do
  case $1 in
    --np) np=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --profile) profile=$2; shift 2 ;;
    --thresholds) thresholds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --measure-last) measure_last=$2; shift 2 ;;
    *) echo "autotune.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ -x $bin/ringmaster-bench ]] || "$root/scripts/build.sh" >/dev/null
json="$root/bench/profiles/$profile.json"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
out="$work/results"
for ((i = 0; i < repeats; i++)); do
  for mb in $thresholds; do
    "$bin/ringmaster" local --np "$np" --fusion-threshold-mb "$mb" --cycle-time-ms 1 -- \
      "$bin/ringmaster-bench" --profile "$json" --steps 20 --warmup 3 --baseline=false --json \
      | sed "s/^\[0\] //; s/\"system\":\"ringmaster\"/\"system\":\"fusion-${mb}MiB\"/" >>"$out"
  done
  mkdir -p "$work/run$i"
  (cd "$work/run$i" && "$bin/ringmaster" local --np "$np" --autotune --fusion-threshold-bytes 65536 \
    --autotune-start-from-given --autotune-log-file autotune.csv -- \
    "$bin/ringmaster-bench" --profile "$json" --steps "$steps" --warmup 0 \
    --measure-last "$measure_last" --baseline=false --json 2>/dev/null) \
    | sed 's/^\[0\] //; s/"system":"ringmaster"/"system":"autotune-from-64KiB"/' >>"$out"
done
/usr/bin/python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
by = {}
for r in rows:
    by.setdefault(r["system"], []).append(r["bytes_per_step"] / r["step_time_s_median"])
med = {k: statistics.median(v) for k, v in by.items()}
hand = {k: v for k, v in med.items() if k.startswith("fusion-")}
best = max(hand, key=hand.get)
print(f"{'setting':24} {'GB/s allreduced (median)':>26}  runs")
for k in sorted(hand, key=lambda k: float(k[7:-3])) + ["autotune-from-64KiB"]:
    print(f"{k:24} {med[k] / 1e9:>26.3f}  {len(by[k])}")
ratio = med["autotune-from-64KiB"] / hand[best]
print(f"autotune / best hand-picked ({best}): {ratio:.3f} -> {'within' if ratio >= 0.9 else 'NOT within'} 10 %")
PY
for ((i = 0; i < repeats; i++)); do
  echo "autotune log, repeat $i:"
  cat "$work/run$i/autotune.csv"
done
