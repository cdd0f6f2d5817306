"""Horovod's collective operations for PyTorch (horovod.torch.mpi_ops) over Ringmaster's client.

Every collective is enqueued with this rank's worker daemon without blocking and returns a handle;
`synchronize(handle)` waits for it and returns its output, raising HorovodInternalError with the
coordinator's (or daemon's) message when it failed. Tensors cross to the client as a data pointer,
a dtype code and a shape: the tensor handed to the daemon is a contiguous CPU tensor (the caller's
own when it already is one; otherwise a copy, written back on completion) and stays referenced
here until its operation completes. Tensors in the shared arena (`_arena_empty`) are reduced in
place; the client copies any other tensor into the arena and back.

Unnamed operations get Horovod's automatic names (`allreduce.noname.<handle>`, ...): every rank
must issue its unnamed collectives in the same order, as with Horovod.
"""
import itertools
import threading
import warnings

import torch

from ringmaster import _ringmaster
from ringmaster import basics as _basics
from ringmaster.torch.compression import Compression

# The framework-neutral parts (horovod/common's): ops, names, process sets.
from ringmaster.common.ops import (Adasum, Average, Max, Min, Product, Sum,  # noqa: F401
                                   RING_OPS as _RING_OPS, handle_average_backwards_compatibility,
                                   op_name as _op_name, status_error as _status_error)
from ringmaster.common.process_sets import (InSet as _InSet, ProcessSet,  # noqa: F401
                                            add_process_set, check as _check_process_set,
                                            global_process_set, remove_process_set)

_DTYPES = {
    torch.uint8: _ringmaster.dtype.uint8,
    torch.int8: _ringmaster.dtype.int8,
    torch.int32: _ringmaster.dtype.int32,
    torch.int64: _ringmaster.dtype.int64,
    torch.float16: _ringmaster.dtype.float16,
    torch.bfloat16: _ringmaster.dtype.bfloat16,
    torch.float32: _ringmaster.dtype.float32,
    torch.float64: _ringmaster.dtype.float64,
}


# ---- Handles ----

class _Op:
    """An operation in flight: the client's handles, what completes it, what must stay alive."""

    __slots__ = ("handles", "finish", "keep", "names")

    def __init__(self, handles, finish, keep, names=()):
        self.handles = handles  # the client's handles (several for grouped operations)
        self.finish = finish  # () -> the operation's output, once every handle completed OK
        self.keep = keep  # tensors the daemon reads or writes until completion
        self.names = names  # the caller-given names among its tensors' (see _claim)


_lock = threading.Lock()
_handle_counter = itertools.count(1)  # never reset: automatic names stay unique across re-init
_handle_map = {}  # handle -> _Op
_forgotten = []  # operations in flight at shutdown(): their tensors must outlive them
# Names given by the caller -> the client's handle of the operation that used it last, so that a
# name still in flight is refused at once, as Horovod refuses it (its DUPLICATE_NAME_ERROR).
# An entry goes when its operation is synchronized; a completed one no longer refuses.
_named = {}


def _forget_handles():
    with _lock:
        _forgotten.extend(_handle_map.values())
        _handle_map.clear()
        _named.clear()


def _reset_after_elastic():
    """After an elastic reset: the old epoch's handles are forgotten (their operations failed)."""
    _forget_handles()


def _claim(c, names):
    """Raises ValueError, before anything is enqueued, when one of `names` (caller-given tensor
    names) belongs to an operation of this process still in flight: Horovod refuses it so."""
    with _lock:
        for n in names:
            h = _named.get(n)
            if h is not None and not c.poll(h):
                raise ValueError(
                    f"Tensor '{n}' is already in flight on this rank: requested to allreduce, "
                    "allgather, or broadcast a tensor with the same name as another tensor that "
                    "is currently being processed. If you want to request another tensor, use a "
                    "different tensor name.")


def _named_handles(names, handles):
    with _lock:
        for n, h in zip(names, handles):
            _named[n] = h


def _new_handle():
    with _lock:
        return next(_handle_counter)


def _register(handle, op):
    _handle_map[handle] = op
    if op.names:
        _named_handles(op.names, op.handles)
    return handle


def poll(handle):
    """True once the operation completed; then `synchronize()` does not block."""
    op = _handle_map.get(handle)
    if op is None:
        return True
    c = _basics._client
    return all(c.poll(h) for h in op.handles)


def synchronize(handle):
    """Waits for the operation and returns its output (a tensor, or a list for grouped operations).
    Raises HorovodInternalError with the coordinator's message when it failed."""
    op = _handle_map.get(handle)
    if op is None:
        return None
    c = _basics._client
    error = None
    for h in op.handles:
        try:
            c.wait(h)
        except _ringmaster.StatusError as e:
            if error is None:
                error = e
    _handle_map.pop(handle, None)
    if op.names:
        with _lock:
            for n, h in zip(op.names, op.handles):
                if _named.get(n) == h:
                    del _named[n]
    if error is not None:
        raise _status_error(error)
    return op.finish()


# ---- Tensors handed to the client ----

def _dtype_code(tensor):
    code = _DTYPES.get(tensor.dtype)
    if code is None:
        raise ValueError(f"Tensor type {tensor.type()} is not supported.")
    return code


def _check_dense(tensor):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.layout != torch.strided:
        raise ValueError(
            f"ringmaster: a {tensor.layout} tensor cannot go through this operation, which takes "
            f"dense tensors: reduce a sparse gradient with hvd.sparse_allreduce_async(tensor, "
            f"name), or send it dense (tensor.to_dense(), or "
            f"DistributedOptimizer(..., sparse_as_dense=True))")


def _gpu_slot(c):
    return _basics.topology().device >= 0


def _daemon_buffer(tensor):
    """(a contiguous tensor for the daemon, a function that writes it back into `tensor` or None
    when it is `tensor` itself). On a GPU slot a CUDA tensor stays on the GPU: the client stages it
    into the device arena on the tensor's current stream (no host copy); a non-contiguous one goes
    through a contiguous copy on the GPU."""
    c = _basics.client()
    if tensor.device.type == "cuda" and _gpu_slot(c):
        slot = _basics.topology().device
        if tensor.device.index != slot:
            raise ValueError(
                f"ringmaster: the tensor is on {tensor.device} but this rank's worker runs on "
                f"cuda:{slot} (call torch.cuda.set_device(hvd.local_rank()) and keep "
                f"the model's tensors there)")
        stream = torch.cuda.current_stream(tensor.device)
        c.set_cuda_stream(stream.cuda_stream)
        if tensor.is_contiguous():
            # The client reads (and writes back) its memory on this stream, which may not be the
            # one it was allocated on: PyTorch's allocator must not reuse it before that is done.
            tensor.record_stream(stream)
            return tensor, None
        buf = tensor.detach().contiguous()
    elif tensor.device.type == "cpu" and tensor.is_contiguous():
        return tensor, None
    else:
        buf = tensor.detach().to("cpu", copy=True).contiguous()

    def write_back():
        with torch.no_grad():
            tensor.copy_(buf)

    return buf, write_back


def _bytes_view(tensor):
    """`tensor` (contiguous, CPU) as uint8, for dtypes the data plane does not know, which
    broadcast and allgather move as bytes. The last dimension counts bytes."""
    if tensor.dim() == 0:
        tensor = tensor.reshape(1)
    return tensor.view(torch.uint8)


_device_arena_failed = False


def _arena_empty(shape, dtype):
    """An uninitialised tensor in the shared arena (the daemon reduces it without a copy), or None
    when the arena is full: on a CPU slot a CPU tensor, on a GPU slot a CUDA tensor on the slot's
    device (the arena the daemon shares through CUDA IPC). Its arena memory is freed when the tensor
    is collected."""
    global _device_arena_failed
    shape = torch.Size(shape)
    numel = shape.numel()
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    c = _basics.client()
    if nbytes == 0 or (_gpu_slot(c) and _device_arena_failed):
        return None
    buf = c.allocate(nbytes)
    if buf is None:
        return None
    if not _gpu_slot(c):
        return torch.frombuffer(buf, dtype=dtype, count=numel).view(shape)
    try:
        raw = torch.as_tensor(buf, device=torch.device("cuda", _basics.topology().device))
        if raw.data_ptr() != buf.address:
            raise RuntimeError("torch.as_tensor copied the arena instead of viewing it")
        return raw.view(dtype).view(shape)
    except Exception as e:  # noqa: BLE001 - whatever this PyTorch raises, staging still works
        # Tensors are then staged into the arena by the client, as any other CUDA tensor.
        _device_arena_failed = True
        warnings.warn(f"ringmaster: gradients cannot live in the GPU arena ({e}); they are "
                      f"copied in and out instead")
        return None


# ---- Allreduce ----

def _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor, process_set,
                     prefix="allreduce"):
    """Reduces `output` in place (it holds `tensor`'s values, or is `tensor`). `prefix` begins
    the automatic name of an unnamed operation."""
    _check_process_set(process_set)
    if op == Adasum:
        return _adasum_async(tensor, output, name, prescale_factor, postscale_factor, process_set,
                             prefix)
    ring_op = _RING_OPS.get(op)
    if ring_op is None:
        raise ValueError(f"unknown reduction op {op!r}")
    _check_dense(tensor)
    code = _dtype_code(tensor)
    c = _basics.client()
    names = () if name is None else (name,)
    _claim(c, names)
    handle = _new_handle()
    buf, write_back = _daemon_buffer(output)
    try:
        with _InSet(process_set):
            h = c.allreduce(_op_name(prefix, name, handle), buf.data_ptr(), code,
                            list(buf.shape), ring_op, float(prescale_factor),
                            float(postscale_factor))
    except _ringmaster.StatusError as e:
        raise _status_error(e) from None

    def finish():
        if write_back is not None:
            write_back()
        return output

    return _register(handle, _Op([h], finish, (tensor, output, buf), names))


def _copy_for_output(tensor):
    _check_dense(tensor)
    return tensor.detach().clone(memory_format=torch.contiguous_format)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    """Averages (or sums, ...) `tensor` over all ranks without modifying it; returns a handle."""
    op = handle_average_backwards_compatibility(op, average)
    output = _copy_for_output(tensor)
    return _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor,
                            process_set)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    """In-place allreduce of `tensor`; returns a handle."""
    op = handle_average_backwards_compatibility(op, average)
    return _allreduce_async(tensor, tensor, name, op, prescale_factor, postscale_factor,
                            process_set)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """In-place allreduce of `tensor`; returns it."""
    handle = allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor,
                              process_set)
    return synchronize(handle)


class HorovodAllreduce(torch.autograd.Function):
    """Allreduce; its gradient is the same allreduce of the output's gradient."""

    @staticmethod
    def forward(ctx, tensor, average, name, op, prescale_factor, postscale_factor, process_set):
        ctx.average = average
        ctx.op = op
        ctx.prescale_factor = prescale_factor
        ctx.postscale_factor = postscale_factor
        ctx.process_set = process_set
        handle = allreduce_async(tensor, average, name, op, prescale_factor, postscale_factor,
                                 process_set)
        return synchronize(handle)

    @staticmethod
    def backward(ctx, grad_output):
        return (allreduce(grad_output, average=ctx.average, op=ctx.op,
                          prescale_factor=ctx.prescale_factor,
                          postscale_factor=ctx.postscale_factor, process_set=ctx.process_set),
                None, None, None, None, None, None)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Averages (or sums, ...) `tensor` over all ranks; returns a new tensor. Differentiable."""
    tensor_compressed, ctx = compression.compress(tensor)
    summed = HorovodAllreduce.apply(tensor_compressed, average, name, op, prescale_factor,
                                    postscale_factor, process_set)
    return compression.decompress(summed, ctx)


# ---- Grouped allreduce ----

def _grouped_allreduce_async(tensors, outputs, name, op, prescale_factor, postscale_factor,
                             process_set, prefix="grouped_allreduce"):
    _check_process_set(process_set)
    tensors = list(tensors)
    outputs = list(outputs)
    if not tensors:
        raise ValueError("grouped allreduce needs at least one tensor")
    if op == Adasum:
        return _adasum_async(tensors, outputs, name, prescale_factor, postscale_factor,
                             process_set, prefix)
    ring_op = _RING_OPS.get(op)
    if ring_op is None:
        raise ValueError(f"unknown reduction op {op!r}")
    for t in tensors:
        _check_dense(t)
        _dtype_code(t)
    c = _basics.client()
    handle = _new_handle()
    base = _op_name(prefix, name, handle)
    n = len(tensors)
    names = [f"{base}_{i + 1}of{n}" for i in range(n)]
    _claim(c, names if name is not None else ())
    buffers = [_daemon_buffer(o) for o in outputs]
    # The data plane fuses one data type per group: a group that mixes types is sent as one
    # group per type, in order of first appearance (the same on every rank).
    by_dtype = {}
    for i, t in enumerate(tensors):
        by_dtype.setdefault(t.dtype, []).append(i)
    handles = []
    try:
        with _InSet(process_set):
            for dtype, indices in by_dtype.items():
                handles += c.grouped_allreduce(
                    [names[i] for i in indices], [buffers[i][0].data_ptr() for i in indices],
                    _DTYPES[dtype], [list(buffers[i][0].shape) for i in indices], ring_op,
                    float(prescale_factor), float(postscale_factor))
    except _ringmaster.StatusError as e:
        for h in handles:  # wait for what was enqueued: the daemon writes into those buffers
            try:
                c.wait(h)
            except _ringmaster.StatusError:
                pass
        raise _status_error(e) from None

    def finish():
        for _, write_back in buffers:
            if write_back is not None:
                write_back()
        return outputs

    # In the order they were enqueued: by data type, as above.
    order = [names[i] for indices in by_dtype.values() for i in indices]
    return _register(handle, _Op(handles, finish, (tensors, outputs, buffers),
                                 order if name is not None else ()))


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    """Allreduces the tensors as one group (negotiated and fused together); returns one handle
    whose `synchronize()` returns the list of outputs. The inputs are not modified."""
    op = handle_average_backwards_compatibility(op, average)
    outputs = [_copy_for_output(t) for t in tensors]
    return _grouped_allreduce_async(tensors, outputs, name, op, prescale_factor, postscale_factor,
                                    process_set)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    """In-place grouped allreduce; returns a handle."""
    op = handle_average_backwards_compatibility(op, average)
    return _grouped_allreduce_async(tensors, tensors, name, op, prescale_factor, postscale_factor,
                                    process_set)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    """In-place grouped allreduce; returns the list of tensors."""
    handle = grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                      postscale_factor, process_set)
    return synchronize(handle)


class HorovodGroupedAllreduce(torch.autograd.Function):
    """Grouped allreduce; its gradient is the same grouped allreduce of the outputs' gradients."""

    @staticmethod
    def forward(ctx, average, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.average = average
        ctx.op = op
        ctx.prescale_factor = prescale_factor
        ctx.postscale_factor = postscale_factor
        ctx.process_set = process_set
        handle = grouped_allreduce_async(list(tensors), average, name, op, prescale_factor,
                                         postscale_factor, process_set)
        return tuple(synchronize(handle))

    @staticmethod
    def backward(ctx, *grad_output):
        grad_reduced = grouped_allreduce(list(grad_output), average=ctx.average, op=ctx.op,
                                         prescale_factor=ctx.prescale_factor,
                                         postscale_factor=ctx.postscale_factor,
                                         process_set=ctx.process_set)
        return (None, None, None, None, None, None, *grad_reduced)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Grouped allreduce; returns the list of outputs. Differentiable."""
    tensors_compressed, ctxs = zip(*[compression.compress(t) for t in tensors])
    summed = HorovodGroupedAllreduce.apply(average, name, op, prescale_factor, postscale_factor,
                                           process_set, *tensors_compressed)
    return [compression.decompress(t, ctx) for t, ctx in zip(summed, ctxs)]


# ---- Allgather ----

def _gathered_tensor(c, h, dtype, as_bytes, device):
    gathered = c.take_allgather(h)
    shape = list(gathered.shape)
    wire_dtype = torch.uint8 if as_bytes else dtype
    if len(gathered) == 0:
        out = torch.empty(shape, dtype=wire_dtype)
    else:
        out = torch.frombuffer(gathered, dtype=wire_dtype).view(shape)
    if as_bytes:
        out = out.view(dtype)
    return out if device.type == "cpu" else out.to(device)


def _enqueue_allgather(c, name, tensor):
    """Enqueues one allgather; returns (client handle, input kept alive, moved as bytes)."""
    _check_dense(tensor)
    buf = tensor.detach()
    if buf.dim() == 0:
        buf = buf.reshape(1)
    if buf.device.type == "cuda" and _gpu_slot(c):
        buf = _daemon_buffer(buf)[0]  # stays on the GPU: staged into the device arena
    elif buf.device.type != "cpu" or not buf.is_contiguous():
        buf = buf.to("cpu").contiguous()
    as_bytes = tensor.dtype not in _DTYPES
    wire = _bytes_view(buf) if as_bytes else buf
    code = _DTYPES[wire.dtype]
    h = c.allgather(name, wire.data_ptr(), code, list(wire.shape))
    return h, buf, as_bytes


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Concatenates every rank's `tensor` along the first dimension (which may differ per rank);
    returns a handle."""
    _check_process_set(process_set)
    c = _basics.client()
    names = () if name is None else (name,)
    _claim(c, names)
    handle = _new_handle()
    try:
        with _InSet(process_set):
            h, buf, as_bytes = _enqueue_allgather(c, _op_name("allgather", name, handle), tensor)
    except _ringmaster.StatusError as e:
        raise _status_error(e) from None
    dtype, device = tensor.dtype, tensor.device
    return _register(handle, _Op([h], lambda: _gathered_tensor(c, h, dtype, as_bytes, device),
                                 (tensor, buf), names))


class HorovodAllgather(torch.autograd.Function):
    """Allgather; the gradient of a rank's input is its rows of the average of the outputs'
    gradients over ranks (Horovod's definition)."""

    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.dim = tensor.shape[0] if tensor.dim() > 0 else 1
        ctx.process_set = process_set
        handle = allgather_async(tensor, name, process_set)
        return synchronize(handle)

    @staticmethod
    def backward(ctx, grad_output):
        grad_reduced = allreduce(grad_output, op=Average, process_set=ctx.process_set)
        dim_t = torch.IntTensor([ctx.dim])
        dim = allgather(dim_t, process_set=ctx.process_set).view(ctx.process_set.size())
        r = ctx.process_set.rank()
        offset = torch.sum(dim.narrow(0, 0, r)).item() if r != 0 else 0
        return grad_reduced.narrow(0, offset, ctx.dim), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenates every rank's `tensor` along the first dimension. Differentiable."""
    return HorovodAllgather.apply(tensor, name, process_set)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """Allgathers each tensor; returns one handle whose `synchronize()` returns the list."""
    _check_process_set(process_set)
    tensors = list(tensors)
    if not tensors:
        raise ValueError("grouped allgather needs at least one tensor")
    c = _basics.client()
    handle = _new_handle()
    base = _op_name("grouped_allgather", name, handle)
    n = len(tensors)
    names = [f"{base}_{i + 1}of{n}" for i in range(n)] if name is not None else []
    _claim(c, names)
    enqueued = []
    try:
        with _InSet(process_set):
            for i, t in enumerate(tensors):
                enqueued.append(_enqueue_allgather(c, f"{base}_{i + 1}of{n}", t))
    except _ringmaster.StatusError as e:
        for h, _, _ in enqueued:
            try:
                c.wait(h)
            except _ringmaster.StatusError:
                pass
        raise _status_error(e) from None

    def finish():
        return [_gathered_tensor(c, h, t.dtype, as_bytes, t.device)
                for (h, _, as_bytes), t in zip(enqueued, tensors)]

    return _register(handle, _Op([h for h, _, _ in enqueued], finish, (tensors, enqueued), names))


class HorovodGroupedAllgather(torch.autograd.Function):
    """Grouped allgather; gradients as for allgather, tensor by tensor."""

    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.dims = [t.shape[0] if t.dim() > 0 else 1 for t in tensors]
        ctx.process_set = process_set
        handle = grouped_allgather_async(list(tensors), name, process_set)
        return tuple(synchronize(handle))

    @staticmethod
    def backward(ctx, *grad_output):
        grad_reduced = grouped_allreduce(list(grad_output), op=Average,
                                         process_set=ctx.process_set)
        dims = allgather(torch.IntTensor(ctx.dims).view(1, -1),
                         process_set=ctx.process_set)  # [size, n]
        r = ctx.process_set.rank()
        offsets = dims.narrow(0, 0, r).sum(dim=0) if r != 0 else torch.zeros(len(ctx.dims))
        grads = [g.narrow(0, int(offsets[i]), ctx.dims[i]) for i, g in enumerate(grad_reduced)]
        return (None, None, *grads)


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Allgathers each tensor; returns the list of outputs. Differentiable."""
    return list(HorovodGroupedAllgather.apply(name, process_set, *tensors))


# ---- Broadcast ----

def _broadcast_async(tensor, output, root_rank, name, process_set):
    """Broadcasts `output` in place from `root_rank` (it holds `tensor`'s values, or is it)."""
    _check_process_set(process_set)
    _check_dense(tensor)
    c = _basics.client()
    names = () if name is None else (name,)
    _claim(c, names)
    handle = _new_handle()
    buf, write_back = _daemon_buffer(output)
    as_bytes = buf.dtype not in _DTYPES
    wire = _bytes_view(buf) if as_bytes else buf
    try:
        with _InSet(process_set):
            h = c.broadcast(_op_name("broadcast", name, handle), wire.data_ptr(), _DTYPES[wire.dtype],
                            list(wire.shape), int(root_rank))
    except _ringmaster.StatusError as e:
        raise _status_error(e) from None

    def finish():
        if write_back is not None:
            write_back()
        return output

    return _register(handle, _Op([h], finish, (tensor, output, buf), names))


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Broadcasts root_rank's `tensor` to every rank without modifying it; returns a handle."""
    output = _copy_for_output(tensor)
    return _broadcast_async(tensor, output, root_rank, name, process_set)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """In-place broadcast of `tensor` from root_rank; returns a handle."""
    return _broadcast_async(tensor, tensor, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """In-place broadcast of `tensor` from root_rank; returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


class HorovodBroadcast(torch.autograd.Function):
    """Broadcast; the root's gradient is the average of the outputs' gradients over ranks, the
    others' is zero (Horovod's definition)."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank = root_rank
        ctx.process_set = process_set
        handle = broadcast_async(tensor, root_rank, name, process_set)
        return synchronize(handle)

    @staticmethod
    def backward(ctx, grad_output):
        grad_reduced = allreduce(grad_output, op=Average, process_set=ctx.process_set)
        if _basics.rank() != ctx.root_rank:
            grad_reduced *= 0
        return grad_reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Returns root_rank's `tensor` on every rank. Differentiable."""
    return HorovodBroadcast.apply(tensor, root_rank, name, process_set)


# ---- Join and barrier ----

def join(device=-1):
    """Blocks until every rank has joined; returns the rank that joined last. While joined, this
    rank contributes zeros to the other ranks' allreduces."""
    c = _basics.client()
    _new_handle()  # as Horovod, a join takes a handle: automatic names stay aligned across ranks
    try:
        return c.join()
    except _ringmaster.StatusError as e:
        raise _status_error(e) from None


def barrier(process_set=global_process_set):
    """Blocks until every rank reached the barrier."""
    _check_process_set(process_set)
    c = _basics.client()
    _new_handle()
    try:
        with _InSet(process_set):
            c.barrier()
    except _ringmaster.StatusError as e:
        raise _status_error(e) from None


# Composed of the collectives above (ringmaster.torch.composed_ops): imported last, as they use
# this module's internals.
from ringmaster.torch.composed_ops import (  # noqa: E402
    HorovodAlltoall, HorovodGroupedReducescatter, HorovodReducescatter, _adasum_async, alltoall,
    alltoall_async, grouped_reducescatter, grouped_reducescatter_async, reducescatter,
    reducescatter_async, sparse_allreduce_async)
