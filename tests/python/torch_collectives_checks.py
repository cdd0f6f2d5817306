"""Run as every rank of a job (`ringmaster local --np N -- python3 torch_collectives_checks.py`):
checks the collectives ringmaster.torch composes (reducescatter, grouped reducescatter, alltoall,
sparse allreduce, Adasum and its optimizer) against exact expected values computed from every
rank's deterministic inputs, then runs 300 operations in which every tenth is a deliberate error of
each kind, checking that every rank concerned gets the error and that every other result is exact.

Needs at least 2 ranks. Prints one line per failure and "torch_collectives_checks: rank R: N checks
passed" (or "... F of N checks failed"); exits 0 only if every check passed.
"""
import os
import sys

import torch

import ringmaster.torch as hvd
import rank_checks
import torch_api_checks as base
from torch_api_checks import check, raises, same, section, values

RANK = SIZE = 0


def rows_of(dim0, rank):
    """Horovod's split of a first dimension: dim0 // size rows, one more on the first dim0 % size
    ranks; (start, count)."""
    q, r = divmod(dim0, SIZE)
    return rank * q + min(rank, r), q + (1 if rank < r else 0)


# ---- Reducescatter ----

def reducescatter():
    seed = 500
    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64):
        for op, op_name in ((hvd.Sum, "sum"), (hvd.Average, "average")):
            for dim0 in (2 * SIZE, 2 * SIZE + 1, 1):
                seed += 1
                shape = (dim0, 3)
                full = base.expected_allreduce(seed, shape, dtype, op_name)
                start, count = rows_of(dim0, RANK)
                got = hvd.reducescatter(values(RANK, seed, shape, dtype), op=op)
                check(same(got, full.narrow(0, start, count)),
                      f"reducescatter {op_name} {dtype} {shape}: {got}")
    # Async, named, scaled.
    t = values(RANK, 600, (SIZE + 1, 2), torch.float32)
    h = hvd.reducescatter_async(t, name="rs.scaled", op=hvd.Sum, prescale_factor=2.0,
                                postscale_factor=0.5)
    start, count = rows_of(SIZE + 1, RANK)
    want = base.expected_allreduce(600, (SIZE + 1, 2), torch.float32, "sum")
    check(same(hvd.synchronize(h), want.narrow(0, start, count)), "reducescatter async scaled")
    check(same(t, values(RANK, 600, (SIZE + 1, 2), torch.float32)), "reducescatter input kept")
    # Grouped: each tensor split on its own.
    shapes = [(2 * SIZE, 2), (SIZE + 2,)]
    got = hvd.grouped_reducescatter([values(RANK, 610 + i, s, torch.float64)
                                     for i, s in enumerate(shapes)], op=hvd.Sum)
    for i, s in enumerate(shapes):
        start, count = rows_of(s[0], RANK)
        want = base.expected_allreduce(610 + i, s, torch.float64, "sum").narrow(0, start, count)
        check(same(got[i], want), f"grouped reducescatter tensor {i}")
    # The gradient, as Horovod's: the allgather of every rank's part's gradient, times the size
    # for Sum, as is for Average; the grouped form's each tensor alike.
    for op, scale in ((hvd.Sum, float(SIZE)), (hvd.Average, 1.0)):
        x = values(RANK, 620, (2 * SIZE + 1, 2), torch.float64).requires_grad_()
        (hvd.reducescatter(x, op=op) * (RANK + 1)).sum().backward()
        want = torch.cat([torch.full((rows_of(2 * SIZE + 1, r)[1], 2), float(r + 1))
                          for r in range(SIZE)]).double() * scale
        check(same(x.grad, want), f"reducescatter gradient (op {op}): {x.grad}")
        xs = [values(RANK, 630 + i, (SIZE + i, 3), torch.float64).requires_grad_()
              for i in range(2)]
        parts = hvd.grouped_reducescatter(xs, op=op)
        sum(((p * (RANK + 1 + i)).sum() for i, p in enumerate(parts))).backward()
        for i, x in enumerate(xs):
            want = torch.cat([torch.full((rows_of(SIZE + i, r)[1], 3), float(r + 1 + i))
                              for r in range(SIZE)]).double() * scale
            check(same(x.grad, want), f"grouped reducescatter gradient {i} (op {op}): {x.grad}")
    raises(ValueError, lambda: hvd.reducescatter(torch.ones(4), op=hvd.Max),
           "reducescatter supports op=Average and op=Sum, not Max")
    raises(ValueError, lambda: hvd.reducescatter(torch.tensor(1.0)), "at least one dimension")


# ---- Alltoall ----

def rows_from(src, count, first):
    """Rows `first`.. `first + count` of rank src's alltoall input: row i is src * 1000 + i."""
    return (src * 1000 + torch.arange(first, first + count, dtype=torch.float64)).view(-1, 1) \
        .expand(-1, 2).contiguous()


def splits_of(src):
    return [(src + dst) % 3 for dst in range(SIZE)]


def alltoall():
    # Equal splits: two rows to every rank.
    x = rows_from(RANK, 2 * SIZE, 0)
    got = hvd.alltoall(x)
    want = torch.cat([rows_from(src, 2, 2 * RANK) for src in range(SIZE)])
    check(same(got, want), f"alltoall equal splits: {got}")
    # Explicit splits, some empty; the received splits come back as int32.
    mine = splits_of(RANK)
    x = rows_from(RANK, sum(mine), 0)
    got, received = hvd.alltoall(x, splits=torch.tensor(mine, dtype=torch.int32))
    want = torch.cat([rows_from(src, splits_of(src)[RANK], sum(splits_of(src)[:RANK]))
                      for src in range(SIZE)])
    check(same(got, want), f"alltoall with splits: {got}")
    check(same(received, torch.tensor([splits_of(s)[RANK] for s in range(SIZE)],
                                      dtype=torch.int32)), f"received splits {received}")
    # Async: synchronize gives (output, received splits); splits as a list.
    got, received = hvd.synchronize(hvd.alltoall_async(x, splits=mine, name="a2a.named"))
    check(same(got, want) and received.dtype == torch.int32, "alltoall async")
    # The gradient goes back the way the rows came.
    x = rows_from(RANK, sum(mine), 0).requires_grad_()
    out, _ = hvd.alltoall(x, splits=mine)
    (out * (RANK + 1)).sum().backward()
    want = torch.cat([torch.full((n, 2), float(dst + 1)) for dst, n in enumerate(mine)]).double()
    check(same(x.grad, want), f"alltoall gradient: {x.grad}")
    raises(ValueError, lambda: hvd.alltoall(torch.ones(2 * SIZE + 1)),
           f"{2 * SIZE + 1} rows do not divide among {SIZE} ranks")
    raises(ValueError, lambda: hvd.alltoall(torch.ones(3), splits=[1] * (SIZE + 1)),
           f"splits has {SIZE + 1} entries; alltoall needs one per rank ({SIZE})")
    raises(ValueError, lambda: hvd.alltoall(torch.ones(3), splits=[5] + [0] * (SIZE - 1)),
           "add up to 5 rows but the tensor's first dimension is 3")


# ---- Sparse ----

def sparse():
    # Rank r holds r + 1 at (r, 0) and 1 at (0, 1): the sum repeats (0, 1) once per rank.
    def mine(r):
        return torch.sparse_coo_tensor(torch.tensor([[r, 0], [0, 1]]),
                                       torch.tensor([r + 1.0, 1.0]), (SIZE, 2))

    dense_sum = sum(mine(r).to_dense() for r in range(SIZE))
    h = hvd.sparse_allreduce_async(mine(RANK), name="sparse.sum", op=hvd.Sum)
    got = h()  # Horovod's handle is called
    check(got.is_sparse and same(got.to_dense(), dense_sum), f"sparse sum {got}")
    check(got._nnz() == 2 * SIZE, "sparse sum keeps every rank's entries (uncoalesced)")
    h = hvd.sparse_allreduce_async(mine(RANK), name="sparse.avg", op=hvd.Average)
    got = hvd.synchronize(h)  # ... or synchronized
    check(same(got.to_dense(), dense_sum / SIZE), "sparse average")
    # The optimizer's sparse path (sparse_as_dense=False): an embedding with sparse gradients.
    for sparse_as_dense in (False, True):
        torch.manual_seed(3)
        emb = torch.nn.Embedding(6, 2, sparse=True)
        w0 = emb.weight.detach().clone()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.5),
                                       named_parameters=emb.named_parameters(),
                                       sparse_as_dense=sparse_as_dense)
        emb(torch.tensor([RANK, RANK, 5])).sum().backward()
        opt.step()
        # Dense: the daemon's average of the summed counts. Sparse: every rank's entries (in
        # rank order), each divided by the size, applied by the same SGD step to the start.
        counts = torch.zeros(6)
        for r in range(SIZE):
            for i in (r, r, 5):
                counts[i] += 1
        if sparse_as_dense:
            want = w0 - 0.5 * (counts * torch.tensor(1.0 / SIZE)).view(6, 1).expand(6, 2)
        else:
            index = torch.tensor([[i for r in range(SIZE) for i in (r, r, 5)]])
            grad = torch.sparse_coo_tensor(index, torch.ones(3 * SIZE, 2) / SIZE, (6, 2))
            ref = torch.nn.Parameter(w0.clone())
            ref.grad = grad
            torch.optim.SGD([ref], lr=0.5).step()
            want = ref.detach()
        check(same(emb.weight.detach(), want),
              f"sparse gradients (sparse_as_dense={sparse_as_dense}): {emb.weight}")


# ---- Adasum ----

def reference_adasum(vectors):
    """The definition, written out on its own: pairs of neighbours level by level, an odd one out
    carried up; each pair a * (1 - a.b / 2|a|^2) + b * (1 - a.b / 2|b|^2) in float64."""
    while len(vectors) > 1:
        nxt = []
        for i in range(0, len(vectors) - 1, 2):
            a, b = vectors[i], vectors[i + 1]
            ab = float((a * b).sum())
            aa, bb = float((a * a).sum()), float((b * b).sum())
            ca = 1.0 - ab / (2 * aa) if aa >= 1e-8 else 1.0
            cb = 1.0 - ab / (2 * bb) if bb >= 1e-8 else 1.0
            nxt.append(ca * a + cb * b)
        if len(vectors) % 2:
            nxt.append(vectors[-1])
        vectors = nxt
    return vectors[0]


def adasum():
    for dtype in (torch.float32, torch.float64):
        t = values(RANK, 700, (3, 4), dtype)
        got = hvd.allreduce(t, op=hvd.Adasum)
        want = reference_adasum([values(r, 700, (3, 4), dtype).double().flatten()
                                 for r in range(SIZE)]).to(dtype).view(3, 4)
        check(same(got, want), f"Adasum {dtype}: {got} != {want}")
    # Identical vectors combine to themselves; orthogonal ones add.
    got = hvd.allreduce(torch.full((4,), 2.0), op=hvd.Adasum)
    check(same(got, torch.full((4,), 2.0)), f"Adasum of identical vectors: {got}")
    e = torch.zeros(SIZE)
    e[RANK] = 1.0
    check(same(hvd.allreduce(e, op=hvd.Adasum), torch.ones(SIZE)), "Adasum of orthogonal ones")
    # Grouped: each tensor combined on its own.
    got = hvd.grouped_allreduce([values(RANK, 710, (5,), torch.float64),
                                 values(RANK, 711, (2, 2), torch.float64)], op=hvd.Adasum)
    for i, s in enumerate(((5,), (2, 2))):
        want = reference_adasum([values(r, 710 + i, s, torch.float64).flatten()
                                 for r in range(SIZE)]).view(s)
        check(same(got[i], want), f"grouped Adasum tensor {i}")
    raises(ValueError, lambda: hvd.allreduce(torch.ones(2, dtype=torch.int32), op=hvd.Adasum),
           "Adasum reduces floating-point tensors")
    # The Adasum optimizer: each rank's SGD step, combined.
    torch.manual_seed(5)
    model = torch.nn.Linear(3, 1)
    start = [p.detach().clone() for p in model.parameters()]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), op=hvd.Adasum)
    x = values(RANK, 720, (4, 3), torch.float32)
    model(x).sum().backward()
    opt.step()
    for i, (name, p) in enumerate(model.named_parameters()):
        deltas = []
        for r in range(SIZE):
            xr = values(r, 720, (4, 3), torch.float32)
            grad = xr.sum(0).view(1, 3) if name == "weight" else torch.tensor([4.0])
            deltas.append((start[i].clone().add_(grad, alpha=-0.1) - start[i]).double().flatten())
        want = start[i] + reference_adasum(deltas).to(torch.float32).view(start[i].shape)
        check(same(p.detach(), want), f"Adasum optimizer {name}: {p.detach()} != {want}")


# ---- Horovod's arithmetic ----

def horovod_scaling():
    """Integers scaled in float64 and truncated toward zero (the prescale on each rank, the
    postscale over the size after the sum); float32 in float32; float16 in float32."""
    for dtype in (torch.int32, torch.int64, torch.uint8):
        for pre, post in ((1.5, 0.5), (1.0, 1.0), (0.3, 3.0)):
            seed = 800
            got = hvd.allreduce(values(RANK, seed, (8,), dtype), op=hvd.Average,
                                prescale_factor=pre, postscale_factor=post)
            total = sum((values(r, seed, (8,), dtype).double() * pre).trunc()
                        for r in range(SIZE))
            want = (total * (post / SIZE)).trunc().to(dtype)
            check(same(got, want), f"Average of {dtype} x{pre} x{post}: {got} != {want}")
    t = values(RANK, 801, (8,), torch.float16)
    # Inputs and prescaled values whose sums float16 holds exactly (the data plane's partial
    # sums are float16), then one rounding of the postscale computed in float32.
    got = hvd.allreduce(t, op=hvd.Sum, prescale_factor=0.5, postscale_factor=0.3)
    scaled = [(values(r, 801, (8,), torch.float16).float() * torch.tensor(0.5)).half()
              for r in range(SIZE)]
    total = torch.stack([s.float() for s in scaled]).sum(0).half()
    want = (total.float() * torch.tensor(0.3)).half()
    check(same(got, want), f"float16 scaled in float32: {got} != {want}")


# ---- Process sets ----

def process_sets():
    """Two sets, the even ranks and the odd ones, registered while the job runs: every collective
    in a set among its members alone, with a global one between them; the errors; removal."""
    raises(ValueError, lambda: hvd.add_process_set([0]), "HOROVOD_DYNAMIC_PROCESS_SETS=1")
    os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"
    even = hvd.add_process_set([r for r in range(SIZE) if r % 2 == 0])
    odd = hvd.add_process_set(hvd.ProcessSet([r for r in range(SIZE) if r % 2 == 1]))
    check((even.process_set_id, odd.process_set_id) == (1, 2), f"ids {even}, {odd}")
    mine, other = (even, odd) if RANK % 2 == 0 else (odd, even)
    members = mine.ranks
    check(mine.included() and not other.included(), "included()")
    check((mine.size(), mine.rank()) == (len(members), members.index(RANK)), "size() and rank()")
    check(hvd.global_process_set.size() == SIZE and hvd.global_process_set.rank() == RANK,
          "the global set")

    def over(seed, shape, dtype, reduce):
        return reduce(torch.stack([values(r, seed, shape, dtype).double() for r in members]))

    got = hvd.allreduce(values(RANK, 900, (5,), torch.float64), op=hvd.Sum, process_set=mine)
    check(same(got, over(900, (5,), torch.float64, lambda s: s.sum(0))), f"set sum {got}")
    got = hvd.allreduce(values(RANK, 901, (4,), torch.float64), process_set=mine)  # Average
    want = over(901, (4,), torch.float64, lambda s: s.sum(0)) * (1.0 / len(members))
    check(same(got, want), f"set average {got} != {want}")
    # A global collective between set ones.
    got = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="between.sets")
    check(same(got, torch.full((1,), float(SIZE))), "a global allreduce between set ones")
    got = hvd.allgather(torch.full((RANK + 1, 2), float(RANK)), process_set=mine)
    want = torch.cat([torch.full((r + 1, 2), float(r)) for r in members])
    check(same(got, want), f"set allgather {got}")
    root = members[-1]
    got = hvd.broadcast(torch.full((3,), float(RANK)), root_rank=root, process_set=mine)
    check(same(got, torch.full((3,), float(root))), f"set broadcast from rank {root}: {got}")
    got = hvd.grouped_allreduce([torch.full((2,), float(RANK)), torch.ones(3)], op=hvd.Sum,
                                process_set=mine)
    check(same(got[0], torch.full((2,), float(sum(members)))) and
          same(got[1], torch.full((3,), float(len(members)))), "set grouped allreduce")
    got = hvd.reducescatter(torch.arange(float(2 * len(members) + 1)) * 0 + 1.0, op=hvd.Sum,
                            process_set=mine)
    q, rem = divmod(2 * len(members) + 1, len(members))
    rows = q + (1 if mine.rank() < rem else 0)
    check(same(got, torch.full((rows,), float(len(members)))), f"set reducescatter {got}")
    got = hvd.alltoall(torch.full((len(members), 2), float(RANK)), process_set=mine)
    check(same(got, torch.tensor([[float(r)] * 2 for r in members])), f"set alltoall {got}")
    hvd.barrier(process_set=mine)
    check(hvd.broadcast_object({"root": root}, root_rank=root, process_set=mine) == {"root": root},
          "set broadcast_object")
    check(hvd.allgather_object(RANK, process_set=mine) == members, "set allgather_object")
    # The optimizer averages the gradients over the set.
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                   named_parameters=model.named_parameters(), process_set=mine)
    model(torch.full((1, 2), float(RANK + 1))).sum().backward()
    opt.synchronize()
    mean = sum(r + 1.0 for r in members) / len(members)
    check(same(model.weight.grad, torch.full((1, 2), mean)), f"set optimizer {model.weight.grad}")
    with opt.skip_synchronize():
        opt.step()
    # Errors: a set this rank is not in; a set that was never registered.
    raises(ValueError, lambda: hvd.allreduce(torch.ones(1), process_set=other),
           f"rank {RANK} is not in process set {other.process_set_id}")
    raises(ValueError, lambda: hvd.allreduce(torch.ones(1), process_set=hvd.ProcessSet([RANK])),
           "is not registered")
    if len(members) > 1:
        raises(hvd.HorovodInternalError,
               lambda: hvd.allreduce(torch.zeros(RANK + 1), name="set.bad.shape",
                                     process_set=mine),
               "Mismatched allreduce tensor shapes for tensor 'set.bad.shape'")
    first_freed = odd.process_set_id
    check(hvd.remove_process_set(odd) and hvd.remove_process_set(even), "removed")
    check(not hvd.remove_process_set(odd), "removed twice")
    raises(ValueError, lambda: hvd.allreduce(torch.ones(1), process_set=mine), "is not registered")
    # As Horovod: a removed set's id is given to the next set added, the first freed first.
    again = hvd.add_process_set(list(range(SIZE)))
    check(again.process_set_id == first_freed, f"a new set after removal: {again}")
    # Named: the ranks of a set of several issued one more operation above (the mismatch), and
    # automatic names count every operation, as Horovod's.
    got = hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=again, name="every.rank.set")
    check(same(got, torch.full((1,), float(SIZE))), "the set of every rank")
    hvd.remove_process_set(again)
    # More sets over the job's life than a rank keeps communicators for (256): each removal frees
    # its set's communicators, so the 300th set works as the first did.
    for i in range(300):
        pair = hvd.add_process_set([i % SIZE, (i + 1) % SIZE])
        if pair.included():
            got = hvd.allreduce(torch.full((1,), float(i)), op=hvd.Sum, process_set=pair,
                                name=f"churn.{i}")
            if not same(got, torch.full((1,), 2.0 * i)):
                check(False, f"set {pair} of the churn: {got}")
                break
        hvd.remove_process_set(pair)
    else:
        check(True, "300 sets added, used and removed")
    del os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"]


# ---- Join ----

def join_while_others_run():
    """The last rank joins at once; the others run an allreduce (the joined rank contributes
    zeros); an allgather and a broadcast fail on every rank, as in Horovod, and the next allreduce
    works; join() returns the last rank to join."""
    joined = SIZE - 1
    if RANK != joined:
        raises(hvd.HorovodInternalError,
               lambda: hvd.allgather(torch.full((RANK + 1, 2), float(RANK)),
                                     name="joined.allgather"),
               "Allgather is not supported with Join at this time. Specify sparse_to_dense=True "
               "if using DistributedOptimizer (tensor 'joined.allgather'; rank "
               f"{joined} (")
        for root in (0, joined):
            raises(hvd.HorovodInternalError,
                   lambda: hvd.broadcast(torch.full((3,), float(RANK)), root_rank=root,
                                         name=f"joined.broadcast.{root}"),
                   "Broadcast is not supported with Join at this time. (tensor "
                   f"'joined.broadcast.{root}'; rank {joined} (")
        got = hvd.allreduce(torch.ones(2), name="joined.allreduce", op=hvd.Sum)
        check(same(got, torch.full((2,), float(joined))), f"allreduce while joined: {got}")
    last = hvd.join()
    check(last in range(joined),
          f"join() returned {last}: the last to join is one of the ranks that kept running")
    got = hvd.allreduce(torch.ones(1), name="after.join", op=hvd.Sum)
    check(same(got, torch.full((1,), float(SIZE))), "allreduce after join")


# ---- Errors never poison the next operation ----

def three_hundred_ops():
    # Every operation is named: the ranks do not issue the same number of operations (a joined
    # rank skips one), and automatic names, as Horovod's, count every operation issued.
    kinds = ["shape", "dtype", "op", "root", "duplicate", "joined"]
    ok = errors = 0
    for i in range(300):
        seed = 1000 + i
        if i % 10 == 9:
            kind = kinds[(i // 10) % len(kinds)]
            if kind == "shape":
                raises(hvd.HorovodInternalError,
                       lambda: hvd.allreduce(torch.zeros(RANK + 1), name=f"e{i}"),
                       f"Mismatched allreduce tensor shapes for tensor 'e{i}'")
            elif kind == "dtype":
                raises(hvd.HorovodInternalError,
                       lambda: hvd.allreduce(torch.zeros(2, dtype=torch.float32 if RANK == 0
                                                         else torch.float64), name=f"e{i}"),
                       "Mismatched", f"e{i}")
            elif kind == "op":
                raises(hvd.HorovodInternalError,
                       lambda: hvd.allreduce(torch.ones(2), name=f"e{i}",
                                             op=hvd.Sum if RANK == 0 else hvd.Max),
                       "Mismatched", f"e{i}")
            elif kind == "root":
                raises(hvd.HorovodInternalError,
                       lambda: hvd.broadcast(torch.ones(2), root_rank=RANK, name=f"e{i}"),
                       f"Mismatched broadcast root ranks for tensor 'e{i}'")
            elif kind == "duplicate":
                first = hvd.allreduce_async(torch.ones(2), name=f"e{i}.{RANK}", op=hvd.Sum)
                raises(ValueError, lambda: hvd.allreduce_async(torch.ones(2), name=f"e{i}.{RANK}"),
                       f"Tensor 'e{i}.{RANK}' is already in flight on this rank")
                # No rank submits another's name before every rank has tried its duplicate: a
                # rank's first allreduce cannot complete (and leave flight) before its own try.
                hvd.barrier()
                rest = [hvd.allreduce_async(torch.ones(2), name=f"e{i}.{r}", op=hvd.Sum)
                        for r in range(SIZE) if r != RANK]
                for h in [first] + rest:
                    check(same(hvd.synchronize(h), torch.full((2,), float(SIZE))),
                          f"op {i}: the duplicate's own allreduce")
            else:  # a name only rank 0 submits; the others join, contributing zeros
                if RANK == 0:
                    got = hvd.allreduce(torch.full((3,), 5.0), name=f"e{i}", op=hvd.Sum)
                    check(same(got, torch.full((3,), 5.0)), f"op {i}: allreduce while joined")
                last = hvd.join()
                check(last == 0, f"op {i}: join() returned {last}, want 0 (the last to join)")
            errors += 1
            continue
        k = i % 5
        if k == 0:
            got = hvd.allreduce(values(RANK, seed, (4,), torch.float32), op=hvd.Sum, name=f"op{i}")
            good = same(got, base.expected_allreduce(seed, (4,), torch.float32, "sum"))
        elif k == 1:
            got = hvd.allgather(torch.full((RANK + 1, 2), float(RANK)), name=f"op{i}")
            good = same(got, torch.cat([torch.full((r + 1, 2), float(r)) for r in range(SIZE)]))
        elif k == 2:
            root = i % SIZE
            got = hvd.broadcast(torch.full((3,), float(RANK)), root_rank=root, name=f"op{i}")
            good = same(got, torch.full((3,), float(root)))
        elif k == 3:
            start, count = rows_of(SIZE + 1, RANK)
            got = hvd.reducescatter(values(RANK, seed, (SIZE + 1,), torch.float64), op=hvd.Sum,
                                    name=f"op{i}")
            good = same(got, base.expected_allreduce(seed, (SIZE + 1,), torch.float64, "sum")
                        .narrow(0, start, count))
        else:
            got = hvd.alltoall(rows_from(RANK, 2 * SIZE, 0), name=f"op{i}")
            good = same(got, torch.cat([rows_from(src, 2, 2 * RANK) for src in range(SIZE)]))
        check(good, f"op {i} after {errors} deliberate errors: {got}")
        ok += 1
    check((ok, errors) == (270, 30), f"{ok} ops and {errors} errors")


def main():
    global RANK, SIZE
    hvd.init()
    RANK, SIZE = hvd.rank(), hvd.size()
    base.RANK, base.SIZE = RANK, SIZE
    rank_checks.rank = RANK
    if SIZE < 2:
        print("torch_collectives_checks: run it with at least 2 ranks", flush=True)
        return 2
    for fn in (reducescatter, alltoall, sparse, adasum, horovod_scaling, process_sets,
               join_while_others_run,
               three_hundred_ops):
        section(fn)
    return rank_checks.finish("torch_collectives_checks")


if __name__ == "__main__":
    sys.exit(main())
