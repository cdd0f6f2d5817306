#!/usr/bin/python3
"""The gradient step through the public `hvd` API, against PyTorch DDP's bucketed allreduce in the
same run (issue 17, "the Python path as fast as the C++ path").

Each rank holds a model profile's gradient tensors as ordinary CPU tensors (not in the arena) and,
per step, calls `hvd.allreduce_async_` on each of them, then `hvd.synchronize` on every handle: what
a script that reduces its gradients itself does. Measured with direct access (the daemon reduces
the tensors in the process's memory, the default on CPU slots) and with the tensors staged through
the arena (RINGMASTER_DIRECT_ACCESS=0). The yardstick is the shared torch_anchor.py
(torch.distributed with Gloo; DDP-style buckets of 25 MB, gradients as bucket views) with the same
profile and number of ranks, run right after. Repeats both and prints the medians and the ratio.

    /usr/bin/python3 bench/torch_api_step.py [--np 2] [--profile bench/profiles/resnet50.json]
                                             [--steps 10] [--repeats 3]

With --latency N instead: a 1-element `hvd.allreduce` N times on each rank, each waited for, p50 and
p99 of rank 0's, against the same loop of torch.distributed's all_reduce (bench/torch_anchor.py
--modes latency), alternating, --repeats times.

With --unnamed N: the same loop with automatic names (`hvd.allreduce(x)`: each call a new tensor
name, as Horovod's "allreduce.noname.K") against the named loop, alternating, --repeats times.

Inside a job (what each rank runs): torch_api_step.py --rank-main --profile P --steps S.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ANCHOR = ROOT.parent / "shared" / "bench" / "torch_anchor.py"


def rank_main(args):
    import torch
    import ringmaster.torch as hvd

    hvd.init()
    torch.set_num_threads(1)
    if args.latency:
        x = torch.ones(1)
        times = []
        name = None if args.unnamed else "latency"
        for i in range(args.latency + 10):
            t0 = time.perf_counter()
            hvd.allreduce(x, name=name, op=hvd.Sum)
            if i >= 10:
                times.append(time.perf_counter() - t0)
        times.sort()
        if hvd.rank() == 0:
            print(f"LATENCY {times[len(times) // 2]:.7f} {times[len(times) * 99 // 100]:.7f}",
                  flush=True)
        return
    prof = json.load(open(args.profile))
    grads = []
    for t in prof["tensors"]:
        n = 1
        for d in t["shape"]:
            n *= d
        grads.append((t["name"], torch.randn(n)))
    times = []
    for step in range(args.warmup + args.steps):
        hvd.barrier()
        t0 = time.perf_counter()
        handles = [hvd.allreduce_async_(g, name=name, op=hvd.Sum) for name, g in grads]
        for h in handles:
            hvd.synchronize(h)
        dt = time.perf_counter() - t0
        if step >= args.warmup:
            times.append(dt)
    # The step ends when the slowest rank's does.
    worst = hvd.allreduce(torch.tensor([statistics.median(times)]), op=hvd.Max,
                          name="torch_api_step.median")
    if hvd.rank() == 0:
        print(f"RESULT {worst.item():.6f} {len(grads)}", flush=True)


def latency(args):
    ours, theirs = [], []
    for i in range(args.repeats):
        out = subprocess.run(
            [str(ROOT / "build" / "bin" / "ringmaster"), "local", "--np", str(args.np), "--",
             "/usr/bin/python3", __file__, "--rank-main", "--latency", str(args.latency)],
            capture_output=True, text=True, timeout=900, check=True).stdout
        m = re.search(r"LATENCY ([\d.]+) ([\d.]+)", out)
        ours.append((float(m.group(1)), float(m.group(2))))
        anchor = subprocess.run(
            ["/usr/bin/python3", str(ROOT / "bench" / "torch_anchor.py"), "--np", str(args.np),
             "--modes", "latency", "--latency-iterations", str(args.latency), "--port",
             str(29700 + i)],
            capture_output=True, text=True, timeout=900, check=True).stdout
        r = json.loads(anchor.splitlines()[0])
        theirs.append((r["p50_ms"] / 1e3, r["p99_ms"] / 1e3))
        print(f"run {i + 1}: hvd.allreduce p50 {ours[-1][0] * 1e3:.3f} ms, p99 "
              f"{ours[-1][1] * 1e3:.3f} ms; torch.distributed p50 {theirs[-1][0] * 1e3:.3f} ms, "
              f"p99 {theirs[-1][1] * 1e3:.3f} ms", flush=True)
    o = statistics.median(p for p, _ in ours)
    t = statistics.median(p for p, _ in theirs)
    print(f"median p50: ringmaster.torch {o * 1e3:.3f} ms, torch.distributed gloo {t * 1e3:.3f} ms, "
          f"ratio {o / t:.2f}, np {args.np}, 1 float32")


def unnamed(args):
    runs = {"named": [], "unnamed": []}
    for i in range(args.repeats):
        for kind in ("named", "unnamed"):
            out = subprocess.run(
                [str(ROOT / "build" / "bin" / "ringmaster"), "local", "--np", str(args.np), "--",
                 "/usr/bin/python3", __file__, "--rank-main", "--latency", str(args.unnamed)]
                + (["--unnamed", "1"] if kind == "unnamed" else []),
                capture_output=True, text=True, timeout=900, check=True).stdout
            m = re.search(r"LATENCY ([\d.]+) ([\d.]+)", out)
            runs[kind].append(float(m.group(1)))
        print(f"run {i + 1}: named p50 {runs['named'][-1] * 1e3:.3f} ms, unnamed p50 "
              f"{runs['unnamed'][-1] * 1e3:.3f} ms", flush=True)
    n, u = statistics.median(runs["named"]), statistics.median(runs["unnamed"])
    print(f"median p50: named {n * 1e3:.3f} ms, unnamed {u * 1e3:.3f} ms, ratio {u / n:.2f}, "
          f"np {args.np}, 1 float32")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--profile", default=str(ROOT / "bench" / "profiles" / "resnet50.json"))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--latency", type=int, default=0,
                        help="iterations of a 1-element allreduce instead of the gradient step")
    parser.add_argument("--unnamed", type=int, default=0,
                        help="N calls with automatic names against N named, alternating")
    parser.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_main:
        rank_main(args)
        return
    if args.unnamed and not args.rank_main:
        return unnamed(args)
    if args.latency:
        return latency(args)
    ours, staged, ddp = [], [], []

    def job(direct):
        out = subprocess.run(
            [str(ROOT / "build" / "bin" / "ringmaster"), "local", "--np", str(args.np), "--env",
             f"RINGMASTER_DIRECT_ACCESS={direct}", "--", "/usr/bin/python3", __file__,
             "--rank-main", "--profile", args.profile, "--steps", str(args.steps), "--warmup",
             str(args.warmup)],
            capture_output=True, text=True, timeout=900, check=True).stdout
        return float(re.search(r"RESULT ([\d.]+)", out).group(1))

    for i in range(args.repeats):
        ours.append(job(1))
        staged.append(job(0))
        anchor = subprocess.run(
            ["/usr/bin/python3", str(ANCHOR), "--profile", args.profile, "--np", str(args.np),
             "--steps", str(args.steps), "--warmup", str(args.warmup), "--modes", "bucketed",
             "--port", str(29700 + i)],
            capture_output=True, text=True, timeout=900, check=True).stdout
        ddp.append(json.loads(anchor.splitlines()[0])["step_time_s_median"])
        print(f"run {i + 1}: hvd.allreduce_async_ per tensor {ours[-1] * 1e3:.1f} ms "
              f"(staged through the arena: {staged[-1] * 1e3:.1f} ms), "
              f"torch DDP bucketed {ddp[-1] * 1e3:.1f} ms", flush=True)
    o, s, d = statistics.median(ours), statistics.median(staged), statistics.median(ddp)
    print(f"median: ringmaster.torch {o * 1e3:.1f} ms (staged {s * 1e3:.1f} ms), torch DDP "
          f"bucketed {d * 1e3:.1f} ms, ratio {o / d:.2f} (staged {s / d:.2f}; target <= 1.0), "
          f"np {args.np}, {Path(args.profile).stem}")


if __name__ == "__main__":
    sys.exit(main())
