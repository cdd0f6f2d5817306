"""Process-wide state shared by the framework APIs: the connection to this rank's worker daemon,
the job's topology, and the capability queries (Horovod's horovod.common.basics).

One connection per process. `init()` opens it (from $RINGMASTER_SOCKET, which the worker sets for
the processes it launches); `shutdown()` ends this process's use of it, and the connection itself
closes when the process exits, so `init()` after `shutdown()` works and tensors that live in the
shared arena stay valid in between. Thread-safe.
"""
import atexit
import ctypes
import os
import threading
import warnings

from ringmaster import _ringmaster
from ringmaster.exceptions import HorovodInternalError

_NOT_INITIALIZED = "Horovod has not been initialized; use hvd.init()."

_lock = threading.Lock()
_client = None  # _ringmaster.Client: connected by the first init(), closed at exit
_topology = None  # _ringmaster.Topology of the connected rank
_initialized = False
# Every rank's local_size, gathered once per process without blocking init(); is_homogeneous()
# waits for it.
_local_sizes_handle = None
_local_size_input = None  # the allgather's input: alive until it completes
_homogeneous = None


def _connect_timeout_seconds():
    value = os.environ.get("RINGMASTER_CONNECT_TIMEOUT_SECONDS", "60")
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"RINGMASTER_CONNECT_TIMEOUT_SECONDS={value!r} is not a number") from None


def init(comm=None, process_sets=None):
    """Connects to this rank's worker daemon (once per process) and marks Ringmaster initialized.

    `comm` (an MPI communicator or a list of ranks) is a Horovod option that Ringmaster does not
    support: ranks and their placement come from the job. `process_sets` is the frameworks' (see
    ringmaster.torch.init).
    Returns True when this call initialized, False when already initialized."""
    global _client, _topology, _initialized
    if comm is not None:
        raise NotImplementedError(
            "ringmaster: init(comm=...) is not supported: the job's ranks are set by `ringmaster "
            "local/submit --np N`, not by an MPI communicator")
    with _lock:
        if _initialized:
            return False
        if _client is None:
            try:
                client = _ringmaster.Client.connect("", _connect_timeout_seconds())
            except _ringmaster.StatusError as e:
                raise HorovodInternalError(f"ringmaster: init() failed: {e.args[1]}") from None
            _client = client
            _topology = client.topology
            atexit.register(_close)
            _start_local_sizes_allgather()
        _initialized = True
        return True


def _start_local_sizes_allgather():
    global _local_sizes_handle, _local_size_input
    _local_size_input = (ctypes.c_int64 * 1)(_topology.local_size)
    try:
        _local_sizes_handle = _client.allgather(
            "ringmaster.init.local_sizes", ctypes.addressof(_local_size_input),
            _ringmaster.dtype.int64, [1])
    except _ringmaster.StatusError as e:
        raise HorovodInternalError(f"ringmaster: init() failed: {e.args[1]}") from None


def _elastic_timeout_seconds():
    for name in ("RINGMASTER_ELASTIC_TIMEOUT", "HOROVOD_ELASTIC_TIMEOUT"):
        value = os.environ.get(name)
        if value:
            try:
                return float(value)
            except ValueError:
                raise ValueError(f"{name}={value!r} is not a number") from None
    return 600.0


def _elastic_reset():
    """Elastic jobs (hvd.elastic.run): leaves this process's epoch and joins the job's next one.
    Its daemon asks the coordinator for a new epoch (unless one has started already) and welcomes
    this process into it, with its rank and size in the new epoch; waits at most the job's elastic
    timeout. Operations of the old epoch still in flight fail."""
    global _client, _topology, _initialized, _homogeneous
    with _lock:
        old = _client
        after = _topology.epoch if _topology is not None else 0
        try:
            client = _ringmaster.Client.connect("", _elastic_timeout_seconds(), after)
        except _ringmaster.StatusError as e:
            raise HorovodInternalError(f"ringmaster: no new epoch to join: {e.args[1]}") from None
        _client = client
        _topology = client.topology
        _homogeneous = None
        if old is None:
            atexit.register(_close)
        _initialized = True
        _start_local_sizes_allgather()
    if old is not None:
        old.shutdown()  # its arena stays mapped while tensors in it live


def _hosts_updated():
    """Elastic jobs: whether this rank's daemon said that workers were added to the job."""
    c = _client
    return c is not None and c.hosts_updated


def is_homogeneous():
    """True when every host runs the same number of ranks."""
    global _homogeneous
    c = client()
    with _lock:
        if _homogeneous is None:
            try:
                c.wait(_local_sizes_handle)
                gathered = c.take_allgather(_local_sizes_handle)
            except _ringmaster.StatusError as e:
                raise HorovodInternalError(e.args[1]) from None
            sizes = memoryview(gathered).cast("q").tolist()
            _homogeneous = len(set(sizes)) == 1
        return _homogeneous


def shutdown():
    """Marks Ringmaster uninitialized. Operations still in flight complete (or fail) on their own;
    the connection to the daemon stays open until the process exits."""
    global _initialized
    with _lock:
        _initialized = False


# How long a process leaving at exit waits for its peers to have initialized (below).
_EXIT_INIT_WAIT_SECONDS = 30.0


def _close():
    global _initialized
    _initialized = False
    c = _client
    if c is None:
        return
    # Horovod's init() is collective: no rank leaves before every rank has initialized. Here init's
    # allgather of the ranks' local sizes runs in the background, so a rank that finishes at once
    # waits for it at exit (bounded; it fails at once if a peer is gone): its peers' init then
    # completes, and what they call next fails naming this rank, as in Horovod.
    if _homogeneous is None and _local_sizes_handle is not None:
        try:
            c.wait(_local_sizes_handle, _EXIT_INIT_WAIT_SECONDS)
        except Exception:  # noqa: BLE001 - leaving anyway; a peer's error is the peer's to report
            pass
    c.shutdown()


def is_initialized():
    return _initialized


def client():
    """The connected client. REQUIRES: init() was called (ValueError otherwise, as Horovod's)."""
    if not _initialized:
        raise ValueError(_NOT_INITIALIZED)
    return _client


def topology():
    if not _initialized:
        raise ValueError(_NOT_INITIALIZED)
    return _topology


def size():
    return topology().size


def rank():
    return topology().rank


def local_size():
    return topology().local_size


def local_rank():
    return topology().local_rank


def cross_size():
    return topology().cross_size


def cross_rank():
    return topology().cross_rank


def job_id():
    """The Ringmaster job this process belongs to (no Horovod equivalent)."""
    return topology().job_id


def host():
    """The host name this rank's worker reports (no Horovod equivalent)."""
    return topology().host


# Capabilities of this build: the CPU data plane with Gloo.
def gloo_built():
    return True


def gloo_enabled():
    return True


def mpi_built():
    return False


def mpi_enabled():
    return False


def mpi_threads_supported():
    return False


def nccl_built():
    """As Horovod's: NCCL's version code (NCCL_VERSION_CODE, e.g. 22809 for 2.28.9) when this build
    has the NCCL data plane (worker daemons serving GPUs), else 0. Scripts compare it with version
    numbers, or take it as a truth value."""
    from ringmaster import _ringmaster
    return int(_ringmaster.NCCL_VERSION_CODE)


def ddl_built():
    return False


def ccl_built():
    return False


def cuda_built():
    from ringmaster import _ringmaster
    return bool(_ringmaster.CUDA_BUILT)


def rocm_built():
    return False


def start_timeline(file_path, mark_cycles=False):
    """Accepted and ignored: in Ringmaster the timeline is a job option."""
    warnings.warn(
        "ringmaster: start_timeline() does nothing; the timeline is a job option "
        "(`ringmaster local/submit --timeline FILE [--timeline-mark-cycles]`, or HOROVOD_TIMELINE)",
        stacklevel=2)


def stop_timeline():
    """Accepted and ignored: in Ringmaster the timeline is a job option."""
    warnings.warn(
        "ringmaster: stop_timeline() does nothing; the timeline is a job option "
        "(`ringmaster local/submit --timeline FILE`, or HOROVOD_TIMELINE)", stacklevel=2)
