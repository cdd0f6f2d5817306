"""Run as every rank of a job: ringmaster.torch on the tensors' device, with exact expected values.

    TORCH_DEVICE_CHECKS_DEVICE=cuda ringmaster local --np <GPUs> --gpus -- python3 torch_device_checks.py

On a GPU slot (`--gpus`) every tensor goes from the training process's CUDA stream into the
worker's device arena (CUDA IPC), is reduced by NCCL, and comes back ordered by interprocess events:
the checks below are what a PyTorch user relies on there. With TORCH_DEVICE_CHECKS_DEVICE=cpu (the
default) the same checks run on CPU tensors, on CPU workers or (CI, over the fake CUDA runtime of
tests/fake_cuda) GPU workers, which keeps them honest where there is no GPU. Any number of ranks, 1
included (NCCL takes one rank per GPU).

- allreduce: every op x every data type, out of place and in place, values exact; outputs keep the
  input's device and data type;
- a fused batch of tensors of odd sizes (the daemon packs them into its fusion buffer) and a
  contiguous run of them (reduced where they are), with pre- and postscale factors;
- a 64 MiB tensor;
- stream order: an input written late on a side stream (behind queued GPU work) is reduced only once
  it is written, kernels queued on that stream after synchronize() see the result, and so does the
  default stream when it waits for an operation submitted on a side stream;
- in-place allreduce of a non-contiguous view; grouped allreduce;
- broadcast from every root (also in place, and bool), allgather with a first dimension per rank;
- broadcast_parameters / broadcast_optimizer_state of a model on the device, and DistributedOptimizer
  steps matching one process on the whole batch.

Prints one line per failure and "torch_device_checks: rank R on DEVICE: N checks passed"; exits 0
only if every check passed.
"""
import contextlib
import copy
import os
import sys

import torch
import torch.nn.functional as F

import ringmaster.torch as hvd
import rank_checks
import torch_api_checks as base
from ringmaster import basics
from torch_api_checks import check, expected_allreduce, section, values

DEVICE = os.environ.get("TORCH_DEVICE_CHECKS_DEVICE", "cpu")
ALL_TYPES = [torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16,
             torch.float32, torch.float64]


def on_device(t):
    return t.to(DEVICE)


def equal(got, want, op=None):
    """`got` (on DEVICE) equals `want` (on the CPU) exactly, with the same type and shape. Floating
    averages over a number of ranks that is not a power of two may differ in the last place (NCCL's
    ncclAvg divides before it sums; the reference divides the exact sum)."""
    if not (got.device.type == torch.device(DEVICE).type and got.dtype == want.dtype
            and got.shape == want.shape):
        return False
    if (op == "average" and want.dtype.is_floating_point
            and base.SIZE & (base.SIZE - 1) != 0):
        eps = torch.finfo(want.dtype).eps
        return torch.allclose(got.cpu().double(), want.double(), rtol=2 * eps, atol=0)
    return torch.equal(got.cpu(), want)


def side_stream():
    return torch.cuda.stream(torch.cuda.Stream()) if DEVICE == "cuda" else contextlib.nullcontext()


def allreduce_every_op_and_type():
    for op in base.OPS:
        for dtype in ALL_TYPES:
            seed = 1000 + 10 * ALL_TYPES.index(dtype) + list(base.OPS).index(op)
            shape = (3, 5)
            want = expected_allreduce(seed, shape, dtype, op)
            t = on_device(values(base.RANK, seed, shape, dtype, op))
            got = hvd.allreduce(t, name=f"dev.{op}.{dtype}", op=base.OPS[op])
            check(equal(got, want, op), f"allreduce {op} {dtype}: got {got} want {want}")
            check(equal(t, values(base.RANK, seed, shape, dtype, op)),
                  f"allreduce {op} {dtype} modified its input")
            hvd.allreduce_(t, name=f"dev.{op}.{dtype}.inplace", op=base.OPS[op])
            check(equal(t, want, op), f"allreduce_ {op} {dtype}: got {t} want {want}")


def fused_batch():
    # Odd sizes (the daemon's fusion buffer pads each to its alignment), all enqueued before any
    # is waited for, so they are negotiated and reduced together.
    sizes = [1, 7, 33, 100, 257, 1000, 4099, 3, 65536, 9]
    for round_, (pre, post) in enumerate(((1.0, 1.0), (2.0, 0.5), (0.5, 4.0))):
        inputs, handles = [], []
        for i, n in enumerate(sizes):
            seed = 2000 + 100 * round_ + i
            t = on_device(values(base.RANK, seed, (n,), torch.float32))
            inputs.append((seed, n))
            handles.append(hvd.allreduce_async_(t, name=f"fused.{round_}.{i}", op=hvd.Sum,
                                                prescale_factor=pre, postscale_factor=post))
        for (seed, n), h in zip(inputs, handles):
            got = hvd.synchronize(h)
            exact = torch.stack([values(r, seed, (n,), torch.float32).double()
                                 for r in range(base.SIZE)]).sum(0)
            want = base.scale_like_daemon(exact, pre * post, torch.float32)
            check(equal(got, want), f"fused allreduce x{pre} x{post} of {n} floats differs")
    # Averages of a batch of float16 and int64 tensors.
    for dtype in (torch.float16, torch.int64):
        handles = [(seed, hvd.allreduce_async(on_device(values(base.RANK, seed, (seed % 50 + 1,),
                                                               dtype)),
                                              name=f"fused.avg.{seed}", op=hvd.Average))
                   for seed in range(2400, 2420)]
        for seed, h in handles:
            want = expected_allreduce(seed, (seed % 50 + 1,), dtype, "average")
            check(equal(hvd.synchronize(h), want, "average"), f"fused average {dtype} #{seed}")


def large_tensor():
    n = 16 * 1024 * 1024  # 64 MiB of float32, past the fusion threshold
    t = torch.arange(n, dtype=torch.float32, device=DEVICE) % 1024 + base.RANK
    got = hvd.allreduce(t, op=hvd.Sum, name="large")
    want = (torch.arange(n, dtype=torch.float32) % 1024) * base.SIZE + base.SIZE * (base.SIZE - 1) / 2
    check(equal(got, want), "64 MiB allreduce differs")


def busy(stream_work_ms=30):
    """Queues GPU work that keeps the current stream busy for a while (nothing on the CPU): what
    is queued after it on that stream runs late, which is what exposes a missing stream wait."""
    if DEVICE == "cuda":
        torch.cuda._sleep(int(stream_work_ms * 2e6))  # about 2 GHz


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def stream_order():
    n = 8 * 1024 * 1024
    ranks_sum = base.SIZE * (base.SIZE + 1) / 2
    with side_stream():
        # The input is written late on its stream: the daemon may read it only after that.
        busy()
        t = torch.full((n,), float(base.RANK + 1), device=DEVICE)
        # x2 afterwards, so the result differs from the input even with one rank.
        got = hvd.allreduce(t, op=hvd.Sum, name="stream.order", postscale_factor=2.0)
        # Kernels queued on the same stream after synchronize() see the result.
        doubled = got * 2
    sync()
    check(torch.equal(doubled.cpu(), torch.full((n,), 4.0 * ranks_sum)),
          "a side stream's allreduce raced its input or its output")
    # In place, then used at once on the stream.
    with side_stream():
        busy()
        t = torch.full((n,), float(base.RANK + 1), device=DEVICE)
        hvd.allreduce_(t, op=hvd.Sum, name="stream.inplace", postscale_factor=2.0)
        t.mul_(3)
    sync()
    check(torch.equal(t.cpu(), torch.full((n,), 6.0 * ranks_sum)),
          "in-place allreduce on a side stream")
    # Submitted on a side stream, waited for on the default stream (another op in between): the
    # waiting stream must see the result too.
    with side_stream():
        busy()
        a = torch.full((n,), float(base.RANK + 1), device=DEVICE)
        handle = hvd.allreduce_async_(a, op=hvd.Sum, name="stream.cross", postscale_factor=2.0)
    b = hvd.allreduce(torch.ones(4, device=DEVICE), op=hvd.Sum, name="stream.between")
    got = hvd.synchronize(handle)
    seen = got * 1  # on the default stream
    sync()
    check(got is a and torch.equal(seen.cpu(), torch.full((n,), 2.0 * ranks_sum)),
          "an allreduce submitted on a side stream and waited for on another raced its result")
    check(torch.equal(b.cpu(), torch.full((4,), float(base.SIZE))), "the allreduce in between")


def views_and_groups():
    root = values(base.RANK, 3000, (6, 4), torch.float64)
    base_tensor = on_device(root)
    view = base_tensor.t()
    check(not view.is_contiguous(), "the view is contiguous")
    hvd.allreduce_(view, op=hvd.Sum, name="view")
    check(equal(base_tensor, expected_allreduce(3000, (6, 4), torch.float64, "sum")),
          "in-place allreduce of a transposed view")
    shapes = [(3,), (2, 2), (4, 1, 2)]
    dtypes = [torch.float32, torch.int64, torch.bfloat16]
    tensors = [on_device(values(base.RANK, 3010 + i, s, d))
               for i, (s, d) in enumerate(zip(shapes, dtypes))]
    got = hvd.grouped_allreduce(tensors, op=hvd.Sum, name="dev.group")
    check(len(got) == 3 and all(equal(g, expected_allreduce(3010 + i, s, d, "sum"))
                                for i, (g, s, d) in enumerate(zip(got, shapes, dtypes))),
          "grouped allreduce")


def broadcast_and_allgather():
    for root in range(base.SIZE):
        for dtype in (torch.float32, torch.int64, torch.float16, torch.uint8):
            seed = 4000 + 10 * root + ALL_TYPES.index(dtype)
            t = on_device(values(base.RANK, seed, (2, 3), dtype))
            got = hvd.broadcast(t, root_rank=root, name=f"dev.bcast.{seed}")
            check(equal(got, values(root, seed, (2, 3), dtype)), f"broadcast {dtype} from {root}")
            hvd.broadcast_(t, root, name=f"dev.bcast_.{seed}")
            check(equal(t, values(root, seed, (2, 3), dtype)), f"broadcast_ {dtype} from {root}")
        got = hvd.broadcast(on_device(torch.tensor([base.RANK == root, base.RANK != root])), root,
                            name=f"dev.bcast.bool.{root}")
        check(equal(got, torch.tensor([True, False])), f"broadcast bool from {root}")
    for seed, dtype in ((4100, torch.float32), (4101, torch.int32), (4102, torch.bfloat16)):
        t = on_device(values(base.RANK, seed, (base.RANK + 1, 3), dtype))
        got = hvd.allgather(t, name=f"dev.gather.{seed}")
        want = torch.cat([values(r, seed, (r + 1, 3), dtype) for r in range(base.SIZE)])
        check(equal(got, want), f"allgather {dtype}: got {got} want {want}")


def model_state_and_training():
    torch.manual_seed(5000 + base.RANK)  # different weights per rank
    model = base.make_model().to(DEVICE)
    root_weights = (torch.manual_seed(5000), base.make_model())[1].state_dict()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    check(all(equal(model.state_dict()[k], v) for k, v in root_weights.items()),
          "broadcast_parameters did not give rank 0's weights")
    opt = torch.optim.Adam(model.parameters(), lr=0.001 * (base.RANK + 1))
    model(torch.ones(2, 8, device=DEVICE)).sum().backward()
    opt.step()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    check(opt.param_groups[0]["lr"] == 0.001, "Adam options not broadcast")
    base.checksum_equal_everywhere([v.cpu() for s in opt.state_dict()["state"].values()
                                    for v in s.values() if torch.is_tensor(v)],
                                   "Adam state on the device")

    # DistributedOptimizer: each rank's slice of the batch == one process on the whole batch (the
    # reference runs on the CPU in float64). With one rank (one GPU) HOROVOD_ELASTIC=1 makes it
    # reduce anyway, as Horovod's does.
    torch.manual_seed(1234)
    model = base.make_model()
    reference = copy.deepcopy(model).double()
    model = model.to(DEVICE)
    os.environ["HOROVOD_ELASTIC"] = "1"
    try:
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                       named_parameters=model.named_parameters())
    finally:
        del os.environ["HOROVOD_ELASTIC"]
    reference_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    b = 4
    for step in range(4):
        opt.zero_grad()
        reference_opt.zero_grad()
        g = torch.Generator().manual_seed(step)
        x = torch.randn(base.SIZE * b, 8, generator=g)
        y = torch.randn(base.SIZE * b, 1, generator=g)
        mine = slice(base.RANK * b, (base.RANK + 1) * b)
        F.mse_loss(model(x[mine].to(DEVICE)), y[mine].to(DEVICE)).backward()
        F.mse_loss(reference(x.double()), y.double()).backward()
        opt.step()
        reference_opt.step()
    worst = max((p.detach().cpu().double() - q.detach()).abs().max().item()
                for p, q in zip(model.parameters(), reference.parameters()))
    check(worst <= 1e-4, f"DistributedOptimizer on {DEVICE}: parameters differ from one process "
                         f"by {worst}")
    # The gradients live in the arena (the daemon reduces them where they are, no staging copies):
    # on a GPU slot, CUDA tensors over the device arena. CPU gradients on a GPU slot (whose arena
    # is device memory) are copied in and out instead.
    slot_on_gpu = basics.client().topology.device >= 0
    if slot_on_gpu == (DEVICE == "cuda"):
        check(len(opt._arena_grads) == 4
              and all(p.grad.device.type == torch.device(DEVICE).type
                      and p.grad.data_ptr() == opt._arena_grads[p].data_ptr()
                      for p in model.parameters()),
              f"DistributedOptimizer on {DEVICE}: gradients are not in the arena")
    else:
        check(not opt._arena_grads, f"{DEVICE} gradients in the arena of a slot on another device")
    base.checksum_equal_everywhere([p.detach().cpu() for p in model.parameters()],
                                   "trained parameters")


def main():
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("torch_device_checks: this PyTorch sees no CUDA device", flush=True)
        return 2
    hvd.init()
    base.RANK, base.SIZE = hvd.rank(), hvd.size()
    rank_checks.rank = base.RANK
    if DEVICE == "cuda":
        torch.cuda.set_device(hvd.local_rank())
    for fn in (allreduce_every_op_and_type, fused_batch, large_tensor, stream_order,
               views_and_groups, broadcast_and_allgather, model_state_and_training):
        section(fn)
    return rank_checks.finish("torch_device_checks", f" on {DEVICE}")


if __name__ == "__main__":
    sys.exit(main())
