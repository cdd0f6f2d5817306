"""Run as every rank of a job (`ringmaster local --np N -- <mxnet venv python> mxnet_api_checks.py`):
checks ringmaster.mxnet, Horovod's MXNet API, against exact expected values computed from every
rank's deterministic inputs, one process running every check in sequence as a user's suite does.

- allreduce / allreduce_ / grouped_allreduce(_): Average, Sum, Min, Max, Product over every dtype,
  prescale and postscale, `average=` (its warning, and ValueError with `op=`), Adasum refused;
- asynchronous inside MXNet's engine: allreduce_ returns at once while a peer is late, the wait
  takes the peer's delay; an input dropped while in flight; a failure (mismatched shapes) raised
  as MXNetError at the wait naming both ranks and shapes, and the next operation works;
- broadcast(_) from every root, allgather and grouped_allgather with a first dimension per rank,
  alltoall with and without splits, reducescatter (Average, Sum, Horovod's row split, scalars
  refused), broadcast_object, allgather_object, process sets;
- bad input: a non-NDArray (TypeError), an unsupported dtype (ValueError naming it);
- broadcast_parameters (also deferred initialisation), DistributedTrainer and
  DistributedOptimizer against one process training on the whole batch, fp16 compression,
  num_groups, gradient_predivide_factor, parameters identical on every rank.

Prints one line per failure and "mxnet_api_checks: rank R: N checks passed"; exits 0 only if every
check passed.
"""
import re
import sys
import time
import warnings

import mxnet as mx
import numpy as np

import ringmaster.mxnet as hvd
import rank_checks
from rank_checks import check, raises

RANK = 0
SIZE = 1


DTYPES = ["float32", "float64", "float16", "int32", "int64", "uint8", "int8"]


def rank_input(r, shape, dtype):
    """Rank r's input: small integers (exact in every dtype), different per rank and element."""
    n = int(np.prod(shape))
    return ((np.arange(n) % 5) + r + 1).reshape(shape).astype(dtype)


def expected_reduce(op, shape, dtype, size=None, prescale=1.0, postscale=1.0):
    size = size or SIZE
    inputs = [rank_input(r, shape, dtype).astype(np.float64) * prescale for r in range(size)]
    if op == hvd.Min:
        out = np.minimum.reduce(inputs)
    elif op == hvd.Max:
        out = np.maximum.reduce(inputs)
    elif op == hvd.Product:
        out = np.multiply.reduce(inputs)
    else:
        out = np.add.reduce(inputs)
        if op == hvd.Average:
            out = out / size if np.issubdtype(np.dtype(dtype), np.floating) else \
                np.trunc(out / size)
    return (out * postscale).astype(dtype)


def same(a, b, what, tolerance=0.0):
    a = a.asnumpy() if isinstance(a, mx.nd.NDArray) else np.asarray(a)
    b = np.asarray(b)
    ok = a.shape == b.shape and a.dtype == b.dtype and (
        np.array_equal(a, b) if tolerance == 0 else
        np.allclose(a.astype(np.float64), b.astype(np.float64), atol=tolerance, rtol=0))
    check(ok, f"{what}: got {a.dtype} {a.shape} {a.ravel()[:6]}, expected {b.dtype} {b.shape} "
              f"{b.ravel()[:6]}")


def allreduce_checks():
    ops = [(hvd.Average, "avg"), (hvd.Sum, "sum"), (hvd.Min, "min"), (hvd.Max, "max"),
           (hvd.Product, "prod")]
    for dtype in DTYPES:
        for op, label in ops:
            if op == hvd.Product and dtype in ("uint8", "int8", "float16") and SIZE > 2:
                continue  # overflows
            shape = (3, 4)
            x = mx.nd.array(rank_input(RANK, shape, dtype), dtype=dtype)
            out = hvd.allreduce(x, op=op, name=f"ar.{dtype}.{label}")
            same(out, expected_reduce(op, shape, dtype), f"allreduce {label} {dtype}")
            same(x, rank_input(RANK, shape, dtype), f"allreduce leaves its input ({dtype})")
            y = mx.nd.array(rank_input(RANK, shape, dtype), dtype=dtype)
            returned = hvd.allreduce_(y, op=op, name=f"ar_.{dtype}.{label}")
            check(returned is y, "allreduce_ returns its tensor")
            same(y, expected_reduce(op, shape, dtype), f"allreduce_ {label} {dtype}")
    # Scaling, unnamed, 1-d and 3-d shapes.
    for shape in [(7,), (2, 3, 2)]:
        x = mx.nd.array(rank_input(RANK, shape, "float64"), dtype="float64")
        out = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
        same(out, expected_reduce(hvd.Sum, shape, "float64", prescale=0.5, postscale=3.0),
             f"scaled sum {shape}", 1e-9)
    # average= : deprecated (a warning), and refused beside op=.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = hvd.allreduce(mx.nd.array(rank_input(RANK, (4,), "float32")), average=False,
                            name="ar.average_false")
    same(out, expected_reduce(hvd.Sum, (4,), "float32"), "average=False sums")
    check(any(issubclass(w.category, DeprecationWarning) for w in caught),
          "average= warns that it is deprecated")
    check(raises(ValueError, lambda: hvd.allreduce(mx.nd.ones(2), average=True, op=hvd.Sum),
                 "supersedes average") is not None, "average= and op= together: ValueError")
    check(raises(AssertionError, lambda: hvd.allreduce(mx.nd.ones(2), op=hvd.Adasum),
                 "Adasum") is not None, "Adasum is refused")


def grouped_checks():
    shapes = [(2,), (3, 2), (1,)]
    xs = [mx.nd.array(rank_input(RANK, s, "float32")) for s in shapes]
    outs = hvd.grouped_allreduce(xs, op=hvd.Sum, name="grouped")
    for s, o in zip(shapes, outs):
        same(o, expected_reduce(hvd.Sum, s, "float32"), f"grouped_allreduce {s}")
    returned = hvd.grouped_allreduce_(xs, name="grouped_")
    check(returned is xs, "grouped_allreduce_ returns its list")
    for s, x in zip(shapes, xs):
        same(x, expected_reduce(hvd.Average, s, "float32"), f"grouped_allreduce_ {s}")
    check(hvd.grouped_allreduce([]) == [], "grouped_allreduce of nothing")


def asynchronous_checks():
    # A late peer: rank 0's allreduce_ returns at once; the wait takes the peer's delay.
    delay = 1.0
    x = mx.nd.ones((1000,)) * (RANK + 1)
    if RANK != 0:
        time.sleep(delay)
    started = time.monotonic()
    hvd.allreduce_(x, op=hvd.Sum, name="async.late_peer")
    pushed = time.monotonic() - started
    x.wait_to_read()
    waited = time.monotonic() - started
    if RANK == 0:
        check(pushed < 0.2, f"allreduce_ returned after {pushed:.3f}s, before its peer arrived")
        check(waited > delay * 0.7, f"the wait took {waited:.3f}s, the late peer's delay")
    same(x, np.full((1000,), SIZE * (SIZE + 1) / 2, np.float32), "the late peer's sum")
    # An input that Python drops while its operation is in flight stays alive.
    out = hvd.allreduce(mx.nd.array(rank_input(RANK, (64, 64), "float32")), op=hvd.Sum,
                        name="async.dropped_input")
    import gc
    gc.collect()
    same(out, expected_reduce(hvd.Sum, (64, 64), "float32"), "allreduce of a dropped input")
    # Work queued behind an allreduce in the engine sees its result.
    y = mx.nd.ones((3,)) * (RANK + 1)
    hvd.allreduce_(y, op=hvd.Sum, name="async.chained")
    z = y * 2 + 1
    same(z, np.full((3,), SIZE * (SIZE + 1) + 1, np.float32), "compute after allreduce_")
    # A failure surfaces at the wait as MXNetError, naming the ranks and shapes; the next works.
    bad = mx.nd.ones((2 + RANK,))
    hvd.allreduce_(bad, name="async.mismatch")
    e = raises(mx.base.MXNetError, bad.wait_to_read, "async.mismatch")
    check(e is not None, "mismatched shapes raise MXNetError at the wait")
    if e is not None:
        message = str(e)
        m = re.search(r"rank (\d+) \(local-\d+\) sent \[(\d+)\] but rank (\d+) \(local-\d+\) "
                      r"sent \[(\d+)\]", message)
        check(m is not None and int(m[1]) != int(m[3]) and int(m[2]) == 2 + int(m[1]) and
              int(m[4]) == 2 + int(m[3]),
              f"the mismatch names both ranks, their hosts and shapes: {message[:300]}")
    after = hvd.allreduce(mx.nd.ones((2,)) * (RANK + 1), op=hvd.Sum, name="async.after_failure")
    same(after, np.full((2,), SIZE * (SIZE + 1) / 2, np.float32), "the operation after a failure")


def broadcast_checks():
    for root in range(SIZE):
        for dtype in ("float32", "int64", "uint8"):
            x = mx.nd.array(rank_input(RANK, (2, 3), dtype), dtype=dtype)
            out = hvd.broadcast(x, root_rank=root, name=f"bc.{root}.{dtype}")
            same(out, rank_input(root, (2, 3), dtype), f"broadcast from {root} ({dtype})")
            same(x, rank_input(RANK, (2, 3), dtype), "broadcast leaves its input")
            returned = hvd.broadcast_(x, root_rank=root, name=f"bc_.{root}.{dtype}")
            check(returned is x, "broadcast_ returns its tensor")
            same(x, rank_input(root, (2, 3), dtype), f"broadcast_ from {root} ({dtype})")


def gather_checks():
    x = mx.nd.array(rank_input(RANK, (RANK + 1, 2), "float32"))
    out = hvd.allgather(x, name="ag")
    same(out, np.concatenate([rank_input(r, (r + 1, 2), "float32") for r in range(SIZE)]),
         "allgather with a first dimension per rank")
    outs = hvd.grouped_allgather([x, mx.nd.array([RANK], dtype="int32")], name="gag")
    same(outs[0], np.concatenate([rank_input(r, (r + 1, 2), "float32") for r in range(SIZE)]),
         "grouped_allgather (1)")
    same(outs[1], np.arange(SIZE, dtype=np.int32), "grouped_allgather (2)")
    # alltoall: rank r sends r + d + 1 rows of value 10 r + d to rank d.
    splits = [RANK + d + 1 for d in range(SIZE)]
    rows = np.concatenate([np.full((splits[d], 2), 10 * RANK + d, np.float32) for d in range(SIZE)])
    out, received = hvd.alltoall(mx.nd.array(rows), splits=splits, name="a2a")
    same(out, np.concatenate([np.full((s + RANK + 1, 2), 10 * s + RANK, np.float32)
                              for s in range(SIZE)]), "alltoall with splits")
    same(received, np.array([s + RANK + 1 for s in range(SIZE)], np.int32), "received splits")
    even = mx.nd.array(np.arange(SIZE * 2, dtype=np.float32) + 100 * RANK)
    out = hvd.alltoall(even, name="a2a.even")
    same(out, np.array([100 * s + 2 * RANK + i for s in range(SIZE) for i in range(2)],
                       np.float32), "alltoall without splits")
    # reducescatter: Horovod's split gives the first dim0 % size ranks a row more.
    dim0 = 2 * SIZE + 1
    x = mx.nd.array(rank_input(RANK, (dim0, 3), "float32"))
    for op, label in [(hvd.Average, "avg"), (hvd.Sum, "sum")]:
        out = hvd.reducescatter(x, op=op, name=f"rs.{label}")
        full = expected_reduce(op, (dim0, 3), "float32")
        base, extra = divmod(dim0, SIZE)
        start = RANK * base + min(RANK, extra)
        same(out, full[start:start + base + (1 if RANK < extra else 0)],
             f"reducescatter {label}")
    check(raises(ValueError, lambda: hvd.reducescatter(mx.nd.array(1.0).reshape(())),
                 "scalar") is not None, "reducescatter of a scalar: ValueError")
    check(raises(ValueError, lambda: hvd.reducescatter(x, op=hvd.Max), "Average and Sum")
          is not None, "reducescatter with Max: ValueError")


def object_and_set_checks():
    obj = hvd.broadcast_object({"rank": RANK, "list": [1, 2]} if RANK == 1 else None,
                               root_rank=1, name="obj")
    check(obj == {"rank": 1, "list": [1, 2]}, f"broadcast_object: {obj}")
    everyone = hvd.allgather_object(("rank", RANK), name="objs")
    check(everyone == [("rank", r) for r in range(SIZE)], f"allgather_object: {everyone}")
    # A process set of ranks 0 and 1 (the others stay out of it).
    ps = hvd.add_process_set([0, 1])
    check(ps.process_set_id == 1 and ps.ranks == [0, 1], f"add_process_set: {ps}")
    if ps.included():
        out = hvd.allreduce(mx.nd.ones(3) * (RANK + 1), op=hvd.Sum, name="ps.sum", process_set=ps)
        same(out, np.full((3,), 3, np.float32), "allreduce in a process set")
    else:
        check(raises(ValueError, lambda: hvd.allreduce(mx.nd.ones(3), process_set=ps),
                     "not in process set") is not None, "a rank outside the set is refused")
    check(hvd.remove_process_set(ps) is True, "remove_process_set")


def bad_input_checks():
    check(raises(TypeError, lambda: hvd.allreduce(np.ones(3)), "NDArray", "ndarray") is not None,
          "a numpy array: TypeError naming the type")
    check(raises(ValueError, lambda: hvd.allreduce(mx.nd.ones(3, dtype="bool")), "bool")
          is not None, "a bool NDArray: ValueError naming the dtype")
    same(hvd.allreduce(mx.nd.ones(2), op=hvd.Sum, name="after.bad.input"),
         np.full((2,), SIZE, np.float32), "an allreduce after refused inputs")


def make_net(seed):
    mx.random.seed(seed)
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(8, activation="relu"), mx.gluon.nn.Dense(3))
    net.initialize(mx.init.Xavier())
    return net


def batch(n=12):
    rng = np.random.RandomState(7)
    return rng.randn(n, 5).astype(np.float32), rng.randint(0, 3, n).astype(np.float32)


def params_of(net):
    return [p.data().asnumpy() for _, p in sorted(net.collect_params().items())]


def identical_everywhere(net, what):
    digest = np.concatenate([p.ravel() for p in params_of(net)]).astype(np.float64)
    everyone = hvd.allgather_object(digest.tobytes(), name=f"digest.{what}")
    check(all(d == everyone[0] for d in everyone), f"{what}: parameters identical on every rank")


def train(net, trainer, x, y, steps):
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    for _ in range(steps):
        with mx.autograd.record():
            loss = loss_fn(net(mx.nd.array(x)), mx.nd.array(y))
        loss.backward()
        trainer.step(x.shape[0])
    mx.nd.waitall()


def trainer_checks():
    x, y = batch()
    shard = slice(RANK * len(x) // SIZE, (RANK + 1) * len(x) // SIZE)
    # broadcast_parameters with deferred initialisation: different seeds, rank 0's win.
    net = make_net(seed=100 + RANK)
    hvd.broadcast_parameters(net.collect_params(), root_rank=0, prefix="p.")
    net(mx.nd.array(x[:1]))  # deferred shapes: initialised and broadcast here
    mx.nd.waitall()
    reference = make_net(seed=100)
    reference(mx.nd.array(x[:1]))
    for got, want in zip(params_of(net), params_of(reference)):
        same(got, want, "broadcast_parameters (deferred) gives rank 0's parameters")
    # A dict of NDArrays.
    d = {"a": mx.nd.ones(2) * RANK, "b": mx.nd.ones(3) * (RANK + 5)}
    hvd.broadcast_parameters(d, root_rank=SIZE - 1, prefix="dict.")
    same(d["a"], np.full((2,), SIZE - 1, np.float32), "broadcast_parameters of a dict (a)")
    same(d["b"], np.full((3,), SIZE + 4, np.float32), "broadcast_parameters of a dict (b)")
    check(raises(ValueError, lambda: hvd.broadcast_parameters([1, 2]), "invalid params")
          is not None, "broadcast_parameters of a list: ValueError")

    # DistributedTrainer on each rank's shard == one process on the whole batch (a mean loss
    # over the batch: each rank's step(shard size) then the average equals step(batch)).
    for label, kwargs, tolerance in [
            ("plain", {}, 1e-5), ("groups", {"num_groups": 2}, 1e-5),
            ("predivide", {"gradient_predivide_factor": 2.0}, 1e-5),
            ("fp16", {"compression": hvd.Compression.fp16}, 2e-3)]:
        single = make_net(seed=3)
        single(mx.nd.array(x[:1]))
        train(single, mx.gluon.Trainer(single.collect_params(), "sgd",
                                       {"learning_rate": 0.5}, kvstore=None), x, y, 3)
        net = make_net(seed=3)
        net(mx.nd.array(x[:1]))
        trainer = hvd.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.5},
                                         prefix=f"t.{label}.", **kwargs)
        train(net, trainer, x[shard], y[shard], 3)
        for got, want in zip(params_of(net), params_of(single)):
            same(got, want, f"DistributedTrainer ({label}) == one process", tolerance)
        if label == "plain":
            # Backward wrote steps 2 and 3's gradients into their arena buffers (else the
            # parameters above would differ).
            trained = [p for p in net.collect_params().values() if p.grad_req != "null"]
            check(all(getattr(p, "_ringmaster_grad", None) is p.list_grad()[0]
                      for p in trained), "DistributedTrainer: gradients moved into the arena")
        identical_everywhere(net, f"trainer.{label}")
    # DistributedOptimizer inside a plain gluon.Trainer.
    single = make_net(seed=4)
    single(mx.nd.array(x[:1]))
    train(single, mx.gluon.Trainer(single.collect_params(), "sgd", {"learning_rate": 0.3},
                                   kvstore=None), x, y, 2)
    net = make_net(seed=4)
    net(mx.nd.array(x[:1]))
    opt = hvd.DistributedOptimizer(mx.optimizer.SGD(learning_rate=0.3))
    train(net, mx.gluon.Trainer(net.collect_params(), opt, kvstore=None), x[shard], y[shard], 2)
    for got, want in zip(params_of(net), params_of(single)):
        same(got, want, "DistributedOptimizer == one process", 1e-5)
    identical_everywhere(net, "optimizer")


def topology_checks():
    check(hvd.is_initialized(), "is_initialized after init")
    check(hvd.size() == SIZE and hvd.rank() == RANK, "rank and size")
    check(0 <= hvd.local_rank() < hvd.local_size(), "local rank")
    check(hvd.gloo_built() in (True, False) and hvd.mpi_built() is False, "capability queries")


def main():
    global RANK, SIZE
    hvd.init(process_sets="dynamic")
    RANK, SIZE = hvd.rank(), hvd.size()
    rank_checks.rank = RANK
    for fn in (topology_checks, allreduce_checks, grouped_checks, asynchronous_checks,
               broadcast_checks, gather_checks, object_and_set_checks, bad_input_checks,
               trainer_checks):
        rank_checks.section(fn, "MXNET_API_CHECKS_VERBOSE")
    hvd.shutdown()
    sys.exit(rank_checks.finish("mxnet_api_checks"))


if __name__ == "__main__":
    main()
