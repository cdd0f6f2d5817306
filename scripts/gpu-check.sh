#!/usr/bin/env bash
# The GPU check: one command for a machine with NVIDIA GPUs. Builds Release with CUDA into
# build-gpu/ (the GPU targets only), runs the gpu-labelled tests (and the NCCL mapping tests), the
# whole path (ringmaster local --gpus: client -> daemon through CUDA IPC -> NCCL), ringmaster.torch on
# CUDA tensors (tests/python/torch_device_checks.py, when this machine's Python has a PyTorch with
# CUDA and a ringmaster package built for it), then ringmaster-gpu-bench on the ResNet-50 profile —
# the fused allreduce (pack kernel -> NCCL backend -> unpack kernel) against a raw ncclAllReduce of
# the same bytes, and pack/unpack against cudaMemcpy device-to-device — and prints a summary table
# last. World size = the visible GPUs (NCCL refuses two ranks on one GPU). Every stage has a
# deadline (2 to 2.5 minutes), so a hang costs minutes, not the machine. About 5 minutes on one GPU
# when it builds, about one with --bundle.
#
#   scripts/gpu-check.sh                 build here (installs missing Debian packages first)
#   scripts/gpu-check.sh --bundle DIR    run prebuilt binaries from DIR (scripts/gpu-bundle.sh made
#                                        it on a build machine), for GPU machines without the build
#                                        dependencies; NCCL comes from the machine (pip's nvidia-nccl
#                                        or /usr/local/cuda). DIR.tar.xz (gpu-bundle.sh packs it
#                                        too) is unpacked beside itself first
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bundle=""
while (($#)); do
  case $1 in
    --bundle) bundle=$2; shift 2 ;;
    *) echo "gpu-check.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
tests="nccl_mapping_test gpu_kernels_test nccl_backend_test fusion_layout_test watchdog_test"
whole="ringmaster ringmaster-coordinator ringmaster-worker gpu_collectives_check"
start=$(date +%s)
if [[ $bundle == *.tar.xz ]]; then
  packed=$bundle
  bundle=${packed%.tar.xz}
  tar -C "$(dirname "$packed")" -xJf "$packed" || { echo "gpu-check.sh: cannot unpack $packed" >&2; exit 1; }
  [[ -d $bundle ]] || { echo "gpu-check.sh: $packed holds no $(basename "$bundle")/" >&2; exit 1; }
fi
if [[ -z $bundle ]]; then
  "$root/scripts/install-deps.sh" || exit 1
  arch=${CUDA_ARCHITECTURES:-native}
  cmake -S "$root" -B "$root/build-gpu" -DCMAKE_BUILD_TYPE=Release -DRINGMASTER_WITH_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" >/dev/null || exit 1
  # shellcheck disable=SC2086
  cmake --build "$root/build-gpu" -j "$(nproc)" --target $tests $whole ringmaster-gpu-bench || exit 1
  # The Python package, when pybind11 and the Python headers are there (for /usr/bin/python3).
  cmake --build "$root/build-gpu" -j "$(nproc)" --target ringmaster_python >/dev/null 2>&1 || true
  bin="$root/build-gpu/bin"
  checks="$root/tests/python/torch_device_checks.py"
  python=/usr/bin/python3
  profiles="$root/bench/profiles"
  whole_path="$root/tests/worker/gpu/gpu_whole_path.sh"
else
  bin="$bundle/bin"
  profiles="$bundle/profiles"
  whole_path="$bundle/tests/gpu_whole_path.sh"
  checks="$bundle/tests/torch_device_checks.py"
  python=python3
  # libnccl.so.2: the loader's own, else pip's (nvidia-nccl-cu12/cu13 install nvidia/nccl/lib, a
  # namespace package without __file__), else the CUDA toolkit's.
  nccl_lib=""
  if ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2 '; then
    for py in python3 /usr/bin/python3; do
      nccl_lib=$("$py" - 2>/dev/null <<'PY'
import glob, os, sys
for p in sys.path:
    for hit in sorted(glob.glob(os.path.join(p or ".", "nvidia", "*", "lib", "libnccl.so.2"))):
        print(os.path.dirname(os.path.abspath(hit)))
        raise SystemExit
PY
)
      [[ -n $nccl_lib ]] && break
    done
  fi
  export LD_LIBRARY_PATH="$bundle/lib${nccl_lib:+:$nccl_lib}:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
echo "== GPUs"
[[ -n $bundle ]] && echo "NCCL from: ${nccl_lib:-the loader path or /usr/local/cuda/lib64}"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>&1 || true

echo "== tests"
passed=0; failed=0; skipped=0; failures=""
for t in $tests; do
  out=$(timeout 120 "$bin/$t" 2>&1); rc=$?
  echo "$out" | grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test' | sed "s/^/$t: /"
  p=$(echo "$out" | sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p'); passed=$((passed + ${p:-0}))
  s=$(echo "$out" | sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p'); skipped=$((skipped + ${s:-0}))
  if ((rc != 0)); then
    failed=$((failed + 1)); failures="$failures $t"
    echo "$out" | grep -B2 -A8 'Failure' | head -40
  fi
done

echo "== the whole path: ringmaster local --gpus, client -> daemon (CUDA IPC) -> NCCL"
whole_out=$(GPU_WHOLE_PATH_TIMEOUT=150 sh "$whole_path" "$bin" "$profiles/resnet50.json" 2>&1); whole_rc=$?
echo "$whole_out" | tail -40

echo "== PyTorch on the GPU: ringmaster.torch with CUDA tensors (tests/python/torch_device_checks.py)"
# The package next to bin/ (which `ringmaster local` puts on PYTHONPATH), built for this Python,
# whose PyTorch must see the GPUs.
suffix=$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))' 2>/dev/null)
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [[ ! -f $bin/../python/ringmaster/_ringmaster$suffix ]]; then
  torch_rc=77; torch_why="no ringmaster package for $python ($suffix) next to $bin"
elif ! "$python" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
  torch_rc=77; torch_why="$python's PyTorch sees no CUDA device"
elif ((ngpu == 0)); then
  torch_rc=77; torch_why="no GPU"
else
  torch_out=$(timeout 150 "$bin/ringmaster" local --np "$ngpu" --gpus --start-timeout-seconds 60 \
    --env TORCH_DEVICE_CHECKS_DEVICE=cuda -- "$python" "$checks" 2>&1); torch_rc=$?
  echo "$torch_out" | grep -v '^\[[0-9]*\] *$' | tail -40
fi
((torch_rc == 77)) && echo "skipped: $torch_why"

echo "== benchmark"
bench_out=$(timeout 150 "$bin/ringmaster-gpu-bench" --profile "$profiles/resnet50.json" --steps 30 --warmup 5 2>&1); bench_rc=$?
echo "$bench_out"

echo
echo "== summary ($(($(date +%s) - start)) s)"
printf '%-44s %s\n' "gpu tests" "$passed passed, $skipped skipped, $failed binaries failed${failures:+ (${failures# })}"
case $whole_rc in
  0) whole_result="passed: $(echo "$whole_out" | grep -c 'all checks passed') ranks" ;;
  77) whole_result="skipped (no GPU)" ;;
  *) whole_result="FAILED (exit $whole_rc)" ;;
esac
printf '%-44s %s\n' "whole path (client -> daemon -> NCCL)" "$whole_result"
case $torch_rc in
  0) torch_result="passed: $(echo "$torch_out" | grep -c 'torch_device_checks: rank .* checks passed') ranks" ;;
  77) torch_result="skipped ($torch_why)" ;;
  *) torch_result="FAILED (exit $torch_rc)" ;;
esac
printf '%-44s %s\n' "PyTorch CUDA tensors (ringmaster.torch)" "$torch_result"
results=$(mktemp)
{
  echo "$whole_out" | grep '^\[0\] {' | sed 's/^\[0\] //'
  ((bench_rc == 0)) && echo "$bench_out" | grep '^{'
} >"$results"
python3 - "$results" <<'PY'
import json, sys
rows = []
for line in open(sys.argv[1]):
    try:
        rows.append(json.loads(line))
    except ValueError:
        print("%-44s %s" % ("unreadable result line", line.strip()))
whole = next((r for r in rows if r["bench"] == "whole_path"), None)
raw = next((r for r in rows if r["bench"] == "fused_allreduce"), None)
one_gpu = "n/a with 1 GPU (NCCL's one-rank in-place allreduce moves no data)"
if whole and raw and whole["gpus"] == 1:
    print("%-44s %s" % ("whole path vs raw NCCL, %s" % whole["profile"], one_gpu))
elif whole and raw:
    # The issue's yardstick: the fused allreduce through the whole path against a raw
    # ncclAllReduce of the same bytes on the same GPUs (bus bandwidth ratio = time ratio).
    print("%-44s %.3f of raw ncclAllReduce's bandwidth (%.3f ms vs %.3f ms; target >= 0.95)"
          % ("whole path vs raw NCCL, %s" % whole["profile"], raw["raw_nccl_ms"] / whole["step_ms"],
             whole["step_ms"], raw["raw_nccl_ms"]))
large = next((r for r in rows if r["bench"] == "whole_path_large"), None)
raw_large = next((r for r in rows if r["bench"] == "raw_nccl_large"), None)
if large and raw_large:
    label = "whole path vs raw NCCL, %d MiB" % (large["bytes"] >> 20)
    if large["gpus"] == 1:
        print("%-44s %s" % (label, one_gpu))
    else:
        print("%-44s %.3f of raw ncclAllReduce's bus bandwidth (%.1f vs %.1f GB/s; target >= 0.95)"
              % (label, raw_large["raw_nccl_ms"] / large["step_ms"], large["busbw_gbs"],
                 raw_large["raw_busbw_gbs"]))
for r in rows:
    if r["bench"] == "whole_path":
        label = "whole path, %d GPU(s), %s step" % (r["gpus"], r["profile"])
        print("%-44s %.3f ms, bus bandwidth %.1f GB/s" % (label, r["step_ms"], r["busbw_gbs"]))
    elif r["bench"] == "fused_allreduce":
        label = "fused allreduce, %d GPU(s), %s" % (r["gpus"], r["profile"])
        print("%-44s %.3f ms vs raw NCCL %.3f ms: %s"
              % (label, r["fused_ms"], r["raw_nccl_ms"],
                 one_gpu if r["gpus"] == 1 else
                 "%.3f of raw bandwidth (target >= 0.95)" % r["ratio"]))
    elif r["bench"] == "pack_unpack":
        print("%-44s %.0f GB/s vs %.0f GB/s: %.3f (target >= 0.8)"
              % ("pack + unpack vs cudaMemcpy D2D", r["pack_unpack_gbs"], r["memcpy_d2d_gbs"],
                 r["ratio"]))
PY
rm -f "$results"
((bench_rc == 0)) || printf '%-44s %s\n' "benchmark" "did not run (exit $bench_rc)"
((failed == 0 && bench_rc == 0 && (whole_rc == 0 || whole_rc == 77) &&
  (torch_rc == 0 || torch_rc == 77)))
