"""Horovod's process sets, for every framework API: a subset of the job's ranks whose collectives
run among them alone. `ProcessSet([0, 2])`, registered with `init(process_sets=[...])` or
`add_process_set()`; `global_process_set` is every rank.

Registering is a collective of every rank, which must register the same sets in the same order.
Horovod's ids are reused first-freed-first; what the workers know a set by (its wire id) is never
reused in a process, so a set added after another was removed never meets its state."""
import collections
import os

from ringmaster import _ringmaster
from ringmaster import basics as _basics
from ringmaster.common.ops import status_error


class ProcessSet:
    """Horovod's process set. `rank()` is this process's place in the set (-1 when not included),
    `size()` its number of ranks."""

    def __init__(self, ranks):
        self.ranks = sorted(set(int(r) for r in ranks))
        self.process_set_id = None  # set when registered
        self._wire_id = None  # the workers' id of it, while registered

    def size(self):
        return len(self.ranks)

    def rank(self):
        me = _basics.rank()
        return self.ranks.index(me) if me in self.ranks else -1

    def included(self):
        return _basics.rank() in self.ranks

    def __repr__(self):
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


class _GlobalProcessSet(ProcessSet):
    """Every rank of the job (id 0)."""

    def __init__(self):
        self.process_set_id = 0

    @property
    def ranks(self):
        return list(range(_basics.size()))

    def size(self):
        return _basics.size()

    def rank(self):
        return _basics.rank()

    def included(self):
        return True

    def __repr__(self):
        return "ProcessSet(process_set_id=0, global)"


global_process_set = _GlobalProcessSet()
_process_sets = {}  # id -> registered ProcessSet (the global one excluded)
_next_process_set_id = [1]
# Ids of removed sets, reused first in the order they were freed (as Horovod's ProcessSetTable).
_free_process_set_ids = collections.deque()
# Never reused in this process, across init() calls too (every rank adds and removes the same sets
# in the same order, so every rank numbers them alike).
_next_wire_id = [1]
_dynamic_process_sets = [False]


def _dynamic_enabled():
    return _dynamic_process_sets[0] or os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS", "") not in (
        "", "0", "false", "False")


def _register(process_set):
    """Registers `process_set` (a ProcessSet or a list of ranks) on every rank at once: a
    collective of all ranks, which must pass the same ranks in the same order. ValueError names
    what differs."""
    from ringmaster.common.objects import allgather_int64  # it needs this module
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.process_set_id is not None:
        raise ValueError(f"{process_set} is registered already")
    size = _basics.size()
    ranks = process_set.ranks
    if not ranks or ranks[0] < 0 or ranks[-1] >= size:
        raise ValueError(f"process set ranks {ranks} must be ranks of the job, in [0, {size - 1}]")
    for existing in _process_sets.values():
        if existing.ranks == ranks:
            raise ValueError(f"a process set with ranks {ranks} exists already: {existing}")
    # Every rank must register the same set: compare what each one passed.
    mine = [len(ranks)] + ranks + [-1] * (size - len(ranks))
    ps_id = _free_process_set_ids[0] if _free_process_set_ids else _next_process_set_id[0]
    wire_id = _next_wire_id[0]
    everyone = allgather_int64(f"process_set.register.{wire_id}", mine,
                               process_set=global_process_set)
    for r, theirs in enumerate(everyone):
        if theirs != mine:
            raise ValueError(f"rank {r} registered process set {ps_id} with ranks "
                             f"{theirs[1:1 + theirs[0]]}, rank {_basics.rank()} with {ranks}: "
                             f"every rank must add the same process sets in the same order")
    if _free_process_set_ids:
        _free_process_set_ids.popleft()
    else:
        _next_process_set_id[0] += 1
    _next_wire_id[0] += 1
    process_set.process_set_id = ps_id
    process_set._wire_id = wire_id
    _process_sets[ps_id] = process_set
    return process_set


def init_framework(comm=None, process_sets=None):
    """A framework API's init(): connects this process to its rank's worker daemon (once; init()
    after shutdown() works), then registers `process_sets`: ProcessSets (or lists of ranks), in
    order (every rank passes the same), or "dynamic" to allow add_process_set() later."""
    if _basics.init(comm, None) is False:
        return
    init(process_sets)


def init(process_sets):
    """init(process_sets=...): a list of ProcessSets (or rank lists) registered in order, or
    "dynamic" to allow add_process_set() and remove_process_set() later."""
    _process_sets.clear()
    _next_process_set_id[0] = 1
    _free_process_set_ids.clear()
    _dynamic_process_sets[0] = process_sets == "dynamic"
    if process_sets in (None, "dynamic"):
        return
    for ps in process_sets:
        _register(ps)


def add_process_set(process_set):
    """Registers a process set while the job runs (every rank must call it with the same ranks,
    in the same order); returns it. Needs HOROVOD_DYNAMIC_PROCESS_SETS=1 or
    init(process_sets="dynamic"), as Horovod does."""
    if not _dynamic_enabled():
        raise ValueError("Process sets can only be added when dynamic process sets are enabled: "
                         "set HOROVOD_DYNAMIC_PROCESS_SETS=1 or call "
                         "hvd.init(process_sets='dynamic')")
    return _register(process_set)


def remove_process_set(process_set):
    """Unregisters a process set added before (every rank must call it); True when it was
    registered. The global process set cannot be removed."""
    if not _dynamic_enabled():
        raise ValueError("Process sets can only be removed when dynamic process sets are "
                         "enabled: set HOROVOD_DYNAMIC_PROCESS_SETS=1 or call "
                         "hvd.init(process_sets='dynamic')")
    if process_set is global_process_set or process_set.process_set_id == 0:
        raise ValueError("The global process set cannot be removed")
    ps_id = process_set.process_set_id
    if ps_id is None or _process_sets.get(ps_id) is not process_set:
        return False
    # A barrier of every rank (each removes it at the same point of its operations), after which
    # the daemons release the set's communicators.
    try:
        _basics.client().release_process_set(process_set._wire_id)
    except _ringmaster.StatusError as e:
        raise status_error(e) from None
    del _process_sets[ps_id]
    _free_process_set_ids.append(ps_id)
    process_set.process_set_id = None
    process_set._wire_id = None
    return True


def wire_of(process_set):
    """(wire id, ranks) of a process set this rank may run collectives in ((0, []) for the global
    one); ValueError otherwise."""
    if process_set is None or process_set is global_process_set or \
            process_set.process_set_id == 0:
        return 0, []
    if not isinstance(process_set, ProcessSet):
        raise ValueError(f"process_set must be a ProcessSet, got {type(process_set).__name__}")
    ps_id = process_set.process_set_id
    if ps_id is None or _process_sets.get(ps_id) is not process_set:
        raise ValueError(f"{process_set} is not registered: pass it to hvd.init(process_sets=...) "
                         f"or hvd.add_process_set() first")
    if not process_set.included():
        raise ValueError(f"rank {_basics.rank()} is not in process set {ps_id} (ranks "
                         f"{process_set.ranks})")
    return process_set._wire_id, process_set.ranks


def check(process_set):
    """ValueError unless this rank may run collectives in `process_set`."""
    wire_of(process_set)


def size_of(process_set):
    """The number of ranks of `process_set` (None: the global set)."""
    return _basics.size() if process_set is None else process_set.size()


class InSet:
    """Within it, the client's operations submitted by this thread run in `process_set`."""

    def __init__(self, process_set):
        self.ps_id, self.ranks = wire_of(process_set)

    def __enter__(self):
        if self.ps_id != 0:
            _basics.client().set_process_set(self.ps_id, self.ranks)
        return self

    def __exit__(self, *exc):
        if self.ps_id != 0:
            _basics.client().set_process_set(0, [])
