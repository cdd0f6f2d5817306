#!/usr/bin/env bash
# ringmaster.torch against PyTorch DDP (Gloo) on the synthetic benchmark, same model and batch, in one
# run, repeated; prints both totals and the ratio (medians), as recorded in docs/benchmarks.md.
#   bench/pytorch_synthetic.sh [--np 2] [--model resnet50] [--batch-size 8] [--image-size 112] [--repeats 3]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
np=2 model=resnet50 batch=8 image=112 repeats=3
while (($#)); do
  case $1 in
    --np) np=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --batch-size) batch=$2; shift 2 ;;
    --image-size) image=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    *) echo "pytorch_synthetic.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
common=(--model "$model" --batch-size "$batch" --image-size "$image" --num-warmup-batches 1 --num-batches-per-iter 2 --num-iters 2)
ours=() ddp=()
for ((i = 0; i < repeats; i++)); do
  o=$("$root/build/bin/ringmaster" local --np "$np" -- /usr/bin/python3 \
      "$root/examples/pytorch_synthetic_benchmark.py" "${common[@]}" | sed -n 's/^\[0\] Total img\/sec on [0-9]* CPU(s): \([0-9.]*\).*/\1/p')
  d=$(/usr/bin/python3 "$root/bench/torch_ddp_synthetic.py" --np "$np" "${common[@]}" \
      --port $((29600 + RANDOM % 300)) | sed -n 's/^Total img\/sec on [0-9]* CPU(s): \([0-9.]*\).*/\1/p')
  echo "run $i: ringmaster.torch $o img/s, torch DDP $d img/s"
  ours+=("$o") ddp+=("$d")
done
/usr/bin/python3 - "${ours[*]}" "${ddp[*]}" "$model" "$np" "$batch" <<'PY'
import statistics, sys
ours = [float(x) for x in sys.argv[1].split()]
ddp = [float(x) for x in sys.argv[2].split()]
o, d = statistics.median(ours), statistics.median(ddp)
print(f"{sys.argv[3]} np={sys.argv[4]} batch={sys.argv[5]}: ringmaster.torch {o:.2f} img/s, "
      f"torch DDP {d:.2f} img/s, ratio {o / d:.3f} (medians of {len(ours)})")
PY
