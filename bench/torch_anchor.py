#!/usr/bin/python3
# Copied from the shared yardsticks (shared/bench/torch_anchor.py) so the project runs it on its own;
# --nnodes/--node-rank/--master-addr added to run the same yardstick across hosts.
"""PyTorch torch.distributed (Gloo) yardstick: allreduce a model's gradient tensor list, the way a
PyTorch user would, and print one JSON line per mode.

Modes (all on the same tensors, same ranks, same machine):
  per_tensor  one async allreduce per gradient tensor, then wait for all (no fusion)
  bucketed    DDP-style: tensors grouped in backward order into buckets of --bucket-mb (first bucket 1 MiB),
              one async allreduce per bucket; gradients are views into persistent bucket buffers
              (DistributedDataParallel with gradient_as_bucket_view=True), so no packing cost is counted
  flat        the whole gradient set as one persistent buffer, one allreduce (fusion with no limit, no copies)

Usage: /usr/bin/python3 torch_anchor.py --profile ../data/model_profiles/resnet50.json --np 2 [--steps 10]
Needs Debian's python3-torch (the system /usr/bin/python3, not another interpreter).
"""
import argparse, json, os, statistics, sys, time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def buckets(sizes, first_cap, cap):
    out, cur, cur_bytes, limit = [], [], 0, first_cap
    for i, n in enumerate(sizes):
        cur.append(i)
        cur_bytes += n * 4
        if cur_bytes >= limit:
            out.append(cur)
            cur, cur_bytes, limit = [], 0, cap
    if cur:
        out.append(cur)
    return out


def run(local_rank, args, port, result_q):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = args.master_addr, str(port)
    torch.set_num_threads(1)
    rank = args.node_rank * args.np + local_rank
    dist.init_process_group("gloo", rank=rank, world_size=args.np * args.nnodes)
    if args.modes == ["latency"]:
        latency(rank, args, result_q)
        dist.destroy_process_group()
        return
    prof = json.load(open(args.profile))
    sizes = [numel(t["shape"]) for t in prof["tensors"]]
    total_bytes = sum(sizes) * 4
    # per_tensor: separate tensors. bucketed/flat: gradients are views into persistent buffers, as DDP does
    # with gradient_as_bucket_view=True, so the step is the allreduces alone (the best case for torch).
    grads = [torch.randn(n) for n in sizes]
    plan = buckets(sizes, 1 << 20, int(args.bucket_mb * (1 << 20)))
    bucket_bufs = [torch.randn(sum(sizes[i] for i in b)) for b in plan]
    flat_buf = torch.randn(sum(sizes))

    def per_tensor():
        works = [dist.all_reduce(g, async_op=True) for g in grads]
        for w in works:
            w.wait()

    def bucketed():
        works = [dist.all_reduce(b, async_op=True) for b in bucket_bufs]
        for w in works:
            w.wait()

    def flat():
        dist.all_reduce(flat_buf)

    # allgather (only when named in --modes): every rank's --allgather-bytes, in rows of 1 KiB.
    mine = torch.full((max(1, args.allgather_bytes // 1024), 256), float(rank))
    gathered = [torch.empty_like(mine) for _ in range(args.np * args.nnodes)]

    def allgather():
        dist.all_gather(gathered, mine)

    results = {}
    for name, fn in (("per_tensor", per_tensor), ("bucketed", bucketed), ("flat", flat),
                     ("allgather", allgather)):
        if (args.modes and name not in args.modes) or (not args.modes and name == "allgather"):
            continue
        times = []
        for step in range(args.warmup + args.steps):
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            if step >= args.warmup:
                times.append(dt)
        # the step ends when the slowest rank ends
        t = torch.tensor([statistics.median(times)])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        results[name] = t.item()
    if rank == 0:
        n = args.np * args.nnodes
        for name, sec in results.items():
            if name == "allgather":
                result_q.put({"system": "torch.distributed-gloo", "torch": torch.__version__,
                              "mode": name, "np": n, "bytes_per_rank": mine.numel() * 4,
                              "time_s_median": round(sec, 6)})
                continue
            result_q.put({"system": "torch.distributed-gloo", "torch": torch.__version__, "mode": name,
                          "profile": prof["model"], "np": n, "tensors": len(sizes), "bytes_per_step": total_bytes,
                          "step_time_s_median": round(sec, 6),
                          "busbw_gbs": round(2 * (n - 1) / n * total_bytes / sec / 1e9, 4)})
    dist.destroy_process_group()


def latency(rank, args, result_q):
    """A 4-byte allreduce over and over, each waited for: p50 and p99 of rank 0's times."""
    x = torch.ones(1)
    times = []
    for i in range(args.latency_iterations + 10):
        t0 = time.perf_counter()
        dist.all_reduce(x)
        if i >= 10:
            times.append(time.perf_counter() - t0)
    times.sort()
    if rank == 0:
        result_q.put({"system": "torch.distributed-gloo", "torch": torch.__version__,
                      "bench": "latency", "np": args.np * args.nnodes, "bytes": 4,
                      "iterations": args.latency_iterations,
                      "p50_ms": round(times[len(times) // 2] * 1e3, 4),
                      "p99_ms": round(times[len(times) * 99 // 100] * 1e3, 4)})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", help="a gradient profile (bench/profiles/*.json); not for latency")
    ap.add_argument("--np", type=int, default=2, help="ranks on this host")
    ap.add_argument("--nnodes", type=int, default=1, help="hosts, each running this with its --node-rank")
    ap.add_argument("--node-rank", type=int, default=0)
    ap.add_argument("--master-addr", default="127.0.0.1", help="the address of --node-rank 0's host")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--bucket-mb", type=float, default=25.0)
    ap.add_argument("--modes", nargs="*", help="subset of per_tensor bucketed flat allgather "
                    "(default: the first three), or latency alone (a 4-byte allreduce's p50 and p99)")
    ap.add_argument("--latency-iterations", type=int, default=2000)
    ap.add_argument("--allgather-bytes", type=int, default=4 << 20,
                    help="allgather mode: bytes from every rank")
    ap.add_argument("--port", type=int, default=29533)
    args = ap.parse_args()
    if args.modes != ["latency"] and not args.profile:
        ap.error("--profile is required (except with --modes latency)")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=run, args=(r, args, args.port, q)) for r in range(args.np)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    if any(p.exitcode for p in procs):
        sys.exit("a rank failed")
    while not q.empty():
        print(json.dumps(q.get()))


if __name__ == "__main__":
    main()
