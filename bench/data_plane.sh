#!/usr/bin/env bash
# Data-plane benchmark, as recorded in docs/benchmarks.md. For each profile, in one run and on the same
# ranks of this machine: Ringmaster through the whole path (`ringmaster local` -> worker daemons ->
# coordinator negotiation -> fused allreduce through shared memory) with the raw-Gloo single-buffer
# baseline and the memory-bandwidth floor (a memcpy of the step's bytes on every rank at once) timed
# in the same job; Ringmaster again with --no-shm-allreduce (fused Gloo allreduce over loopback); then
# PyTorch torch.distributed (Gloo) with DDP-style 25 MB buckets (bench/torch_anchor.py).
# Repeats each `--repeats` times and prints the medians and the ratios; plus the 4-byte latency.
#   bench/data_plane.sh [--np 2] [--repeats 3] [--steps 10] [--profiles "resnet50 vgg16 maskrcnn_resnet50_fpn"]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/build/bin"
np=2
repeats=3
steps=10
profiles="resnet50 vgg16 maskrcnn_resnet50_fpn"
while (($#)); do
  case $1 in
    --np) np=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --profiles) profiles=$2; shift 2 ;;
    *) echo "data_plane.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
"$root/scripts/install-deps.sh" --bench
[[ -x $bin/ringmaster-bench ]] || "$root/scripts/build.sh" >/dev/null

out=$(mktemp)
trap 'rm -f "$out"' EXIT
for profile in $profiles; do
  json="$root/bench/profiles/$profile.json"
  for ((i = 0; i < repeats; i++)); do
    "$bin/ringmaster" local --np "$np" -- "$bin/ringmaster-bench" --profile "$json" --steps "$steps" \
      --warmup 2 --json | sed 's/^\[0\] //' >>"$out"
    "$bin/ringmaster" local --np "$np" --no-shm-allreduce -- "$bin/ringmaster-bench" --profile "$json" \
      --steps "$steps" --warmup 2 --baseline=false --json | sed 's/^\[0\] //' \
      | grep -v memcpy-floor | sed 's/"system":"ringmaster"/"system":"ringmaster-gloo"/' >>"$out"
    /usr/bin/python3 "$root/bench/torch_anchor.py" --profile "$json" --np "$np" --steps "$steps" \
      --modes bucketed --port $((29500 + RANDOM % 400)) >>"$out"
  done
done
# The 4-byte latency: Ringmaster (a one-host job negotiates a lone cached allreduce among its
# daemons), the same through the coordinator (--no-local-negotiation), and PyTorch's Gloo, alternating.
for ((i = 0; i < repeats; i++)); do
  "$bin/ringmaster" local --np "$np" -- "$bin/ringmaster-bench" --latency-iterations 2000 --json \
    | sed 's/^\[0\] //' >>"$out"
  "$bin/ringmaster" local --np "$np" --no-local-negotiation -- "$bin/ringmaster-bench" \
    --latency-iterations 2000 --json | sed 's/^\[0\] //; s/"system":"ringmaster"/"system":"ringmaster-coordinator"/' >>"$out"
  /usr/bin/python3 "$root/bench/torch_anchor.py" --np "$np" --modes latency --latency-iterations 2000 \
    --port $((29500 + RANDOM % 400)) >>"$out"
done
/usr/bin/python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
med = lambda xs: statistics.median(xs) if xs else float("nan")
profiles = []
for r in rows:
    if "profile" in r and r["profile"] not in profiles:
        profiles.append(r["profile"])
print(f"{'profile':24} {'np':>3} {'ringmaster ms':>14} {'over gloo ms':>13} {'raw gloo ms':>12} "
      f"{'memcpy ms':>10} {'torch bucketed ms':>18} {'vs raw gloo':>12} {'vs torch':>9} {'vs memcpy':>10}"
      f"  (medians of {len([r for r in rows if r.get('system') == 'ringmaster' and 'profile' in r]) // max(1, len(profiles))} runs)")
for p in profiles:
    ours = med([r["step_time_s_median"] for r in rows if r.get("system") == "ringmaster" and r.get("profile") == p])
    raw = med([r["step_time_s_median"] for r in rows if r.get("system") == "raw-gloo-one-buffer" and r.get("profile") == p])
    torch = med([r["step_time_s_median"] for r in rows if r.get("system") == "torch.distributed-gloo" and r.get("profile") == p])
    gloo = med([r["step_time_s_median"] for r in rows if r.get("system") == "ringmaster-gloo" and r.get("profile") == p])
    floor = med([r["step_time_s_median"] for r in rows if r.get("system") == "memcpy-floor" and r.get("profile") == p])
    np_ = next(r["np"] for r in rows if r.get("profile") == p)
    print(f"{p:24} {np_:>3} {ours*1e3:>14.1f} {gloo*1e3:>13.1f} {raw*1e3:>12.1f} {floor*1e3:>10.1f} "
          f"{torch*1e3:>18.1f} {ours/raw:>12.3f} {ours/torch:>9.3f} {ours/floor:>10.3f}")
lat = [r for r in rows if r.get("bench") == "latency"]
if lat:
    print(f"4-byte allreduce, np={lat[0]['np']}, p50 / p99 in ms (medians of "
          f"{len(lat) // 3} runs of {lat[0]['iterations']} each):")
    p50 = {}
    for system, label in (("ringmaster", "ringmaster"),
                          ("ringmaster-coordinator", "through the coordinator"),
                          ("torch.distributed-gloo", "torch.distributed gloo")):
        mine = [r for r in lat if r.get("system") == system]
        p50[system] = med([r["p50_ms"] for r in mine])
        print(f"  {label:26} {p50[system]:.3f} / {med([r['p99_ms'] for r in mine]):.3f}")
    print(f"  ringmaster / torch p50: {p50['ringmaster'] / p50['torch.distributed-gloo']:.3f}")
PY
