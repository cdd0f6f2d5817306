#!/usr/bin/env bash
# Makes (once) the yardstick environment for bench/mxnet_exchange.py --horovod: MXNet 1.9.1 (as
# scripts/mxnet-venv.sh pins it) with Horovod 0.28.1 built from its PyPI sdist against it, over
# Gloo (no MPI), and prints its python. Horovod is a yardstick outside the project, not a
# dependency: nothing else uses this environment.
#
#   bench/horovod-mxnet.sh              build/horovod-mxnet-venv (about 5 minutes on 2 cores)
#   RINGMASTER_HOROVOD_VENV=DIR         somewhere else
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${RINGMASTER_HOROVOD_VENV:-$root/build/horovod-mxnet-venv}
python=$(RINGMASTER_MXNET_VENV=$venv "$root/scripts/mxnet-venv.sh")
if "$python" -c "import horovod.mxnet as hvd; assert hvd.gloo_built()" 2>/dev/null; then
  echo "$python"
  exit 0
fi
"$python" -m pip install --quiet --disable-pip-version-check --no-input wheel "cmake<3.28" \
  cloudpickle psutil pyyaml packaging >&2
# Built against the MXNet installed above (no build isolation), with Gloo and without MPI, CUDA
# or the other frameworks.
HOROVOD_WITH_MXNET=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
  HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_CPU_OPERATIONS=GLOO MAKEFLAGS=-j2 \
  "$python" -m pip install --disable-pip-version-check --no-input --no-build-isolation \
  --no-cache-dir --no-binary horovod horovod==0.28.1 >&2
"$python" -m pip install --quiet --disable-pip-version-check --no-input numpy==1.23.5 >&2
"$python" -c "import horovod.mxnet as hvd; assert hvd.gloo_built()" >&2
echo "$python"
