#!/usr/bin/env bash
# Makes (once) the virtual environment that ringmaster.mxnet runs in, and prints its python.
#
#   scripts/mxnet-venv.sh              MXNet 1.9.1 (CPU wheel) with numpy 1.23.5; boto3, grpcio and
#                                      protobuf (a notebook here runs ringmaster.sagemaker's jobs and
#                                      s3:// channels and output)
#   scripts/mxnet-venv.sh --gluoncv    the same, plus gluoncv 0.10.5 and what it needs
#   RINGMASTER_MXNET_VENV=DIR          where to make it (default: build/mxnet-venv)
#
# MXNet is not in Debian and MXNet 1.9.1 needs numpy < 1.24 (it uses np.bool, which 1.24 removed),
# while Debian's PyTorch needs numpy 1.24: MXNet gets an environment of its own, made from Debian's
# /usr/bin/python3 (so the ringmaster package built for it, ringmaster._ringmaster included, imports
# there too) with the versions pinned below. An environment that has them already is left as it is:
# the second run costs nothing. Needs PyPI (or a mirror through pip's own configuration).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${RINGMASTER_MXNET_VENV:-$root/build/mxnet-venv}
requirements=(mxnet==1.9.1 numpy==1.23.5 "boto3<1.36" "grpcio<1.67" "protobuf>=3.20,<5")
if [[ ${1:-} == --gluoncv ]]; then
  requirements+=(gluoncv==0.10.5 "scipy<1.12" "pandas<2.1" "opencv-python-headless<4.9"
                 "matplotlib<3.9" "Pillow<11")
fi
stamp="$venv/.ringmaster-requirements"  # what was installed, one requirement a line
have_all() {
  [[ -x $venv/bin/python && -f $stamp ]] || return 1
  local r
  for r in "${requirements[@]}"; do grep -qxF -- "$r" "$stamp" || return 1; done
}
if have_all; then
  echo "$venv/bin/python"
  exit 0
fi
if [[ ! -x $venv/bin/python ]]; then
  /usr/bin/python3 -m venv "$venv" >&2
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
  "${requirements[@]}" >&2
# Whatever the resolver did, numpy stays at MXNet's pin.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input numpy==1.23.5 >&2
"$venv/bin/python" -c "import mxnet, numpy; assert numpy.__version__ == '1.23.5'; mxnet.nd.ones(1).asnumpy()" >&2
{ cat "$stamp" 2>/dev/null || true; printf '%s\n' "${requirements[@]}"; } | sort -u > "$stamp.new"
mv "$stamp.new" "$stamp"
echo "$venv/bin/python"
