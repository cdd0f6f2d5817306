"""Collectives of raw bytes and of picklable objects, with no framework: Horovod's
broadcast_object and allgather_object for every framework API, and what process-set registration
compares. Blocking (they wait in 100 ms slices, so signal handlers run)."""
import array
import ctypes
import io
import pickle

from ringmaster import _ringmaster
from ringmaster import basics as _basics
from ringmaster.common import process_sets as _process_sets
from ringmaster.common.ops import status_error


def _address(buffer):
    """The address of a writable buffer (bytearray, array.array), for the client."""
    return ctypes.addressof((ctypes.c_char * memoryview(buffer).nbytes).from_buffer(buffer))


def allgather_buffer(name, buffer, dtype, shape, process_set=None):
    """Allgathers `buffer` (a writable buffer of `shape` and client dtype code `dtype`; the first
    dimension may differ per rank) among `process_set`; returns (bytes, shape) of the result, in
    rank order."""
    c = _basics.client()
    try:
        with _process_sets.InSet(process_set):
            h = c.allgather(name, _address(buffer), dtype, list(shape))
        c.wait(h)
        gathered = c.take_allgather(h)
        return bytes(memoryview(gathered)), list(gathered.shape)
    except _ringmaster.StatusError as e:
        raise status_error(e) from None


def _allgather(name, buffer, dtype, rows, process_set):
    return allgather_buffer(name, buffer, dtype, [rows], process_set)[0]


def _broadcast(name, buffer, dtype, rows, root_rank, process_set):
    c = _basics.client()
    try:
        with _process_sets.InSet(process_set):
            h = c.broadcast(name, _address(buffer), dtype, [rows], root_rank)
        c.wait(h)
    except _ringmaster.StatusError as e:
        raise status_error(e) from None


def allgather_int64(name, values, process_set=None):
    """Every rank's list of int64 `values` (the same length on every rank), in rank order."""
    mine = array.array("q", values)
    everyone = array.array("q")
    everyone.frombytes(_allgather(name, mine, _ringmaster.dtype.int64, len(mine), process_set))
    n = len(mine)
    return [everyone[i:i + n].tolist() for i in range(0, len(everyone), n)]


def allgather_bytes(name, data, process_set=None):
    """Every rank's `data` (bytes, of any length), in rank order."""
    sizes = [s[0] for s in allgather_int64(name + ".sz", [len(data)], process_set)]
    gathered = _allgather(name + ".t", bytearray(data) or bytearray(1), _ringmaster.dtype.uint8,
                          len(data), process_set) if any(sizes) else b""
    out, start = [], 0
    for s in sizes:
        out.append(gathered[start:start + s])
        start += s
    return out


def broadcast_bytes(name, data, root_rank, process_set=None):
    """root_rank's `data` (bytes) on every rank (`data` is ignored elsewhere)."""
    mine = _basics.rank() == root_rank
    size = array.array("q", [len(data) if mine else 0])
    _broadcast(name + ".sz", size, _ringmaster.dtype.int64, 1, root_rank, process_set)
    if size[0] == 0:
        return b""
    payload = bytearray(data) if mine else bytearray(size[0])
    _broadcast(name + ".t", payload, _ringmaster.dtype.uint8, size[0], root_rank, process_set)
    return bytes(payload)


def broadcast_object(obj, root_rank=0, name=None, process_set=None):
    """Returns root_rank's `obj` (any picklable object) on every rank."""
    _process_sets.check(process_set)
    if name is None:
        name = type(obj).__name__
    data = b""
    if _basics.rank() == root_rank:
        b = io.BytesIO()
        pickle.dump(obj, b)
        data = b.getvalue()
    data = broadcast_bytes(name, data, root_rank, process_set)
    return obj if _basics.rank() == root_rank else pickle.loads(data)


def allgather_object(obj, name=None, process_set=None):
    """Returns the list of every rank's `obj` (any picklable object), in rank order."""
    _process_sets.check(process_set)
    if name is None:
        name = type(obj).__name__
    b = io.BytesIO()
    pickle.dump(obj, b)
    return [pickle.loads(d) for d in allgather_bytes(name, b.getvalue(), process_set)]
