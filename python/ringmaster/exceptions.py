"""Horovod's exception types (horovod.common.exceptions), raised by ringmaster.torch."""


class HorovodInternalError(RuntimeError):
    """A collective failed: the message is the coordinator's or the worker daemon's (a mismatch
    between ranks, a name already in flight, a peer that went away, the job being stopped)."""


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod elastic's signal that the hosts changed. Ringmaster has no elastic mode yet, so it is
    never raised; it exists so that `except hvd.HostsUpdatedInterrupt` keeps working."""

    def __init__(self, skip_sync=False):
        super().__init__()
        self.skip_sync = skip_sync
