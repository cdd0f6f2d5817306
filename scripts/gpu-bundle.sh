#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh --bundle needs into .gpu-bundle/ (git-ignored): the GPU tests, the
# GPU benchmark, and the whole path's programs (ringmaster, ringmaster-coordinator,
# ringmaster-worker, gpu_collectives_check), stripped, with the shared libraries they use that a GPU
# machine without Debian's build dependencies lacks (gRPC, protobuf, Abseil, Gloo, spdlog, the CUDA
# runtime, ...), and the benchmark's profile. NCCL itself (over 200 MB) and the C/C++ runtime are
# expected on the GPU machine. Builds the programs first when needed. About 75 MB, and packed as
# DIR.tar.xz too (about 20 MB).
#
# With a Python that has its development headers (RINGMASTER_BUNDLE_PYTHON, by default python3.12
# from PATH or pyenv: the GPU machines' PyTorch runs on 3.12), the ringmaster Python package is built
# for it too (in build/bundle-python/) and goes in python/, with tests/python/torch_device_checks.py:
# gpu-check.sh then runs ringmaster.torch on CUDA tensors with that machine's PyTorch.
#   scripts/gpu-bundle.sh [DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/.gpu-bundle}
jobs=${RINGMASTER_BUILD_JOBS:-2}
targets="nccl_mapping_test gpu_kernels_test nccl_backend_test fusion_layout_test watchdog_test
  ringmaster-gpu-bench ringmaster ringmaster-coordinator ringmaster-worker gpu_collectives_check"
# shellcheck disable=SC2086
cmake --build "$root/build" -j "$jobs" --target $targets >/dev/null
python=""
for candidate in ${RINGMASTER_BUNDLE_PYTHON:-} /usr/bin/python3.12 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12 \
    "$(command -v python3.12 || true)"; do
  if [[ -x $candidate ]] && "$candidate" -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' 2>/dev/null; then
    python=$candidate
    break
  fi
done
module=""
if [[ -n $python ]]; then
  export CCACHE_BASEDIR=$root  # the objects the main build compiled are cache hits
  cmake -S "$root" -B "$root/build/bundle-python" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DRINGMASTER_BUILD_TESTS=OFF -DPython_EXECUTABLE="$python" >/dev/null
  cmake --build "$root/build/bundle-python" -j "$jobs" --target ringmaster_python >/dev/null
  module=$(ls "$root"/build/bundle-python/python/ringmaster/_ringmaster*.so)
else
  echo "gpu-bundle.sh: no Python 3.12 with headers (set RINGMASTER_BUNDLE_PYTHON): the bundle has no Python package" >&2
fi
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/profiles" "$out/tests"
for t in $targets; do
  cp "$root/build/bin/$t" "$out/bin/"
  strip --strip-debug "$out/bin/$t"
done
cp "$root/bench/profiles/resnet50.json" "$out/profiles/"
cp "$root/tests/worker/gpu/gpu_whole_path.sh" "$out/tests/"
needs="$(for t in $targets; do echo "$root/build/bin/$t"; done)"
# The worker's GPU data plane, where the worker looks for it (<bin>/../lib/ringmaster).
mkdir -p "$out/lib/ringmaster"
cp "$root/build/lib/ringmaster/libringmaster_cuda.so" "$out/lib/ringmaster/"
strip --strip-debug "$out/lib/ringmaster/libringmaster_cuda.so"
needs="$needs $root/build/lib/ringmaster/libringmaster_cuda.so"
if [[ -n $module ]]; then
  # Next to bin/: `ringmaster local` puts <bin>/../python on the ranks' PYTHONPATH.
  mkdir -p "$out/python"
  cp -r "$root/build/bundle-python/python/ringmaster" "$out/python/"
  find "$out/python" -name __pycache__ -prune -exec rm -rf {} +
  strip --strip-debug "$out"/python/ringmaster/_ringmaster*.so
  cp "$root/tests/python/torch_device_checks.py" "$root/tests/python/torch_api_checks.py" "$out/tests/"
  needs="$needs $module"
fi
for f in $needs; do ldd "$f"; done | awk '/=>/ {print $3}' | sort -u |
  grep -v -E '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux[^/]*|libnccl|libpython[^/]*)\.so' |
  while read -r lib; do cp -L "$lib" "$out/lib/"; done
du -sh "$out"
# Packed too: about a quarter of the size, for a GPU machine that is sent at most 64 MiB
# (scripts/gpu-check.sh --bundle DIR.tar.xz unpacks it).
tar -C "$(dirname "$out")" -cJf "$out.tar.xz" "$(basename "$out")"
du -sh "$out.tar.xz"
