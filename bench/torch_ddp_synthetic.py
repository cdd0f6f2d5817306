#!/usr/bin/python3
"""The yardstick for examples/pytorch_synthetic_benchmark.py: the same model, batch, optimizer and
step, on PyTorch's own DistributedDataParallel with Gloo, the same number of processes on this
machine. Prints the same lines (img/sec per CPU, total).

    /usr/bin/python3 bench/torch_ddp_synthetic.py --np 2 --model resnet50 --batch-size 16
"""
import argparse
import os
import statistics
import sys
import timeit

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
# The example imports ringmaster.torch at the top (only its model factory is used here).
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "build", "python"))


def run(rank, args):
    from pytorch_synthetic_benchmark import make_model  # the very same model factory
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(args.port)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.np))
    dist.init_process_group("gloo", rank=rank, world_size=args.np)
    torch.manual_seed(0)
    model, name = make_model(args.model)
    model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * args.np)
    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    target = torch.randint(0, 1000, (args.batch_size,))

    def step():
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()

    timeit.timeit(step, number=args.num_warmup_batches)
    img_secs = []
    for _ in range(args.num_iters):
        seconds = timeit.timeit(step, number=args.num_batches_per_iter)
        img_secs.append(args.batch_size * args.num_batches_per_iter / seconds)
    mean = statistics.mean(img_secs)
    if rank == 0:
        print(f"Model: {name}\nBatch size: {args.batch_size}\nNumber of CPUs: {args.np}")
        print(f"Img/sec per CPU: {mean:.1f}")
        print(f"Total img/sec on {args.np} CPU(s): {args.np * mean:.1f}", flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--num-warmup-batches", type=int, default=10)
    ap.add_argument("--num-batches-per-iter", type=int, default=10)
    ap.add_argument("--num-iters", type=int, default=10)
    ap.add_argument("--port", type=int, default=29611)
    args = ap.parse_args()
    mp.spawn(run, args=(args,), nprocs=args.np, join=True)


if __name__ == "__main__":
    main()
