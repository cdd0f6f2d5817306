#!/usr/bin/env bash
# What worker metrics cost the data path: ringmaster-bench (ResNet-50, np 2) with the engine
# recording metrics and with RINGMASTER_WORKER_METRICS=off, interleaved in one run, medians compared.
#   bench/metrics_cost.sh [--repeats 5] [--profile bench/profiles/resnet50.json]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
repeats=5
profile="$root/bench/profiles/resnet50.json"
while (($#)); do
  case $1 in
    --repeats) repeats=$2; shift 2 ;;
    --profile) profile=$2; shift 2 ;;
    *) echo "metrics_cost.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
on=() off=()
run() {
  "$root/build/bin/ringmaster" local --np 2 -- "$root/build/bin/ringmaster-bench" --profile "$profile" \
    --steps 10 --warmup 2 --baseline=false --json | sed -n 's/.*"step_time_s_median":\([0-9.]*\).*/\1/p'
}
for ((i = 0; i < repeats; i++)); do
  on+=("$(RINGMASTER_WORKER_METRICS=on run)")
  off+=("$(RINGMASTER_WORKER_METRICS=off run)")
done
/usr/bin/python3 - "${on[*]}" "${off[*]}" <<'PY'
import statistics, sys
on = [float(x) for x in sys.argv[1].split()]
off = [float(x) for x in sys.argv[2].split()]
a, b = statistics.median(on), statistics.median(off)
print(f"metrics on : {' '.join(f'{x*1e3:.1f}' for x in on)} ms -> median {a*1e3:.1f} ms")
print(f"metrics off: {' '.join(f'{x*1e3:.1f}' for x in off)} ms -> median {b*1e3:.1f} ms")
print(f"cost of metrics: {(a / b - 1) * 100:+.2f} % of the step (medians of {len(on)} interleaved runs)")
PY
