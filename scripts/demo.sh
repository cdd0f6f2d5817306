#!/usr/bin/env bash
# The main job, on one machine: starts a coordinator, drives jobs through the `ringmaster` CLI, and has
# simulated worker daemons negotiate ResNet-50's 161 gradient tensors every step over real gRPC
# session streams, printing the negotiation throughput. (The worker daemon that executes the
# collectives with Gloo/NCCL is the next milestone; this runs everything the coordinator does.)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
RINGMASTER_CMAKE_ARGS=-DRINGMASTER_BUILD_TESTS=OFF "$root/scripts/build.sh" >/dev/null
bin="$root/build/bin"
np=${NP:-4}
steps=${STEPS:-200}

log=$(mktemp)
"$bin/ringmaster-coordinator" --listen 127.0.0.1:0 --log-level info >"$log" 2>&1 &
coordinator=$!
trap 'kill -TERM $coordinator 2>/dev/null || true; wait $coordinator 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 100); do
  port=$(sed -n 's/^ringmaster-coordinator listening on port \([0-9]*\)$/\1/p' "$log")
  [[ -n $port ]] && break
  sleep 0.1
done
[[ -n ${port:-} ]] || { cat "$log" >&2; echo "demo: the coordinator did not start" >&2; exit 1; }
export RINGMASTER_COORDINATOR=127.0.0.1:$port
rm_cli() { echo "\$ ringmaster $*"; "$bin/ringmaster" "$@"; echo; }

echo "== coordinator on $RINGMASTER_COORDINATOR"
echo "\$ ringmaster submit --np 2 --name waiting-job --fusion-threshold-mb 32 --cycle-time-ms 5 -- python3 train.py"
waiting=$("$bin/ringmaster" submit --np 2 --name waiting-job --fusion-threshold-mb 32 --cycle-time-ms 5 -- python3 train.py)
echo "$waiting"; echo
rm_cli jobs
rm_cli cancel "${waiting%% *}" --reason "no workers in this demo step"

echo "== $np simulated workers ($((np / 2)) hosts) negotiate ResNet-50 for $steps steps"
"$bin/ringmaster-negotiation-bench" --coordinator "$RINGMASTER_COORDINATOR" --mode grpc \
  --ranks "$np" --processes-per-host 2 --steps "$steps" --warmup 10 \
  --profile "$root/bench/profiles/resnet50.json"
echo
rm_cli jobs
rm_cli status "$("$bin/ringmaster" jobs --state SUCCEEDED | awk 'NR == 2 {print $1}')"
