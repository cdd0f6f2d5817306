#!/usr/bin/env bash
# The main job, on one machine: `ringmaster local` starts a coordinator and 4 worker daemons on two
# simulated hosts, and runs a 4-rank job that allreduces ResNet-50's 161 gradient tensors every step
# through the whole path (client -> daemon -> coordinator negotiation -> fused Gloo allreduce),
# printing its throughput beside raw Gloo on one buffer of the same bytes, timed in the same job.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
RINGMASTER_CMAKE_ARGS=${RINGMASTER_CMAKE_ARGS:-} "$root/scripts/build.sh" >/dev/null
bin="$root/build/bin"
np=${NP:-4}
steps=${STEPS:-10}

echo "\$ ringmaster local --np $np --processes-per-host 2 -- ringmaster-bench --profile bench/profiles/resnet50.json --steps $steps"
"$bin/ringmaster" local --np "$np" --processes-per-host 2 -- \
  "$bin/ringmaster-bench" --profile "$root/bench/profiles/resnet50.json" --steps "$steps" --warmup 2
echo
echo "\$ ringmaster local --np 2 -- collectives_check   # every collective x dtype against an exact reference"
"$bin/ringmaster" local --np 2 -- "$bin/collectives_check"
