#!/usr/bin/env bash
# Installs, from Debian 12's packages, whatever Ringmaster's build, tests and demo need and the machine
# lacks. Idempotent: a machine that has everything makes no apt call at all.
#   install-deps.sh            build, tests, demo, the Python package (ringmaster.torch) and its examples
#   install-deps.sh --bench    the same (accepted for compatibility: PyTorch is always installed now)
#   install-deps.sh --build    only what building the binaries, the Python package and the .deb needs
#                              (no tests, no PyTorch): the container image's build stage
set -euo pipefail

# Compiling and packaging (cmake -DRINGMASTER_BUILD_TESTS=OFF, cpack).
packages=(
  build-essential cmake pkg-config file dpkg-dev
  libgrpc++-dev protobuf-compiler-grpc protobuf-compiler libprotobuf-dev
  libabsl-dev libspdlog-dev libfmt-dev nlohmann-json3-dev libssl-dev
  libgloo-dev libcpp-httplib-dev libsqlite3-dev libarchive-dev
  python3 python3-grpc-tools pybind11-dev python3-dev
)

if [[ ${1:-} != --build ]]; then
  # The tests, the demo and their real components: etcd, Prometheus, PyTorch, network namespaces,
  # podman and debootstrap for the container image (its test skips, saying why, where podman cannot
  # run containers).
  packages+=(
    ccache git clang-format clang openssl libgtest-dev libgmock-dev
    prometheus sqlite3 etcd-server etcd-client
    python3-grpcio python3-protobuf python3-pytest python3-pip python3-venv python3-yaml
    python3-boto3
    python3-torch python3-torchvision
    iproute2 procps
    podman runc catatonit netavark aardvark-dns iptables debootstrap uidmap
  )
  # kubectl renders the Kubernetes manifests in the tests: Debian's kubernetes-client unless a
  # kubectl is installed already (from Kubernetes' own packages, which would conflict with it).
  if ! command -v kubectl >/dev/null 2>&1; then packages+=(kubernetes-client); fi
fi

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
