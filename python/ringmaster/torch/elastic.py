"""Horovod elastic for PyTorch (horovod.torch.elastic): `hvd.elastic.run`, `TorchState` and
`ElasticSampler`, as Horovod's (one module here, where Horovod has a package).

A reset (after HorovodInternalError or HostsUpdatedInterrupt) closes this process's connection
and connects again to its worker daemon for the job's next membership, where Horovod calls
shutdown() and init(). Host updates are agreed by an allreduce (Max) of every rank's notice, where
Horovod broadcasts rank 0's.
"""
import copy
import math
import random

import torch

from ringmaster import basics as _basics
from ringmaster.elastic import ObjectState, run_fn
from ringmaster.torch import mpi_ops as _mpi_ops
from ringmaster.torch.functions import (allgather_object, broadcast_object,
                                        broadcast_optimizer_state, broadcast_parameters)

_HOST_UPDATES_NAME = "ringmaster.elastic.check_host_updates"


def run(func):
    """Decorator running `func(state, *args, **kwargs)` elastically: the state is synced from rank
    0 first; when a collective fails (HorovodInternalError) the state is restored to its last
    commit, when ranks were added (HostsUpdatedInterrupt from `state.commit()`) it is kept; then
    this process reconnects for the job's new membership, the reset callbacks run and func starts
    again. Call no collectives before the wrapped function: ranks that join would run them while
    the others sync the state (a deadlock)."""
    return run_fn(func, _reset)


def _reset():
    _basics._elastic_reset()
    after = getattr(_mpi_ops, "_reset_after_elastic", None)
    if after is not None:
        after()


def _host_updates_agreed():
    """True on every rank when any rank's daemon said ranks were added (an allreduce Max)."""
    seen = 1 if _basics._hosts_updated() else 0
    agreed = _mpi_ops.allreduce(torch.tensor([seen], dtype=torch.int32), name=_HOST_UPDATES_NAME,
                                op=_mpi_ops.Max)
    return int(agreed[0]) > 0


class ElasticSampler(torch.utils.data.Sampler):
    """Partitions a dataset across ranks, as DistributedSampler, and after a reset partitions the
    indices not yet processed this epoch across the new ranks.

    Give it to the TorchState, call `record_batch()` after each batch and `set_epoch()` at the END
    of each epoch (it clears the processed indices). `shuffle`: shuffle the indices every epoch
    (the same order on every rank, from `seed` + epoch)."""

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed

        self.epoch = 0
        self.processed_indices = set()

        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices = []
        self.num_samples = 0
        self.total_size = 0
        self.indices = []

        self.reset()

    def set_epoch(self, epoch):
        """Starts epoch `epoch`: clears the processed indices and partitions the whole dataset."""
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Records this rank's batch `batch_idx` (of `batch_size` samples) as processed."""
        self.record_indices(self.get_indices(batch_idx, batch_size))

    def record_indices(self, indices):
        """Records dataset indices `indices` as processed."""
        self.processed_indices.update(indices)

    def get_indices(self, batch_idx, batch_size):
        """This rank's dataset indices of batch `batch_idx` of `batch_size` samples (of the last
        iteration)."""
        start = batch_idx * batch_size
        end = min(start + batch_size, len(self.indices))
        return self.indices[start:end]

    def load_state_dict(self, state_dict):
        self.epoch = state_dict["epoch"]
        self.processed_indices = state_dict["processed_indices"]
        self.reset()

    def state_dict(self):
        return dict(epoch=self.epoch, processed_indices=self.processed_indices)

    def reset(self):
        """Takes size() and rank() again and the indices not processed yet."""
        self.num_replicas = _basics.size()
        self.rank = _basics.rank()
        self.remaining_indices = [i for i in range(len(self.dataset))
                                  if i not in self.processed_indices]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        self.indices = self.remaining_indices[:]
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(self.indices)
        # Repeat the first indices so that every rank gets num_samples.
        self.indices += self.indices[:(self.total_size - len(self.indices))]
        assert len(self.indices) == self.total_size
        self.indices = self.indices[self.rank:self.total_size:self.num_replicas]
        assert len(self.indices) == self.num_samples
        return iter(self.indices)

    def __len__(self):
        return self.num_samples


class StateHandler:
    """Saves, restores and syncs one object of a TorchState (by its type: see the registry)."""

    def __init__(self, value):
        self.value = value

    def save(self):
        raise NotImplementedError()

    def restore(self):
        raise NotImplementedError()

    def sync(self):
        raise NotImplementedError()

    def set_value(self, value):
        """A new object assigned to the state's attribute: saved at once."""
        self.value = value
        self.save()


class ModelStateHandler(StateHandler):
    """A torch.nn.Module: its state_dict, deep-copied in memory; synced by broadcast_parameters."""

    def __init__(self, model):
        super().__init__(model)
        self._saved_model_state = copy.deepcopy(self.value.state_dict())

    def save(self):
        self._saved_model_state = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self._saved_model_state)

    def sync(self):
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class OptimizerStateHandler(StateHandler):
    """A torch.optim.Optimizer: its state_dict, deep-copied in memory; synced by
    broadcast_optimizer_state."""

    def __init__(self, optimizer):
        super().__init__(optimizer)
        self._saved_optimizer_state = copy.deepcopy(self.value.state_dict())

    def save(self):
        self._saved_optimizer_state = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self._saved_optimizer_state)

    def sync(self):
        broadcast_optimizer_state(self.value, root_rank=0)


class LRSchedulerStateHandler(StateHandler):
    """A learning rate scheduler: its state_dict; synced by broadcast_object."""

    def __init__(self, scheduler):
        super().__init__(scheduler)
        self._saved_scheduler_state = copy.deepcopy(self.value.state_dict())

    def save(self):
        self._saved_scheduler_state = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self._saved_scheduler_state)

    def sync(self):
        self.value.load_state_dict(broadcast_object(self.value.state_dict()))


class SamplerStateHandler(StateHandler):
    """An ElasticSampler: saving gathers every rank's processed indices (a collective), so that a
    restore and the repartition after a reset skip what any rank processed.

    Unlike Horovod's, save() also gives the sampler the gathered indices (this iteration's
    partition is unchanged: only reset() repartitions), so the sync after a HostsUpdatedInterrupt,
    which broadcasts rank 0's sampler without restoring, keeps what the other ranks processed; and
    restore() loads a copy, so that indices recorded later leave the saved state alone."""

    def __init__(self, sampler):
        super().__init__(sampler)
        self._saved_sampler_state = copy.deepcopy(self.value.state_dict())

    def save(self):
        processed = set().union(*allgather_object(self.value.processed_indices))
        self.value.processed_indices = set(processed)
        state_dict = copy.deepcopy(self.value.state_dict())
        state_dict["processed_indices"] = processed
        self._saved_sampler_state = state_dict

    def restore(self):
        self.value.load_state_dict(copy.deepcopy(self._saved_sampler_state))

    def sync(self):
        self.value.load_state_dict(broadcast_object(self.value.state_dict()))


_LRScheduler = getattr(torch.optim.lr_scheduler, "LRScheduler",
                       torch.optim.lr_scheduler._LRScheduler)

_handler_registry = [
    (torch.nn.Module, ModelStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
    (_LRScheduler, LRSchedulerStateHandler),
    (ElasticSampler, SamplerStateHandler),
]


def get_handler_registry():
    """The (type, StateHandler class) pairs TorchState picks handlers from, first match wins."""
    return _handler_registry


def set_handler_registry(registry):
    global _handler_registry
    _handler_registry = registry


def _get_handler(value):
    for handler_type, handler_cls in _handler_registry:
        if isinstance(value, handler_type):
            return handler_cls(value)
    return None


def _get_handlers(kwargs):
    handlers = {}
    remainder = {}
    for key, value in kwargs.items():
        handler = _get_handler(value)
        if handler is not None:
            handlers[key] = handler
        else:
            remainder[key] = value
    return handlers, remainder


class TorchState(ObjectState):
    """State of a PyTorch training process: `model` and `optimizer`, and any keyword arguments,
    exposed as attributes. Models, optimizers, LR schedulers and ElasticSamplers (any number, as
    keyword arguments) are saved, restored and synced by their handlers; other values as
    ObjectState's (deep copies, broadcast from rank 0). Assigning a new model (or other handled
    object) to its attribute saves it at once."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(dict(model=model, optimizer=optimizer))
        self._handlers, kwargs = _get_handlers(kwargs)
        for name, handler in self._handlers.items():
            setattr(self, name, handler.value)
        super().__init__(bcast_object=broadcast_object, get_rank=_basics.rank, **kwargs)

    def save(self):
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self):
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self):
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def _host_updates_agreed(self):
        return _host_updates_agreed()

    def __setattr__(self, name, value):
        if hasattr(self, name) and name in self._handlers:
            self._handlers[name].set_value(value)
        super().__setattr__(name, value)


__all__ = ["ElasticSampler", "TorchState", "run"]
