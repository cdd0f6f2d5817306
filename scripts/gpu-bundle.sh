#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh --bundle needs into .gpu-bundle/ (git-ignored): the GPU test and
# benchmark binaries from build/, the shared libraries they use that a GPU machine without Debian's
# build dependencies lacks (Abseil, the CUDA runtime), and the benchmark's profile. A few MB; NCCL
# itself (over 200 MB) is expected on the GPU machine. Builds them first when needed.
#   scripts/gpu-bundle.sh [DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/.gpu-bundle}
targets="nccl_mapping_test gpu_kernels_test nccl_backend_test fusion_layout_test watchdog_test ringmaster-gpu-bench"
# shellcheck disable=SC2086
cmake --build "$root/build" -j "${RINGMASTER_BUILD_JOBS:-2}" --target $targets >/dev/null
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/profiles"
for t in $targets; do cp "$root/build/bin/$t" "$out/bin/"; done
cp "$root/bench/profiles/resnet50.json" "$out/profiles/"
for t in $targets; do ldd "$root/build/bin/$t"; done | awk '/=>/ {print $3}' | sort -u |
  grep -E 'libabsl_|libcudart|libspdlog|libfmt|libgtest|libgmock' | while read -r lib; do
    cp -L "$lib" "$out/lib/"
  done
du -sh "$out"
