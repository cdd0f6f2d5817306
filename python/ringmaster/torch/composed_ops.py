"""Horovod's collectives that Ringmaster composes from allreduce and allgather: reducescatter
(and grouped), alltoall, sparse allreduce and the Adasum reduction.

Each is negotiated and executed as the collectives it is made of (so it runs on Gloo and on NCCL
alike), under one handle: `synchronize()` returns its result, raises HorovodInternalError when a
part failed, and a caller-given name is in flight until it completes. What each moves:
- reducescatter: an allreduce of the whole tensor, then this rank's rows (twice the bytes of a
  ring reduce-scatter);
- alltoall: an allgather of every rank's splits and of every rank's tensor, then the rows sent to
  this rank (every rank receives every row);
- sparse allreduce: an allgather of the indices and one of the values (Horovod's own way);
- Adasum: an allgather of every rank's tensor, combined on each rank in float64.
"""
import torch

from ringmaster import _ringmaster
from ringmaster import basics as _basics
from ringmaster.torch import mpi_ops as _mpi
from ringmaster.torch.compression import Compression
from ringmaster.common.ops import rows_of
from ringmaster.torch.mpi_ops import Average, Sum, global_process_set

_OP_NAMES = {0: "Average", 1: "Sum", 2: "Adasum", 3: "Min", 4: "Max", 5: "Product"}
_ADASUM_TYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _set_size(process_set):
    return (process_set or global_process_set).size()


def _compose(client_handles, finish, keep, names=()):
    """Registers one operation made of the client's `client_handles`."""
    return _mpi._register(_mpi._new_handle(),
                          _mpi._Op(list(client_handles), finish, keep, tuple(names)))


def _absorb(handle):
    """Takes an operation out of the handle map, to become part of a composed one."""
    return _mpi._handle_map.pop(handle)


def _enqueue_allgathers(c, named_tensors, process_set=global_process_set):
    """Enqueues one allgather per (name, tensor); returns their (client handle, finish). On a
    refusal waits for what was enqueued (the daemon still reads those inputs) and raises."""
    enqueued = []
    try:
        with _mpi._InSet(process_set):
            for name, tensor in named_tensors:
                h, buf, as_bytes = _mpi._enqueue_allgather(c, name, tensor)
                enqueued.append((h, buf, as_bytes, tensor.dtype, tensor.device))
    except _ringmaster.StatusError as e:
        for h, *_ in enqueued:
            try:
                c.wait(h)
            except _ringmaster.StatusError:
                pass
        raise _mpi._status_error(e) from None
    return enqueued


def _gathered(c, entry):
    h, _, as_bytes, dtype, device = entry
    return _mpi._gathered_tensor(c, h, dtype, as_bytes, device)


# ---- Reducescatter ----

def _check_reducescatter(tensor, op):
    if op not in (Average, Sum):
        raise ValueError(f"reducescatter supports op=Average and op=Sum, not "
                         f"{_OP_NAMES.get(op, op)}")
    _mpi._check_dense(tensor)
    if tensor.dim() == 0:
        raise ValueError("reducescatter needs a tensor of at least one dimension: it splits the "
                         "first among the ranks")


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    """Reduces `tensor` (Average or Sum) over all ranks and returns a handle whose
    `synchronize()` gives this rank's part of the first dimension: dim0 // size rows, one more on
    the first dim0 % size ranks. The input is not modified."""
    _mpi._check_process_set(process_set)
    _check_reducescatter(tensor, op)
    full = _mpi._copy_for_output(tensor)
    inner = _absorb(_mpi._allreduce_async(tensor, full, name, op, prescale_factor,
                                          postscale_factor, process_set, prefix="reducescatter"))
    start, rows = rows_of(tensor.shape[0], _set_size(process_set), process_set.rank())
    return _compose(inner.handles, lambda: inner.finish().narrow(0, start, rows).clone(),
                    inner.keep, inner.names)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    """reducescatter of each tensor, negotiated and fused as one group; `synchronize()` returns
    the list of this rank's parts."""
    _mpi._check_process_set(process_set)
    tensors = list(tensors)
    for t in tensors:
        _check_reducescatter(t, op)
    outputs = [_mpi._copy_for_output(t) for t in tensors]
    inner = _absorb(_mpi._grouped_allreduce_async(tensors, outputs, name, op, prescale_factor,
                                                  postscale_factor, process_set,
                                                  prefix="grouped_reducescatter"))
    size, rank = _set_size(process_set), process_set.rank()
    parts = [rows_of(t.shape[0], size, rank) for t in tensors]

    def finish():
        return [o.narrow(0, start, rows).clone()
                for o, (start, rows) in zip(inner.finish(), parts)]

    return _compose(inner.handles, finish, inner.keep, inner.names)


def _reducescatter_grad(grad, op, prescale_factor, postscale_factor, process_set):
    # Horovod's gradient (0.28, single and grouped alike): the allgather of the parts' gradients,
    # times the set's size for Sum (as an allreduce-Sum's gradient sums identical gradients) and
    # as is for Average, times the scale factors.
    if op == Sum:
        grad = grad * _set_size(process_set)
    return _mpi.allgather(grad, process_set=process_set) * (prescale_factor * postscale_factor)


class HorovodReducescatter(torch.autograd.Function):
    """Reducescatter; the gradient of the input is the allgather of the parts' gradients, scaled
    as the forward pass scaled."""

    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.op, ctx.process_set = op, process_set
        ctx.scale = (prescale_factor, postscale_factor)
        return _mpi.synchronize(reducescatter_async(tensor, name, op, process_set,
                                                    prescale_factor, postscale_factor))

    @staticmethod
    def backward(ctx, grad_output):
        return (_reducescatter_grad(grad_output, ctx.op, *ctx.scale, ctx.process_set),
                None, None, None, None, None)


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """This rank's part of `tensor` reduced over all ranks (see reducescatter_async).
    Differentiable."""
    compressed, ctx = compression.compress(tensor)
    part = HorovodReducescatter.apply(compressed, name, op, process_set, prescale_factor,
                                      postscale_factor)
    return compression.decompress(part, ctx)


class HorovodGroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):
        ctx.op, ctx.process_set = op, process_set
        ctx.scale = (prescale_factor, postscale_factor)
        return tuple(_mpi.synchronize(grouped_reducescatter_async(
            tensors, name, op, process_set, prescale_factor, postscale_factor)))

    @staticmethod
    def backward(ctx, *grad_output):
        return (None, None, None, None, None,
                *[_reducescatter_grad(g, ctx.op, *ctx.scale, ctx.process_set)
                  for g in grad_output])


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """reducescatter of each tensor as one group; returns the list of parts. Differentiable."""
    compressed, ctxs = zip(*[compression.compress(t) for t in tensors])
    parts = HorovodGroupedReducescatter.apply(name, op, process_set, prescale_factor,
                                              postscale_factor, *compressed)
    return [compression.decompress(p, c) for p, c in zip(parts, ctxs)]


# ---- Alltoall ----

def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends rows of `tensor` to every rank: `splits[r]` rows (in order) to rank r, or an equal
    share of the first dimension without splits. `synchronize()` returns (the rows received, in
    rank order; how many came from each rank, an int32 tensor). The input is not modified."""
    _mpi._check_process_set(process_set)
    _mpi._check_dense(tensor)
    if tensor.dim() == 0:
        raise ValueError("alltoall needs a tensor of at least one dimension: it splits the first")
    size, me = _set_size(process_set), process_set.rank()
    dim0 = tensor.shape[0]
    if splits is None:
        if dim0 % size != 0:
            raise ValueError(f"alltoall without splits sends each rank an equal share of the "
                             f"first dimension, but {dim0} rows do not divide among {size} ranks")
        sends = torch.full((size,), dim0 // size, dtype=torch.int64)
    else:
        sends = torch.as_tensor(splits).detach().to("cpu", torch.int64).flatten()
        if sends.numel() != size:
            raise ValueError(f"splits has {sends.numel()} entries; alltoall needs one per rank "
                             f"({size})")
        if bool((sends < 0).any()):
            raise ValueError(f"splits {sends.tolist()} has a negative entry")
        if int(sends.sum()) != dim0:
            raise ValueError(f"splits {sends.tolist()} add up to {int(sends.sum())} rows but the "
                             f"tensor's first dimension is {dim0}")
    c = _basics.client()
    names = () if name is None else (name,)
    _mpi._claim(c, names)
    base = _mpi._op_name("alltoall", name, _mpi._new_handle())
    data, counts = _enqueue_allgathers(c, [(f"{base}.data", tensor),
                                           (f"{base}.splits", sends.view(1, size))], process_set)

    def finish():
        matrix = _gathered(c, counts).view(size, size)  # [from, to]
        rows = _gathered(c, data)
        pieces, offset = [], 0
        for src in range(size):
            start = offset + int(matrix[src, :me].sum())
            pieces.append(rows.narrow(0, start, int(matrix[src, me])))
            offset += int(matrix[src].sum())
        return torch.cat(pieces), matrix[:, me].to(torch.int32).contiguous()

    return _compose([data[0], counts[0]], finish, (tensor, sends, data, counts), names)


class HorovodAlltoall(torch.autograd.Function):
    """Alltoall; the gradient goes back the way the rows came (an alltoall with the received
    splits)."""

    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received = _mpi.synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.process_set, ctx.received = process_set, received
        if splits is None:
            return output
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, *ignored):
        grad, _ = _mpi.synchronize(alltoall_async(grad_output.contiguous(), ctx.received,
                                                  process_set=ctx.process_set))
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """The rows every rank sent this one (see alltoall_async); with `splits`, also how many came
    from each rank, as Horovod returns them. Differentiable."""
    return HorovodAlltoall.apply(tensor, splits, name, process_set)


# ---- Sparse allreduce ----

class _CallableHandle(int):
    """A handle that `synchronize()` takes and that can be called, as Horovod's sparse handle."""

    def __call__(self):
        return _mpi.synchronize(self)


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Horovod's sparse allreduce: an allgather of every rank's indices and values, giving the
    sum (or with op=Average the average) as an uncoalesced sparse tensor of the same size. Returns
    a handle that `synchronize()` takes and that can also be called."""
    _mpi._check_process_set(process_set)
    if not tensor.is_sparse:
        raise ValueError("sparse_allreduce_async takes a sparse COO tensor")
    if op not in (Average, Sum):
        raise ValueError(f"sparse allreduce supports op=Average and op=Sum, not "
                         f"{_OP_NAMES.get(op, op)}")
    c = _basics.client()
    names = () if name is None else (name,)
    _mpi._claim(c, names)
    base = _mpi._op_name("sparse_allreduce", name, _mpi._new_handle())
    # Allgather concatenates along the first dimension: the indices go as [nnz, sparse dims].
    indices = tensor._indices().transpose(0, 1).contiguous()
    values = tensor._values().contiguous()
    gathered_values, gathered_indices = _enqueue_allgathers(
        c, [(f"{base}.values", values), (f"{base}.indices", indices)], process_set)
    size = _set_size(process_set)

    def finish():
        v = _gathered(c, gathered_values)
        i = _gathered(c, gathered_indices)
        if op == Average:
            v = v / size
        return torch.sparse_coo_tensor(i.transpose(0, 1), v, tensor.size())

    h = _compose([gathered_values[0], gathered_indices[0]], finish,
                 (tensor, indices, values, gathered_values, gathered_indices), names)
    handle = _CallableHandle(h)
    _mpi._handle_map[handle] = _mpi._handle_map.pop(h)
    return handle


# ---- Adasum ----

def adasum_combine(a, b):
    """Horovod's Adasum of two float64 vectors: each scaled by 1 - a.b / (2 |itself|^2) (a vector
    of squared norm below 1e-8 is taken as it is), then added."""
    dot = float(torch.dot(a, b))
    anorm, bnorm = float(torch.dot(a, a)), float(torch.dot(b, b))
    acoeff = 1.0 - dot / anorm * 0.5 if anorm >= 1e-8 else 1.0
    bcoeff = 1.0 - dot / bnorm * 0.5 if bnorm >= 1e-8 else 1.0
    return acoeff * a + bcoeff * b


def adasum_tree(vectors):
    """The ranks' vectors combined as Horovod's recursive doubling does: neighbours pairwise,
    level by level (rank 0 with 1, 2 with 3, ...; then those results likewise), an odd one out
    carried up unchanged."""
    level = list(vectors)
    while len(level) > 1:
        level = [adasum_combine(level[i], level[i + 1]) if i + 1 < len(level) else level[i]
                 for i in range(0, len(level), 2)]
    return level[0]


def _check_adasum(tensor):
    _mpi._check_dense(tensor)
    if tensor.dtype not in _ADASUM_TYPES:
        raise ValueError(f"Adasum reduces floating-point tensors; {tensor.dtype} is not one")


def _adasum_async(tensors, outputs, name, prescale_factor, postscale_factor, process_set,
                  prefix):
    """Adasum of each of `tensors` (each combined on its own, as Horovod combines each tensor of a
    fused group) into `outputs`; one handle whose finish returns `outputs` (one, or the list)."""
    _mpi._check_process_set(process_set)
    single = torch.is_tensor(tensors)
    tensors = [tensors] if single else list(tensors)
    outputs = [outputs] if single else list(outputs)
    for t in tensors:
        _check_adasum(t)
    c = _basics.client()
    names = () if name is None else (name,)
    _mpi._claim(c, names)
    base = _mpi._op_name(prefix, name, _mpi._new_handle())
    scaled = [(t.detach() * prescale_factor if prescale_factor != 1.0 else t.detach())
              .reshape(1, -1) for t in tensors]
    n = len(tensors)
    enqueued = _enqueue_allgathers(
        c, [(base if n == 1 else f"{base}_{i + 1}of{n}", s) for i, s in enumerate(scaled)],
        process_set)

    def finish():
        for entry, out in zip(enqueued, outputs):
            rows = _gathered(c, entry).to(torch.float64)  # [size, numel]
            combined = adasum_tree(list(rows.unbind(0))).to(out.dtype).view(out.shape)
            if postscale_factor != 1.0:
                combined = combined * postscale_factor
            with torch.no_grad():
                out.copy_(combined)
        return outputs[0] if single else outputs

    return _compose([e[0] for e in enqueued], finish, (tensors, outputs, scaled, enqueued),
                    names)
