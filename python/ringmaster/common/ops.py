"""Horovod's reduction ops, automatic names and error type, for every framework API."""
import warnings

from ringmaster import _ringmaster
from ringmaster.exceptions import HorovodInternalError

# Horovod's reduction op values (horovod.common.basics).
Average = 0
Sum = 1
Adasum = 2
Min = 3
Max = 4
Product = 5

# Horovod's op -> the client's ReduceOp code (Adasum is composed by the frameworks that have it).
RING_OPS = {
    Average: _ringmaster.op.average,
    Sum: _ringmaster.op.sum,
    Min: _ringmaster.op.min,
    Max: _ringmaster.op.max,
    Product: _ringmaster.op.product,
}


def handle_average_backwards_compatibility(op, average):
    """Horovod's `average=` (deprecated) against `op=`: both given is a ValueError; `average`
    alone warns and maps to Average or Sum; neither is Average."""
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of them.")
        return op
    if average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed in v1.0",
                      DeprecationWarning)
        return Average if average else Sum
    return Average


def op_name(prefix, name, handle):
    """The name an operation goes by: the caller's, or Horovod's automatic `<prefix>.noname.<n>`
    (every rank must then issue its unnamed operations in the same order)."""
    return name if name is not None else f"{prefix}.noname.{handle}"


def status_error(e):
    """The HorovodInternalError for a client StatusError(code, message)."""
    return HorovodInternalError(e.args[1] if len(e.args) > 1 else str(e))


def split_list(items, n):
    """`items` in n contiguous groups of near-equal length (Horovod's num_groups split)."""
    d, r = divmod(len(items), n)
    return [items[i * d + min(i, r):(i + 1) * d + min(i + 1, r)] for i in range(n)]


def rows_of(dim0, size, rank):
    """(first row, rows) of `rank`'s part of a first dimension of `dim0` rows split over `size`
    ranks as Horovod's reducescatter splits it: dim0 // size rows each, one more for the first
    dim0 % size."""
    base, extra = divmod(dim0, size)
    return rank * base + min(rank, extra), base + (1 if rank < extra else 0)
