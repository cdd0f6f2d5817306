#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh --bundle needs into .gpu-bundle/ (git-ignored): the GPU tests, the
# GPU benchmark, and the whole path's programs (ringmaster, ringmaster-coordinator,
# ringmaster-worker, gpu_collectives_check), stripped, with the shared libraries they use that a GPU
# machine without Debian's build dependencies lacks (gRPC, protobuf, Abseil, Gloo, spdlog, the CUDA
# runtime, ...), and the benchmark's profile. NCCL itself (over 200 MB) and the C/C++ runtime are
# expected on the GPU machine. Builds the programs first when needed. About 50 MB.
#   scripts/gpu-bundle.sh [DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/.gpu-bundle}
targets="nccl_mapping_test gpu_kernels_test nccl_backend_test fusion_layout_test watchdog_test
  ringmaster-gpu-bench ringmaster ringmaster-coordinator ringmaster-worker gpu_collectives_check"
# shellcheck disable=SC2086
cmake --build "$root/build" -j "${RINGMASTER_BUILD_JOBS:-2}" --target $targets >/dev/null
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/profiles" "$out/tests"
for t in $targets; do
  cp "$root/build/bin/$t" "$out/bin/"
  strip --strip-debug "$out/bin/$t"
done
cp "$root/bench/profiles/resnet50.json" "$out/profiles/"
cp "$root/tests/worker/gpu/gpu_whole_path.sh" "$out/tests/"
for t in $targets; do ldd "$root/build/bin/$t"; done | awk '/=>/ {print $3}' | sort -u |
  grep -v -E '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux[^/]*|libnccl)\.so' |
  while read -r lib; do cp -L "$lib" "$out/lib/"; done
du -sh "$out"
