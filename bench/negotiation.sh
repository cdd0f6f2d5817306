#!/usr/bin/env bash
# Negotiation benchmark, as recorded in docs/benchmarks.md: the logic alone (N ranks in one process),
# then N simulated workers against a coordinator in its own process, reporting the coordinator's own
# CPU time and its threads' context switches over the measured steps (read from /proc by the
# benchmark; a coordinator is started for each run) next to the wall-clock step time (client and server share this machine's cores,
# unless --coordinator-cpus and --client-cpus give each its own: taskset lists such as 0-3).
# The simulated ranks run on gRPC's callback client API (--clients callback, little client CPU), or
# with two threads each (--clients threads, as bench/sim_worker.h). With callback clients each count
# runs twice: every rank with messages of its own, then with a negotiation relay per host (grpc-relay).
#   bench/negotiation.sh [--profile bench/profiles/resnet50.json] [--ranks 2,16,128,1024] [--steps 50]
#                        [--clients callback|threads] [--coordinator-cpus LIST --client-cpus LIST]
#                        [--per-host N] [--relay-hosts H]
# --relay-hosts H: the relayed runs have one relay for every H simulated hosts (the job knob
# negotiation_relay_hosts), reported as grpc-relay-hH.
# With callback clients each line also has answer-p50: from the step's last message handed to gRPC
# to its last answer, the coordinator's part of the step's wall clock (the simulated ranks' own work
# of preparing their batches, which real ranks do in parallel on their hosts, is not in it).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${RINGMASTER_BIN_DIR:-$root/build/bin}
profile="$root/bench/profiles/resnet50.json"
ranks="2,16,128,1024"
steps=50
clients=callback
coordinator_cpus=""
per_host=8
relay_hosts=1
client_cpus=""
while (($#)); do
  case $1 in
    --coordinator-cpus) coordinator_cpus=$2; shift 2 ;;
    --per-host) per_host=$2; shift 2 ;;
    --relay-hosts) relay_hosts=$2; shift 2 ;;
    --client-cpus) client_cpus=$2; shift 2 ;;
    --profile) profile=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    *) echo "negotiation.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ -x $bin/ringmaster-negotiation-bench ]] || "$root/scripts/build.sh" >/dev/null
[[ -n $coordinator_cpus || -n $client_cpus ]] && ! command -v taskset >/dev/null &&
  { echo "negotiation.sh: --coordinator-cpus/--client-cpus need taskset (util-linux)" >&2; exit 2; }

echo "# logic (Negotiator alone), response cache on, then off"
"$bin/ringmaster-negotiation-bench" --mode logic --profile "$profile" --ranks "$ranks" --steps "$steps"
"$bin/ringmaster-negotiation-bench" --mode logic --profile "$profile" --ranks "$ranks" --steps "$steps" \
  --cache-capacity 0

echo "# grpc (simulated workers -> ringmaster-coordinator process on loopback)"
log=$(mktemp)
pid=""
trap 'if [[ -n $pid ]]; then kill $pid 2>/dev/null || true; fi; rm -f "$log"' EXIT
coordinator_taskset=()
client_taskset=()
[[ -n $coordinator_cpus ]] && coordinator_taskset=(taskset -c "$coordinator_cpus")
[[ -n $client_cpus ]] && client_taskset=(taskset -c "$client_cpus")
IFS=, read -ra counts <<<"$ranks"
# One run of `s` measured steps against a coordinator started for it; the benchmark reads the
# coordinator's CPU time (/proc/PID/stat) over the measured steps alone.
run() {
  "${coordinator_taskset[@]}" "$bin/ringmaster-coordinator" --listen 127.0.0.1:0 >"$log" 2>&1 &
  pid=$!
  local port=""
  for _ in $(seq 100); do
    port=$(sed -n 's/^ringmaster-coordinator listening on port \([0-9]*\)$/\1/p' "$log")
    [[ -n $port ]] && break
    sleep 0.1
  done
  "${client_taskset[@]}" "$bin/ringmaster-negotiation-bench" --coordinator "127.0.0.1:$port" \
    --coordinator-pid "$pid" --mode grpc --clients "$clients" --profile "$profile" --ranks "$1" \
    --steps "$2" --warmup 5 --processes-per-host "$per_host" "${@:3}"
  kill $pid
  wait $pid 2>/dev/null || true
  pid=""
}
# Each count twice: every rank with its own messages, then through a negotiation relay per host
# of --per-host ranks, 8 by default (--relay: one RelayedBatches and one RelayedResponses per host
# and step).
for relay in "" --relay; do
  [[ $clients == threads && -n $relay ]] && continue
  for n in "${counts[@]}"; do
    s=$steps
    ((n > 128)) && s=$((steps / 5 > 5 ? steps / 5 : 5))
    if [[ -n $relay ]]; then
      run "$n" "$s" --relay --relay-hosts "$relay_hosts"
    else
      run "$n" "$s"
    fi
  done
done
