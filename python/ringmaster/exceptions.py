"""Horovod's exception types (horovod.common.exceptions), raised by ringmaster.torch."""


class HorovodInternalError(RuntimeError):
    """A collective failed: the message is the coordinator's or the worker daemon's (a mismatch
    between ranks, a name already in flight, a peer that went away, the job being stopped)."""


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod elastic's signal that the hosts changed: raised on every rank by `state.commit()`
    (`state.check_host_updates()`) when ranks were added to an elastic job; `hvd.elastic.run`
    catches it, keeps the state and starts the training function again with the new ranks.
    `skip_sync`: the state need not be synced again (Ringmaster raises it with False)."""

    def __init__(self, skip_sync=False):
        super().__init__()
        self.skip_sync = skip_sync
