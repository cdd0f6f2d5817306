"""Horovod's collective operations for Apache MXNet (horovod.mxnet.mpi_ops) over Ringmaster.

allreduce, grouped_allreduce and broadcast (and their in-place forms) are operations of MXNet's
dependency engine (ringmaster._ringmaster.MxnetEngine): they return at once, start once whatever
writes their inputs is done (a gradient's allreduce while the rest of backward still runs), and
whatever reads their outputs (wait_to_read(), asnumpy(), an optimizer's update) waits for them. A
failure is raised by MXNet where the output is waited for, as an mxnet.base.MXNetError carrying the
coordinator's or the daemon's message; the next operation works. allgather, alltoall and
reducescatter return once done, as Horovod's do (their output shapes come from the other ranks).

Names are Horovod's: `allreduce.<name>` (`allreduce.<name>_<i>of<n>` in a group), and
`allreduce.noname.<n>` when none is given (every rank must then issue its unnamed operations in the
same order). NDArrays on the CPU (mx.cpu()); GPU NDArrays are refused with a clear error for now.
"""
import ctypes
import itertools
import os
import threading

import mxnet as mx
import numpy as np

from ringmaster import _ringmaster
from ringmaster import basics as _basics
from ringmaster.common import objects as _objects
from ringmaster.common import process_sets as _process_sets
from ringmaster.common.ops import (Adasum, Average, Max, Min, Product, Sum,  # noqa: F401
                                   RING_OPS as _RING_OPS, handle_average_backwards_compatibility,
                                   rows_of)
from ringmaster.common.process_sets import (ProcessSet, add_process_set,  # noqa: F401
                                            global_process_set, remove_process_set)

_DTYPES = {
    np.dtype(np.uint8): _ringmaster.dtype.uint8,
    np.dtype(np.int8): _ringmaster.dtype.int8,
    np.dtype(np.int32): _ringmaster.dtype.int32,
    np.dtype(np.int64): _ringmaster.dtype.int64,
    np.dtype(np.float16): _ringmaster.dtype.float16,
    np.dtype(np.float32): _ringmaster.dtype.float32,
    np.dtype(np.float64): _ringmaster.dtype.float64,
}
_OP_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max",
             Product: "Product"}

_lock = threading.Lock()
_engine = [None, None]  # [MxnetEngine, the client it was made for]
_op_count = itertools.count(1)  # Horovod's automatic names: never reset


def _the_engine():
    """The MxnetEngine of the current connection (made again after shutdown() then init())."""
    c = _basics.client()
    with _lock:
        if _engine[1] is not c:
            lib = mx.base._LIB

            def address(function):
                return ctypes.cast(getattr(lib, function), ctypes.c_void_p).value
            # MXNet's NaiveEngine runs each operation to its end before the push returns.
            synchronous = os.environ.get("MXNET_ENGINE_TYPE", "") == "NaiveEngine"
            _engine[0] = _ringmaster.MxnetEngine(
                c, address("MXEnginePushAsyncND"), address("MXNDArrayGetData"),
                address("MXNDArrayDetach"), address("MXNDArrayFree"), address("MXGetLastError"),
                synchronous, address("MXNDArrayFromDLPackEx"))
            _engine[1] = c
        return _engine[0]


def _arena_array(shape, dtype):
    """A new, uninitialised CPU NDArray in the shared arena (the daemon reduces it where it is,
    with no copy in or out), or None when the arena is full or the dtype is not reduced. Its arena
    memory goes back when MXNet releases the array."""
    code = _DTYPES.get(np.dtype(dtype))
    if code is None:
        return None
    handle = _the_engine().arena_array([int(d) for d in shape], code)
    if handle is None:
        return None
    return mx.nd.NDArray(handle=ctypes.c_void_p(handle))


def _op_name(prefix, name):
    if name is None:
        return f"{prefix}.noname.{next(_op_count)}"
    return f"{prefix}.{name}"


def _dtype_code(tensor, what="tensor"):
    if not isinstance(tensor, mx.nd.NDArray):
        raise TypeError(f"{what} must be an mxnet.nd.NDArray, got {type(tensor).__name__}")
    if tensor.stype != "default":
        raise ValueError(f"{what} is a {tensor.stype} NDArray: ringmaster.mxnet reduces dense "
                         "(default storage) NDArrays only")
    if tensor.context.device_type not in ("cpu", "cpu_pinned", "cpu_shared"):
        raise NotImplementedError(
            f"{what} is on {tensor.context}: ringmaster.mxnet runs collectives on CPU NDArrays "
            "(copy it with .as_in_context(mx.cpu()))")
    code = _DTYPES.get(np.dtype(tensor.dtype))
    if code is None:
        raise ValueError(f"{what} has dtype {np.dtype(tensor.dtype).name}, which ringmaster.mxnet "
                         f"does not reduce (supported: "
                         f"{', '.join(sorted(d.name for d in _DTYPES))})")
    return code


def _ring_op(op, average):
    op = handle_average_backwards_compatibility(op, average)
    if op == Adasum:
        raise AssertionError("Adasum is not supported by ringmaster.mxnet (nor by horovod.mxnet)")
    ring_op = _RING_OPS.get(op)
    if ring_op is None:
        raise ValueError(f"unknown reduction op {op!r}: use Average, Sum, Min, Max or Product")
    return ring_op


def _allreduce(tensors, outputs, name, op, average, priority, prescale_factor,
               postscale_factor, process_set):
    ring_op = _ring_op(op, average)
    codes = {_dtype_code(t) for t in tensors}
    if len(codes) > 1:
        raise ValueError("a grouped allreduce needs tensors of one dtype, got "
                         f"{sorted({np.dtype(t.dtype).name for t in tensors})}")
    set_id, set_ranks = _process_sets.wire_of(process_set)
    base = _op_name("allreduce", name)
    n = len(tensors)
    names = [base] if n == 1 else [f"{base}_{i + 1}of{n}" for i in range(n)]
    _the_engine().allreduce(names, [t.handle.value for t in tensors],
                            [o.handle.value for o in outputs], codes.pop(),
                            [list(t.shape) for t in tensors], ring_op, float(prescale_factor),
                            float(postscale_factor), int(priority), set_id, set_ranks)


class _EachPlan:
    """In-place allreduces of many tensors, one operation each, checked and named once and then
    pushed together every time (a trainer's gradients, step after step)."""

    def __init__(self, tensors, names, priorities, op, prescale_factor, postscale_factor,
                 process_set):
        self.tensors = list(tensors)  # kept: their handles are pushed
        self.ring_op = _ring_op(op, None)
        self.codes = [_dtype_code(t, f"tensor '{n}'") for t, n in zip(self.tensors, names)]
        self.names = [_op_name("allreduce", n) for n in names]
        self.handles = [t.handle.value for t in self.tensors]
        self.shapes = [list(t.shape) for t in self.tensors]
        self.priorities = [int(p) for p in priorities]
        self.scale = (float(prescale_factor), float(postscale_factor))
        self.process_set = process_set

    def push(self):
        set_id, set_ranks = _process_sets.wire_of(self.process_set)
        _the_engine().allreduce_each(self.names, self.handles, self.codes, self.shapes,
                                     self.ring_op, self.scale[0], self.scale[1], self.priorities,
                                     set_id, set_ranks)


def allreduce(tensor, average=None, name=None, priority=0, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set, op=None):
    """Returns a new NDArray: `tensor` reduced over the ranks (Average unless `op` says
    otherwise; integers average truncating). `tensor` is not modified. Asynchronous."""
    _dtype_code(tensor)
    output = mx.nd.zeros(shape=tensor.shape, ctx=tensor.context, dtype=tensor.dtype)
    _allreduce([tensor], [output], name, op, average, priority, prescale_factor,
               postscale_factor, process_set)
    return output


def allreduce_(tensor, average=None, name=None, priority=0, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set, op=None):
    """Reduces `tensor` over the ranks in place; returns it. Asynchronous."""
    _allreduce([tensor], [tensor], name, op, average, priority, prescale_factor,
               postscale_factor, process_set)
    return tensor


def grouped_allreduce(tensors, average=None, name=None, priority=0, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set, op=None):
    """Reduces the tensors as one group (negotiated and fused together); returns new NDArrays."""
    if not tensors:
        return tensors
    for i, t in enumerate(tensors):
        _dtype_code(t, f"tensors[{i}]")
    outputs = [mx.nd.zeros(shape=t.shape, ctx=t.context, dtype=t.dtype) for t in tensors]
    _allreduce(list(tensors), outputs, name, op, average, priority, prescale_factor,
               postscale_factor, process_set)
    return outputs


def grouped_allreduce_(tensors, average=None, name=None, priority=0, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set, op=None):
    """Reduces the tensors as one group, in place; returns them."""
    if not tensors:
        return tensors
    _allreduce(list(tensors), list(tensors), name, op, average, priority, prescale_factor,
               postscale_factor, process_set)
    return tensors


def _broadcast(tensor, output, root_rank, name, priority, process_set):
    code = _dtype_code(tensor)
    set_id, set_ranks = _process_sets.wire_of(process_set)
    _the_engine().broadcast(_op_name("broadcast", name), tensor.handle.value, output.handle.value,
                            code, list(tensor.shape), int(root_rank), int(priority), set_id,
                            set_ranks)


def broadcast(tensor, root_rank, name=None, priority=0, process_set=global_process_set):
    """Returns a new NDArray holding root_rank's `tensor` on every rank. Asynchronous."""
    _dtype_code(tensor)
    if _basics.rank() == root_rank:
        output = tensor.copy()
    else:
        output = mx.nd.zeros(shape=tensor.shape, ctx=tensor.context, dtype=tensor.dtype)
    _broadcast(tensor, output, root_rank, name, priority, process_set)
    return output


def broadcast_(tensor, root_rank, name=None, priority=0, process_set=global_process_set):
    """Overwrites `tensor` with root_rank's, in place; returns it. Asynchronous."""
    _broadcast(tensor, tensor, root_rank, name, priority, process_set)
    return tensor


def _host_array(tensor, what):
    """A C-contiguous numpy copy of `tensor` (waits for what writes it), and its dtype code."""
    code = _dtype_code(tensor, what)
    return np.ascontiguousarray(tensor.asnumpy()), code


def _allgather_array(array, code, name, process_set):
    data, shape = _objects.allgather_buffer(name, array if array.size else np.zeros(1, array.dtype),
                                            code, array.shape, process_set)
    return np.frombuffer(data, dtype=array.dtype).reshape(shape)


def allgather(tensor, name=None, priority=0, process_set=global_process_set):
    """Returns every rank's `tensor` concatenated along the first dimension (which may differ per
    rank), in rank order. Returns once done."""
    array, code = _host_array(tensor, "tensor")
    _process_sets.check(process_set)
    out = _allgather_array(array, code, _op_name("allgather", name), process_set)
    return mx.nd.array(out, ctx=tensor.context, dtype=tensor.dtype)


def grouped_allgather(tensors, name=None, priority=0, process_set=global_process_set):
    """allgather of each tensor; returns the list of results."""
    if not tensors:
        return tensors
    arrays = [_host_array(t, f"tensors[{i}]") for i, t in enumerate(tensors)]
    _process_sets.check(process_set)
    base = _op_name("allgather", name)
    n = len(tensors)
    return [mx.nd.array(_allgather_array(a, code, base if n == 1 else f"{base}_{i + 1}of{n}",
                                         process_set), ctx=t.context, dtype=t.dtype)
            for i, ((a, code), t) in enumerate(zip(arrays, tensors))]


def alltoall(tensor, splits=None, name=None, priority=0, process_set=global_process_set):
    """Sends rows of `tensor` to every rank of the set: `splits[r]` rows (along the first
    dimension) to its r-th rank (default: an equal share each). Returns what this rank received,
    in rank order, and with `splits` given also the received splits (an int32 NDArray)."""
    array, code = _host_array(tensor, "tensor")
    _process_sets.check(process_set)
    size = _process_sets.size_of(process_set)
    me = process_set.rank() if process_set is not None else _basics.rank()
    return_splits = splits is not None
    if splits is None:
        if array.ndim == 0 or array.shape[0] % size:
            raise ValueError(f"alltoall without splits needs a first dimension divisible by the "
                             f"{size} ranks, got shape {list(array.shape)}")
        splits = [array.shape[0] // size] * size
    splits = [int(s) for s in (splits.asnumpy() if isinstance(splits, mx.nd.NDArray) else splits)]
    if len(splits) != size or any(s < 0 for s in splits) or sum(splits) != array.shape[0]:
        raise ValueError(f"alltoall splits {splits} must be {size} counts (one per rank of the set) "
                         f"that sum to the first dimension, {array.shape[0]}")
    base = _op_name("alltoall", name)
    everyone = _objects.allgather_int64(base + ".splits", splits, process_set)
    gathered = _allgather_array(array, code, base, process_set)
    received, start = [], 0
    for r in range(size):
        offset = start + sum(everyone[r][:me])
        received.append(gathered[offset:offset + everyone[r][me]])
        start += sum(everyone[r])
    out = mx.nd.array(np.concatenate(received) if received else gathered[:0], ctx=tensor.context,
                      dtype=tensor.dtype)
    if return_splits:
        return out, mx.nd.array([everyone[r][me] for r in range(size)], dtype="int32")
    return out


def _check_reducescatter(tensor, op, what):
    if op not in (Average, Sum):
        raise ValueError(f"reducescatter supports the ops Average and Sum, got "
                         f"{_OP_NAMES.get(op, op)}")
    _dtype_code(tensor, what)
    if tensor.ndim == 0:
        raise ValueError("reducescatter does not support scalar inputs")


def reducescatter(tensor, op=Average, name=None, priority=0, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Reduces `tensor` over the set and returns this rank's rows of the result (Horovod's split
    of the first dimension). Returns once done."""
    return grouped_reducescatter([tensor], op, name, priority, process_set, prescale_factor,
                                 postscale_factor)[0]


def grouped_reducescatter(tensors, op=Average, name=None, priority=0,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """reducescatter of each tensor, reduced as one group."""
    if not tensors:
        return tensors
    for i, t in enumerate(tensors):
        _check_reducescatter(t, op, f"tensors[{i}]")
    reduced = grouped_allreduce(list(tensors), name=None if name is None else f"rs.{name}",
                                priority=priority, prescale_factor=prescale_factor,
                                postscale_factor=postscale_factor, process_set=process_set, op=op)
    size = _process_sets.size_of(process_set)
    me = process_set.rank() if process_set is not None else _basics.rank()
    out = []
    for r in reduced:
        start, rows = rows_of(r.shape[0], size, me)
        out.append(r[start:start + rows].copy())
    for o in out:
        o.wait_to_read()
    return out
