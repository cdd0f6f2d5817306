"""Run as every rank of a job (`ringmaster local --np N -- python3 torch_api_checks.py`): checks
ringmaster.torch, Horovod's PyTorch API, against exact expected values computed from every rank's
deterministic inputs (each rank regenerates the others' from the seeds).

- allreduce: sum/average/min/max/product x int32/int64/float16/float32/float64 x 1-3 dimensions,
  out of place, in place, async and async in place; scaling; the other data types; grouped;
- allgather with a first dimension per rank, grouped allgather, broadcast from every root;
- broadcast_parameters / broadcast_optimizer_state leave every rank bit-identical (compared through
  an allgather of a checksum); broadcast_object / allgather_object;
- errors every rank sees with the coordinator's message: mismatched shapes, data types, roots and
  ops, a name already in flight; Horovod's DistributedOptimizer misuse errors;
- DistributedOptimizer parity with one process on the whole batch (also accumulating two backward
  passes, grouped, and with fp16 compression within fp16's precision);
- the gradients of allreduce, grouped allreduce, allgather and broadcast (Horovod's definitions);
- topology, capabilities, join, barrier, shutdown then init.

Needs at least 2 ranks. Prints one line per failure and "torch_api_checks: rank R: N checks
passed" (or "... F of N checks failed"); exits 0 only if every check passed.
TORCH_API_CHECKS_VERBOSE=1 also prints each section's name and the parity tests' differences.
"""
import copy
import hashlib
import os
import sys
import time
import warnings

import torch
import torch.nn.functional as F

import ringmaster.torch as hvd
import rank_checks
from rank_checks import check, raises

RANK = 0
SIZE = 1


def section(fn):
    rank_checks.section(fn, "TORCH_API_CHECKS_VERBOSE")


# ---- Deterministic inputs ----

INT_TYPES = (torch.uint8, torch.int8, torch.int32, torch.int64)
OPS = {"sum": hvd.Sum, "average": hvd.Average, "min": hvd.Min, "max": hvd.Max,
       "product": hvd.Product}
DTYPES = [torch.int32, torch.int64, torch.float16, torch.float32, torch.float64]
SHAPES = [(7,), (3, 5), (2, 3, 4)]


def values(rank, seed, shape, dtype, op="sum"):
    """Rank `rank`'s tensor number `seed`: small numbers every type holds exactly, and whose sums
    (and, without fractions, products) over up to 4 ranks too."""
    g = torch.Generator().manual_seed(seed * 7919 + rank * 104729)
    lo = 0 if dtype == torch.uint8 else -3
    v = torch.randint(lo, 4, shape, generator=g).to(torch.float64)
    if dtype.is_floating_point and op != "product":
        v += 0.25 * torch.randint(0, 4, shape, generator=g).to(torch.float64)
    if op == "product":
        v[v == 0] = 1
    return v.to(dtype)


def scale_like_daemon(exact_sum, factor, dtype):
    """exact_sum (float64) times factor as the daemon scales: in the tensor's own type for
    float32/float64, in float32 then rounded for float16/bfloat16."""
    if dtype in (torch.float16, torch.bfloat16):
        return (exact_sum.to(torch.float32) * torch.tensor(factor, dtype=torch.float32)).to(dtype)
    return exact_sum.to(dtype) * torch.tensor(factor, dtype=dtype)


def expected_allreduce(seed, shape, dtype, op):
    per_rank = [values(r, seed, shape, dtype, op).to(torch.float64) for r in range(SIZE)]
    stack = torch.stack(per_rank)
    if op in ("sum", "average"):
        total = stack.sum(0)
        if op == "sum":
            return total.to(dtype)
        if dtype in INT_TYPES:
            return torch.div(total, SIZE, rounding_mode="trunc").to(dtype)
        return scale_like_daemon(total, 1.0 / SIZE, dtype)
    if op == "min":
        return stack.min(0).values.to(dtype)
    if op == "max":
        return stack.max(0).values.to(dtype)
    return stack.prod(0).to(dtype)


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


# ---- Allreduce ----

def allreduce_matrix():
    """Every op x type x shape, in the four forms, enqueued at once in a rank-dependent order."""
    cases = []
    seed = 0
    for op in OPS:
        for dtype in DTYPES:
            for shape in SHAPES:
                seed += 1
                cases.append((seed, op, dtype, shape))
    # The asynchronous forms are enqueued first, in a rank-dependent order; the blocking forms
    # then run in the same order on every rank (as they must).
    order = cases if RANK % 2 == 0 else list(reversed(cases))
    handles = {}
    inputs = {}
    for seed, op, dtype, shape in order:
        t = values(RANK, seed, shape, dtype, op)
        inputs[seed] = t
        if seed % 4 == 0:  # allreduce_async: input untouched, output from synchronize
            handles[seed] = hvd.allreduce_async(t, name=f"matrix.{seed}", op=OPS[op])
        elif seed % 4 == 1:  # allreduce_async_: in place
            handles[seed] = hvd.allreduce_async_(t, name=f"matrix.{seed}", op=OPS[op])
    for seed, op, dtype, shape in cases:
        t = inputs[seed]
        want = expected_allreduce(seed, shape, dtype, op)
        form = ["async", "async_", "sync", "sync_"][seed % 4]
        what = f"allreduce {form} {op} {dtype} {list(shape)}"
        if form == "async":
            got = hvd.synchronize(handles[seed])
            check(same(t, values(RANK, seed, shape, dtype, op)), f"{what}: input modified")
        elif form == "async_":
            got = hvd.synchronize(handles[seed])
            check(got is t, f"{what}: synchronize() did not return the tensor")
        elif form == "sync":
            got = hvd.allreduce(t, name=f"matrix.{seed}", op=OPS[op])
            check(same(t, values(RANK, seed, shape, dtype, op)), f"{what}: input modified")
        else:
            got = hvd.allreduce_(t, name=f"matrix.{seed}", op=OPS[op])
            check(got is t, f"{what}: allreduce_ did not return its argument")
        check(same(got, want), f"{what}: got {got} want {want}")


def allreduce_unnamed_and_defaults():
    t = values(RANK, 101, (4, 2), torch.float32)
    got = hvd.allreduce(t)  # Average, automatic name
    check(same(got, expected_allreduce(101, (4, 2), torch.float32, "average")), "default op")
    handle = hvd.allreduce_async(values(RANK, 102, (5,), torch.int64), op=hvd.Sum)
    deadline = time.monotonic() + 30
    while not hvd.poll(handle) and time.monotonic() < deadline:
        time.sleep(0.001)
    check(hvd.poll(handle), "poll() never became true")
    check(same(hvd.synchronize(handle), expected_allreduce(102, (5,), torch.int64, "sum")),
          "synchronize after poll")
    # Horovod's deprecated `average`.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = hvd.allreduce(values(RANK, 103, (3,), torch.float64), average=False)
    check(same(got, expected_allreduce(103, (3,), torch.float64, "sum")), "average=False is Sum")
    check(any(issubclass(w.category, DeprecationWarning) for w in caught),
          "average= did not warn DeprecationWarning")
    raises(ValueError, lambda: hvd.allreduce(torch.ones(1), average=True, op=hvd.Sum),
           "supersedes average")
    raises(ValueError, lambda: hvd.allreduce(torch.ones(2, dtype=torch.int16)), "not supported")


def allreduce_scaling_and_types():
    t = values(RANK, 111, (6,), torch.float32)
    got = hvd.allreduce(t, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
    check(same(got, expected_allreduce(111, (6,), torch.float32, "sum")), "pre/postscale")
    got = hvd.allreduce(t, op=hvd.Average, postscale_factor=4.0, name="scaled.avg")
    exact = torch.stack([values(r, 111, (6,), torch.float32).double() for r in range(SIZE)]).sum(0)
    check(same(got, scale_like_daemon(exact, 4.0 / SIZE, torch.float32)), "average postscale")
    for seed, dtype in ((112, torch.uint8), (113, torch.int8), (114, torch.bfloat16)):
        got = hvd.allreduce(values(RANK, seed, (2, 5), dtype), op=hvd.Sum)
        check(same(got, expected_allreduce(seed, (2, 5), dtype, "sum")), f"sum {dtype}")
    # A non-contiguous tensor reduced in place stays a view of its base.
    base = values(RANK, 115, (4, 3), torch.float64)
    view = base.t()
    hvd.allreduce_(view, op=hvd.Sum)
    check(same(base, expected_allreduce(115, (4, 3), torch.float64, "sum")),
          "in-place allreduce of a transposed view")
    # A 0-dimensional tensor.
    got = hvd.allreduce(torch.tensor(float(RANK + 1)), op=hvd.Sum)
    check(got.dim() == 0 and got.item() == SIZE * (SIZE + 1) / 2, f"0-d allreduce: {got}")


def grouped_allreduce():
    shapes = [(3,), (2, 2), (4, 1, 2)]
    dtypes = [torch.float32, torch.int64, torch.float32]
    tensors = [values(RANK, 120 + i, s, d) for i, (s, d) in enumerate(zip(shapes, dtypes))]
    want = [expected_allreduce(120 + i, s, d, "sum")
            for i, (s, d) in enumerate(zip(shapes, dtypes))]
    got = hvd.grouped_allreduce(tensors, op=hvd.Sum)
    check(len(got) == 3 and all(same(g, w) for g, w in zip(got, want)), "grouped_allreduce")
    handle = hvd.grouped_allreduce_async(tensors, op=hvd.Sum, name="group.async")
    got = hvd.synchronize(handle)
    check(all(same(g, w) for g, w in zip(got, want)), "grouped_allreduce_async")
    copies = [t.clone() for t in tensors]
    got = hvd.grouped_allreduce_(copies, op=hvd.Sum, name="group.inplace")
    check(all(g is c for g, c in zip(got, copies)) and all(same(c, w) for c, w in zip(copies, want)),
          "grouped_allreduce_")
    copies = [t.clone() for t in tensors]
    hvd.synchronize(hvd.grouped_allreduce_async_(copies, op=hvd.Sum))
    check(all(same(c, w) for c, w in zip(copies, want)), "grouped_allreduce_async_")
    got = hvd.grouped_allreduce([values(RANK, 125, (5,), torch.float64)])
    check(same(got[0], expected_allreduce(125, (5,), torch.float64, "average")),
          "grouped average")


# ---- Allgather and broadcast ----

def allgather():
    for seed, dtype in ((130, torch.float32), (131, torch.int64), (132, torch.float16),
                        (133, torch.int32), (134, torch.float64)):
        t = values(RANK, seed, (RANK + 1, 3), dtype)
        want = torch.cat([values(r, seed, (r + 1, 3), dtype) for r in range(SIZE)])
        got = hvd.allgather(t)
        check(same(got, want), f"allgather {dtype}: got {got} want {want}")
    t = values(RANK, 135, (RANK + 2, 2, 2), torch.float32)
    got = hvd.synchronize(hvd.allgather_async(t, name="gather.async"))
    want = torch.cat([values(r, 135, (r + 2, 2, 2), torch.float32) for r in range(SIZE)])
    check(same(got, want), "allgather_async")
    # A rank with no rows.
    rows = 0 if RANK == 0 else 2
    got = hvd.allgather(torch.full((rows, 2), RANK, dtype=torch.int32), name="gather.empty")
    want = torch.cat([torch.full((0 if r == 0 else 2, 2), r, dtype=torch.int32)
                      for r in range(SIZE)])
    check(same(got, want), f"allgather with an empty rank: {got}")
    # Types the data plane does not know travel as bytes.
    got = hvd.allgather(torch.tensor([RANK % 2 == 0]))
    check(same(got, torch.tensor([r % 2 == 0 for r in range(SIZE)])), f"allgather bool: {got}")
    got = hvd.allgather(torch.tensor([[RANK * 1000, -RANK]], dtype=torch.int16))
    check(same(got, torch.tensor([[r * 1000, -r] for r in range(SIZE)], dtype=torch.int16)),
          "allgather int16")
    a = values(RANK, 136, (RANK + 1,), torch.float32)
    b = values(RANK, 137, (1, 2), torch.int64)
    got = hvd.grouped_allgather([a, b])
    check(len(got) == 2
          and same(got[0], torch.cat([values(r, 136, (r + 1,), torch.float32)
                                      for r in range(SIZE)]))
          and same(got[1], torch.cat([values(r, 137, (1, 2), torch.int64) for r in range(SIZE)])),
          "grouped_allgather")


def broadcast():
    for root in range(SIZE):
        for seed, dtype in ((140, torch.float32), (141, torch.int64), (142, torch.float16)):
            t = values(RANK, seed + 10 * root, (2, 3), dtype)
            want = values(root, seed + 10 * root, (2, 3), dtype)
            got = hvd.broadcast(t, root_rank=root)
            check(same(got, want), f"broadcast {dtype} from {root}")
            check(same(t, values(RANK, seed + 10 * root, (2, 3), dtype)),
                  f"broadcast {dtype} from {root} modified its input")
        t = values(RANK, 150 + root, (5,), torch.float64)
        check(hvd.broadcast_(t, root) is t and same(t, values(root, 150 + root, (5,), torch.float64)),
              f"broadcast_ from {root}")
        t = values(RANK, 160 + root, (4,), torch.int32)
        hvd.synchronize(hvd.broadcast_async_(t, root, name=f"bcast.async_.{root}"))
        check(same(t, values(root, 160 + root, (4,), torch.int32)), f"broadcast_async_ {root}")
        t = values(RANK, 170 + root, (3, 1), torch.float32)
        got = hvd.synchronize(hvd.broadcast_async(t, root))
        check(same(got, values(root, 170 + root, (3, 1), torch.float32)),
              f"broadcast_async from {root}")
        got = hvd.broadcast(torch.tensor([RANK == root, RANK != root]), root)
        check(same(got, torch.tensor([True, False])), f"broadcast bool from {root}")


def objects():
    root = SIZE - 1
    obj = {"rank": RANK, "items": list(range(RANK + 3)), "text": "x" * (RANK * 100)}
    got = hvd.broadcast_object(obj, root_rank=root)
    check(got == {"rank": root, "items": list(range(root + 3)), "text": "x" * (root * 100)},
          f"broadcast_object: {got}")
    got = hvd.allgather_object((RANK, "r" * RANK))
    check(got == [(r, "r" * r) for r in range(SIZE)], f"allgather_object: {got}")


# ---- Parameters and optimizer state ----

def make_model():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def checksum_equal_everywhere(tensors, what):
    """Every rank holds bit-identical tensors: the allgathered SHA-256 of their bytes agree."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().view(torch.uint8).numpy().tobytes()
                 if t.dim() > 0 else t.detach().reshape(1).view(torch.uint8).numpy().tobytes())
    digest = torch.tensor(list(h.digest()), dtype=torch.uint8).view(1, -1)
    gathered = hvd.allgather(digest, name=f"checksum.{what}")
    check(all(torch.equal(gathered[r], gathered[0]) for r in range(SIZE)),
          f"{what}: ranks differ after the broadcast")


def broadcast_parameters_and_state():
    torch.manual_seed(1000 + RANK)  # different weights per rank
    model = make_model()
    root_model = (torch.manual_seed(1000 + 0), make_model())[1]
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    check(all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                root_model.state_dict().values())),
          "broadcast_parameters(state_dict) did not give rank 0's weights")
    checksum_equal_everywhere(list(model.state_dict().values()), "parameters")

    torch.manual_seed(2000 + RANK)
    other = make_model()
    hvd.broadcast_parameters(list(other.named_parameters()), root_rank=SIZE - 1)
    checksum_equal_everywhere(list(other.parameters()), "named_parameters")

    # Adam with a rank-dependent learning rate and a step on rank-dependent data: its state
    # (exp_avg, exp_avg_sq, step) and options differ until broadcast.
    for make_opt in (lambda p: torch.optim.Adam(p, lr=0.001 * (RANK + 1), betas=(0.9, 0.99)),
                     lambda p: torch.optim.SGD(p, lr=0.1 * (RANK + 1), momentum=0.5 + 0.1 * RANK)):
        opt = make_opt(model.parameters())
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(RANK))
        model(x).pow(2).mean().backward()
        opt.step()
        root = SIZE - 1
        hvd.broadcast_optimizer_state(opt, root_rank=root)
        name = type(opt).__name__
        state = [v for s in opt.state_dict()["state"].values() for v in s.values()
                 if torch.is_tensor(v)]
        check(len(state) > 0, f"{name}: no state")
        checksum_equal_everywhere(state, f"{name} state")
        group = opt.param_groups[0]
        if name == "Adam":
            check(group["lr"] == 0.001 * (root + 1) and group["betas"] == (0.9, 0.99),
                  f"Adam options not broadcast: {group['lr']} {group['betas']}")
        else:
            check(group["lr"] == 0.1 * (root + 1) and group["momentum"] == 0.5 + 0.1 * root,
                  f"SGD options not broadcast: {group['lr']} {group['momentum']}")
        opt.zero_grad()

    # A new optimizer: its state is created (one step on zero gradients), then broadcast.
    fresh_model = make_model()
    hvd.broadcast_parameters(fresh_model.state_dict(), root_rank=0)
    fresh = torch.optim.Adam(fresh_model.parameters(), lr=0.01 * (RANK + 1))
    hvd.broadcast_optimizer_state(fresh, root_rank=0)
    check(len(fresh.state_dict()["state"]) == 4, "fresh Adam state was not created")
    check(fresh.param_groups[0]["lr"] == 0.01, "fresh Adam lr not broadcast")
    checksum_equal_everywhere([v for s in fresh.state_dict()["state"].values()
                               for v in s.values() if torch.is_tensor(v)], "fresh Adam state")


# ---- Errors ----

def errors():
    raises(hvd.HorovodInternalError,
           lambda: hvd.allreduce(torch.zeros(RANK + 1), name="bad.shape"),
           "Mismatched allreduce tensor shapes for tensor 'bad.shape'")
    raises(hvd.HorovodInternalError,
           lambda: hvd.allreduce(torch.zeros(3, dtype=torch.float32 if RANK == 0
                                             else torch.float64), name="bad.dtype"),
           "Mismatched", "bad.dtype", "float32", "float64")
    raises(hvd.HorovodInternalError,
           lambda: hvd.broadcast(torch.zeros(2), root_rank=RANK, name="bad.root"),
           "Mismatched broadcast root ranks for tensor 'bad.root'")
    raises(hvd.HorovodInternalError,
           lambda: hvd.allreduce(torch.ones(2), op=hvd.Sum if RANK == 0 else hvd.Max,
                                 name="bad.op"),
           "Mismatched", "bad.op")
    raises(hvd.HorovodInternalError,
           lambda: hvd.broadcast(torch.zeros(2), root_rank=SIZE, name="bad.root.range"),
           "root_rank", "out of bounds")
    raises(hvd.HorovodInternalError,
           lambda: hvd.allgather(torch.zeros(1, RANK + 1), name="bad.gather"),
           "Mismatched", "bad.gather")
    # A name already in flight is refused at once. Each rank first enqueues a name only it has
    # submitted so far (so that it cannot complete yet), then the same name again.
    if SIZE > 1:
        duplicate_names()
    # The job goes on after errors.
    got = hvd.allreduce(torch.ones(3), op=hvd.Sum, name="after.errors")
    check(same(got, torch.full((3,), float(SIZE))), "allreduce after errors")


def duplicate_names():
    mine = torch.full((2,), float(RANK))
    first = hvd.allreduce_async(mine, name=f"dup.{RANK}", op=hvd.Sum)
    # As Horovod: a ValueError at the call, before anything is enqueued.
    raises(ValueError, lambda: hvd.allreduce_async(mine, name=f"dup.{RANK}", op=hvd.Sum),
           f"Tensor 'dup.{RANK}' is already in flight on this rank: requested to allreduce")
    raises(ValueError, lambda: hvd.broadcast_async(mine, root_rank=0, name=f"dup.{RANK}"),
           "with the same name as another tensor that is currently being processed")
    others = {r: hvd.allreduce_async(torch.full((2,), float(RANK)), name=f"dup.{r}", op=hvd.Sum)
              for r in range(SIZE) if r != RANK}
    total = float(SIZE * (SIZE - 1) // 2)
    check(same(hvd.synchronize(first), torch.full((2,), total)), "the first 'dup' failed")
    for r, h in others.items():
        check(same(hvd.synchronize(h), torch.full((2,), total)), f"'dup.{r}' failed")


# ---- DistributedOptimizer ----

def parity(steps=4, backward_passes=1, compression=hvd.Compression.none, tolerance=1e-5,
           groups=None, make_opt=None, what="parity"):
    """N steps on every rank with batch b each == one process with batch size*b."""
    torch.manual_seed(1234)
    model = make_model()
    reference = copy.deepcopy(model)
    make_opt = make_opt or (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9))
    opt = hvd.DistributedOptimizer(make_opt(model.parameters()),
                                   named_parameters=model.named_parameters(),
                                   compression=compression,
                                   backward_passes_per_step=backward_passes, groups=groups)
    reference_opt = make_opt(reference.parameters())
    b = 4
    for step in range(steps):
        opt.zero_grad()
        reference_opt.zero_grad()
        for k in range(backward_passes):
            g = torch.Generator().manual_seed(100 * step + k)
            x = torch.randn(SIZE * b, 8, generator=g)
            y = torch.randn(SIZE * b, 1, generator=g)
            mine = slice(RANK * b, (RANK + 1) * b)
            F.mse_loss(model(x[mine]), y[mine]).backward()
            F.mse_loss(reference(x), y).backward()
        opt.step()
        reference_opt.step()
    worst = max((p - q).abs().max().item()
                for p, q in zip(model.parameters(), reference.parameters()))
    if os.environ.get("TORCH_API_CHECKS_VERBOSE"):
        print(f"{what}: largest difference from one process {worst:.3g}", flush=True)
    check(worst <= tolerance, f"{what}: parameters differ from one process by {worst} "
                              f"(tolerance {tolerance})")
    checksum_equal_everywhere(list(model.parameters()), what)
    return opt, model


def distributed_optimizer_parity():
    parity(what="SGD parity")
    parity(backward_passes=2, what="backward_passes_per_step=2 parity")
    parity(groups=2, what="groups=2 parity")
    parity(make_opt=lambda p: torch.optim.Adam(p, lr=0.01), what="Adam parity")
    parity(compression=hvd.Compression.fp16, tolerance=2e-3, what="fp16 compression parity")
    # Gradients live in the shared arena after the first step (with more than one rank: with one,
    # Horovod's optimizer registers no hooks and reduces nothing).
    opt, model = parity(steps=1, what="arena parity")
    check(SIZE == 1 or all(len(opt._arena_grads) == 4 and p.grad.data_ptr() == opt._arena_grads[p].data_ptr()
              for p in model.parameters()), "gradients are not in the arena")


def distributed_optimizer_misuse():
    model = make_model()
    params = list(model.named_parameters())
    raises(ValueError, lambda: hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=[("same", p) for _, p in params]),
        "Parameter names in named_parameters must be unique", "same")
    raises(ValueError, lambda: hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=params[:2]),
        "one or more model parameters were not named")
    raises(ValueError, lambda: hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=[p for _, p in params]),
        "named_parameters should be a sequence of tuples")
    raises(ValueError, lambda: hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Sum, gradient_predivide_factor=2.0),
        "gradient_predivide_factor not supported with op != Average")

    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(7))
    model(x).sum().backward()
    raises(AssertionError, lambda: model(x).sum().backward(),
           "Gradients were computed more than backward_passes_per_step times")
    raises(AssertionError, opt.zero_grad, "optimizer.zero_grad() was called after loss.backward()")
    opt.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.step()
    check(any("optimizer.step() called without optimizer.skip_synchronize()" in str(w.message)
              for w in caught), "step() after synchronize() did not warn")
    opt.zero_grad()
    model(x).sum().backward()
    opt.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with opt.skip_synchronize():
            opt.step()
    check(not caught, f"skip_synchronize() still warned: {[str(w.message) for w in caught]}")

    # gradient_predivide_factor: the same average.
    torch.manual_seed(5)
    m1 = make_model()
    m2 = copy.deepcopy(m1)
    o1 = hvd.DistributedOptimizer(torch.optim.SGD(m1.parameters(), lr=0.1),
                                  named_parameters=[("p1." + n, p) for n, p in m1.named_parameters()])
    o2 = hvd.DistributedOptimizer(torch.optim.SGD(m2.parameters(), lr=0.1),
                                  named_parameters=[("p2." + n, p) for n, p in m2.named_parameters()],
                                  gradient_predivide_factor=2.0)
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(RANK))
    m1(x).pow(2).sum().backward()
    m2(x).pow(2).sum().backward()
    o1.synchronize()
    o2.synchronize()
    worst = max((p.grad - q.grad).abs().max().item() for p, q in zip(m1.parameters(),
                                                                     m2.parameters()))
    check(worst <= 1e-6, f"gradient_predivide_factor changed the average by {worst}")


# ---- Gradients of the collectives ----

def autograd():
    def weights(rank, seed, shape):
        return values(rank, seed, shape, torch.float32)

    def mean_over_ranks(seed, shape):
        exact = torch.stack([weights(r, seed, shape).double() for r in range(SIZE)]).sum(0)
        return scale_like_daemon(exact, 1.0 / SIZE, torch.float32)

    # allreduce: the gradient is the same allreduce of the output's gradient.
    for op, seed in ((hvd.Average, 200), (hvd.Sum, 201)):
        x = values(RANK, seed, (3, 2), torch.float32).requires_grad_()
        y = hvd.allreduce(x, op=op, name=f"grad.allreduce.{seed}")
        (y * weights(RANK, seed + 50, (3, 2))).sum().backward()
        if op == hvd.Average:
            want = mean_over_ranks(seed + 50, (3, 2))
        else:
            want = torch.stack([weights(r, seed + 50, (3, 2)) for r in range(SIZE)]).sum(0)
        check(same(x.grad, want), f"allreduce op {op} gradient: {x.grad} want {want}")

    # grouped allreduce.
    xs = [values(RANK, 210 + i, (2,), torch.float32).requires_grad_() for i in range(2)]
    ys = hvd.grouped_allreduce(xs, name="grad.grouped")
    sum((y * weights(RANK, 215 + i, (2,))).sum() for i, y in enumerate(ys)).backward()
    check(all(same(x.grad, mean_over_ranks(215 + i, (2,))) for i, x in enumerate(xs)),
          "grouped allreduce gradient")

    # allgather: this rank's rows of the average of the outputs' gradients.
    rows = RANK + 1
    total = SIZE * (SIZE + 1) // 2
    x = values(RANK, 220, (rows, 2), torch.float32).requires_grad_()
    y = hvd.allgather(x, name="grad.allgather")
    (y * weights(RANK, 221, (total, 2))).sum().backward()
    offset = RANK * (RANK + 1) // 2
    want = mean_over_ranks(221, (total, 2))[offset:offset + rows]
    check(same(x.grad, want), f"allgather gradient: {x.grad} want {want}")

    # broadcast: the root gets the average of the outputs' gradients, the others zero.
    root = SIZE - 1
    x = values(RANK, 230, (4,), torch.float32).requires_grad_()
    y = hvd.broadcast(x, root, name="grad.broadcast")
    (y * weights(RANK, 231, (4,))).sum().backward()
    want = mean_over_ranks(231, (4,)) if RANK == root else torch.zeros(4)
    check(same(x.grad, want), f"broadcast gradient: {x.grad} want {want}")


# ---- Topology, capabilities, join, barrier, shutdown/init ----

def topology_and_capabilities():
    check(hvd.size() == int(os.environ["HOROVOD_SIZE"]), "size")
    check(hvd.rank() == int(os.environ["HOROVOD_RANK"]), "rank")
    check(hvd.local_rank() == int(os.environ["HOROVOD_LOCAL_RANK"]), "local_rank")
    check(hvd.local_size() == int(os.environ["HOROVOD_LOCAL_SIZE"]), "local_size")
    check(hvd.cross_rank() == int(os.environ["HOROVOD_CROSS_RANK"]), "cross_rank")
    check(hvd.cross_size() == int(os.environ["HOROVOD_CROSS_SIZE"]), "cross_size")
    local_sizes = hvd.allgather_object(hvd.local_size())
    check(hvd.is_homogeneous() == (len(set(local_sizes)) == 1),
          f"is_homogeneous() {hvd.is_homogeneous()} with local sizes {local_sizes}")
    check(hvd.gloo_built() and hvd.gloo_enabled(), "gloo")
    check(not any(f() for f in (hvd.mpi_built, hvd.ccl_built, hvd.rocm_built, hvd.mpi_enabled,
                                hvd.mpi_threads_supported)),
          "capabilities that are not built")
    # NCCL/CUDA: as this build has them (the module says whether CUDA and NCCL were found).
    from ringmaster import _ringmaster
    check(hvd.cuda_built() == bool(_ringmaster.CUDA_BUILT), "cuda built")
    # Horovod's nccl_built() is NCCL's version code (an int, 0 without NCCL).
    check(type(hvd.nccl_built()) is int and bool(hvd.nccl_built()) == hvd.cuda_built()
          and (hvd.nccl_built() == 0 or hvd.nccl_built() >= 2000), "nccl built: version code")
    check([hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product] == [0, 1, 2, 3, 4, 5],
          "op constants")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hvd.start_timeline("/tmp/timeline.json")
        hvd.stop_timeline()
    check(len(caught) == 2 and "job option" in str(caught[0].message), "timeline warnings")


def join_and_barrier():
    # Rank 0 allreduces while the others have joined: they contribute zeros; rank 0 joins last.
    if RANK == 0:
        got = hvd.allreduce(torch.ones(3), op=hvd.Sum, name="while.joined")
        check(same(got, torch.ones(3)), f"allreduce while the others joined: {got}")
    last = hvd.join()
    check(last == 0, f"join() returned {last}, want 0")
    hvd.barrier()
    hvd.barrier()


def shutdown_then_init():
    hvd.shutdown()
    check(not hvd.is_initialized(), "is_initialized() after shutdown()")
    raises(ValueError, hvd.size, "Horovod has not been initialized")
    raises(ValueError, lambda: hvd.allreduce(torch.ones(1)), "Horovod has not been initialized")
    hvd.init()
    check(hvd.is_initialized(), "is_initialized() after init()")
    got = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after.reinit")
    check(same(got, torch.full((2,), float(SIZE))), "allreduce after shutdown() and init()")


def main():
    global RANK, SIZE
    raises(ValueError, hvd.rank, "Horovod has not been initialized")
    check(not hvd.is_initialized(), "initialized before init()")
    hvd.init()
    RANK, SIZE = hvd.rank(), hvd.size()
    rank_checks.rank = RANK
    if SIZE < 2:
        print("torch_api_checks: run it with at least 2 ranks (mismatches need two)", flush=True)
        return 2
    for fn in (allreduce_matrix, allreduce_unnamed_and_defaults, allreduce_scaling_and_types,
               grouped_allreduce, allgather, broadcast, objects, broadcast_parameters_and_state,
               errors, distributed_optimizer_parity, distributed_optimizer_misuse, autograd,
               topology_and_capabilities, join_and_barrier, shutdown_then_init):
        section(fn)
    return rank_checks.finish("torch_api_checks")


if __name__ == "__main__":
    sys.exit(main())
