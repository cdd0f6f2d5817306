#!/bin/sh
# The GPU path end to end (ctest label `gpu`): `ringmaster local --np N --gpus` with N = the visible
# GPUs, running gpu_collectives_check on every rank. Exits 77 (skipped) without a GPU.
#   gpu_whole_path.sh BIN_DIR [PROFILE]
bin=$1
profile=${2:-$(dirname "$0")/../../../bench/profiles/resnet50.json}
# RINGMASTER_GPUS overrides the count (the fake CUDA runtime's test: tests/fake_cuda).
n=${RINGMASTER_GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
if [ "${n:-0}" -eq 0 ]; then
  echo "no GPU: skipped"
  exit 77
fi
exec timeout "${GPU_WHOLE_PATH_TIMEOUT:-300}" "$bin/ringmaster" local --np "$n" --gpus --start-timeout-seconds 60 -- \
  "$bin/gpu_collectives_check" "$profile"
