#!/usr/bin/env bash
# Installs, from Debian 12's packages, whatever Ringmaster's build, tests and demo need and the machine
# lacks. Idempotent: a machine that has everything makes no apt call at all.
#   install-deps.sh            build, tests, demo, the Python package (ringmaster.torch) and its examples
#   install-deps.sh --bench    the same (accepted for compatibility: PyTorch is always installed now)
set -euo pipefail

packages=(
  build-essential cmake ccache pkg-config git clang-format clang
  libgrpc++-dev protobuf-compiler-grpc protobuf-compiler libprotobuf-dev
  libabsl-dev libspdlog-dev libfmt-dev nlohmann-json3-dev libssl-dev openssl
  libgtest-dev libgmock-dev
  libgloo-dev libcpp-httplib-dev prometheus libsqlite3-dev sqlite3 libarchive-dev etcd-server etcd-client
  python3 python3-grpc-tools python3-grpcio python3-protobuf python3-pytest python3-pip
  pybind11-dev python3-dev python3-torch python3-torchvision
  iproute2 procps
)

# kubectl renders the Kubernetes manifests in the tests: Debian's kubernetes-client unless a kubectl
# is installed already (from Kubernetes' own packages, which would conflict with it).
if ! command -v kubectl >/dev/null 2>&1; then packages+=(kubernetes-client); fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

echo "install-deps: installing ${missing[*]}" >&2
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
