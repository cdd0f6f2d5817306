"""Horovod elastic's framework-independent part (horovod.common.elastic): the State that a training
function commits and restores, and run_fn, the retry loop behind `hvd.elastic.run`.

What differs from Horovod: there is no notification manager (no listener thread, no timestamps).
Whether hosts were added is the daemon's to say: `check_host_updates()` asks every rank and all
ranks agree (a framework's state provides `_host_updates_agreed()`, a collective). ObjectState
deep-copies what it saves and what it restores, so mutating an attribute in place (a list, a dict)
after `commit()` does not change the committed value.
"""
import copy
import functools

from ringmaster.exceptions import HorovodInternalError, HostsUpdatedInterrupt


class State:
    """State kept in memory on every rank: committed with `commit()`, put back with `restore()`
    after a failure, made the same on every rank with `sync()` (rank 0's).

    `bcast_object(obj)` returns rank 0's `obj` on every rank; `get_rank()` returns this rank."""

    def __init__(self, bcast_object, get_rank):
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks):
        """Adds functions called (in order, no arguments) after every reset: ranks were added or
        removed, e.g. to rescale the learning rate to the new size()."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        """Called by run() after the reset: `reset()`, then the reset callbacks."""
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Saves the state (`save()`), then `check_host_updates()`. Collective: every rank calls
        it at the same point. Saving can be costly (copies off the GPU): commit every few batches
        rather than every batch, trading the work lost on a failure for speed."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt(skip_sync=False) on every rank when any rank was told
        that ranks were added to the job; returns otherwise. Collective."""
        if self._host_updates_agreed():
            raise HostsUpdatedInterrupt(skip_sync=False)

    def _host_updates_agreed(self):
        """True on every rank when any rank has seen a hosts-updated notice (a collective of the
        framework's: Horovod broadcasts rank 0's timestamp instead)."""
        raise NotImplementedError(
            "ringmaster: this State has no way to agree on host updates: use a framework's state "
            "(ringmaster.torch.elastic.TorchState)")

    def save(self):
        """Saves the state in host memory."""
        raise NotImplementedError()

    def restore(self):
        """Puts back the last saved state, undoing changes made since."""
        raise NotImplementedError()

    def sync(self):
        """Makes the state the same on every rank (rank 0's)."""
        raise NotImplementedError()

    def reset(self):
        """Resets objects after a reset event, before the next sync(). Nothing by default."""


class ObjectState(State):
    """State of plain picklable Python objects, each a keyword argument exposed as an attribute
    (`state.epoch`). Unlike Horovod's, saved and restored values are deep copies."""

    def __init__(self, bcast_object, get_rank, **kwargs):
        self._bcast_object = bcast_object
        self._saved_state = copy.deepcopy(kwargs)
        for attr, value in kwargs.items():
            setattr(self, attr, value)
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self):
        self._saved_state = {attr: copy.deepcopy(getattr(self, attr))
                             for attr in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self):
        for attr, value in self._saved_state.items():
            setattr(self, attr, copy.deepcopy(value))


def run_fn(func, reset):
    """Wraps `func(state, *args, **kwargs)` for elastic training: the state is synced, then func
    runs; when func (or the sync) raises HorovodInternalError the state is restored to its last
    commit, when it raises HostsUpdatedInterrupt it is kept; either way `reset()` (the framework's:
    reconnect for the job's next membership) and `state.on_reset()` run and the loop starts over,
    syncing again unless the interrupt said skip_sync. Returns func's result."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except HorovodInternalError:
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as e:
                skip_sync = e.skip_sync
            reset()
            state.on_reset()

    return wrapper
