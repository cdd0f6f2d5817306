#!/usr/bin/env bash
# A/B of two coordinator builds on the negotiation benchmark, side by side in one run: the runs of
# the two alternate (base, new, base, new, ...), each against a fresh ringmaster-coordinator on
# loopback, with the same simulated-rank client (the new build's), so machine noise hits both alike.
# Prints each run's line and the medians of the step p50s.
#   bench/negotiation_ab.sh --base OTHER_BUILD/bin [--new build/bin] [--ranks 128] [--steps 50]
#                           [--runs 3] [--profile bench/profiles/resnet50.json] [--new-state-dir]
# --new-state-dir runs the new side's coordinator with a fresh --state-dir (the durable job store):
# with --base and --new the same build, it measures what the store costs negotiation.
# To build a base: git worktree add /tmp/base COMMIT && cmake -S /tmp/base -B /tmp/base/build
#   -DRINGMASTER_WITH_CUDA=OFF -DRINGMASTER_BUILD_TESTS=OFF && cmake --build /tmp/base/build -j2
#   --target ringmaster-coordinator
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
new="$root/build/bin"
base=""
ranks=128
steps=50
runs=3
profile="$root/bench/profiles/resnet50.json"
new_state=0
while (($#)); do
  case $1 in
    --base) base=$2; shift 2 ;;
    --new) new=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --profile) profile=$2; shift 2 ;;
    --new-state-dir) new_state=1; shift ;;
    *) echo "negotiation_ab.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ -n $base ]] || { echo "negotiation_ab.sh: --base OTHER_BUILD/bin is required" >&2; exit 2; }
log=$(mktemp)
results=$(mktemp)
states=$(mktemp -d)
pid=""
trap '[[ -n $pid ]] && kill $pid 2>/dev/null; rm -rf "$log" "$results" "$states"' EXIT
for ((run = 1; run <= runs; run++)); do
  for side in base new; do
    dir=$base
    [[ $side == new ]] && dir=$new
    extra=()
    [[ $side == new && $new_state == 1 ]] && extra=(--state-dir "$states/run$run")
    "$dir/ringmaster-coordinator" --listen 127.0.0.1:0 --log-level warning "${extra[@]}" >"$log" 2>&1 &
    pid=$!
    port=""
    for _ in $(seq 100); do
      port=$(sed -n 's/^ringmaster-coordinator listening on port \([0-9]*\)$/\1/p' "$log")
      [[ -n $port ]] && break
      sleep 0.1
    done
    line=$("$new/ringmaster-negotiation-bench" --coordinator "127.0.0.1:$port" --mode grpc \
      --profile "$profile" --ranks "$ranks" --steps "$steps" --warmup 5)
    kill $pid; wait $pid 2>/dev/null || true
    pid=""
    echo "$side  $line"
    echo "$side $(sed -n 's/.*p50= *\([0-9.]*\) ms.*/\1/p' <<<"$line")" >>"$results"
  done
done
/usr/bin/python3 - "$results" <<'PY'
import statistics, sys
p50 = {"base": [], "new": []}
for line in open(sys.argv[1]):
    side, value = line.split()
    p50[side].append(float(value))
b, n = statistics.median(p50["base"]), statistics.median(p50["new"])
print(f"median step p50: base {b:.3f} ms, new {n:.3f} ms, new/base {n / b:.3f} "
      f"({len(p50['new'])} runs each)")
PY
