"""Horovod elastic's Python side (ringmaster.elastic, ringmaster.torch.elastic) in one process, no
daemon: the collectives, rank() and size() are replaced by single-process fakes (monkeypatch), so
what is checked is the logic: commit/restore round trips, run()'s retry loop, the host-update
agreement and ElasticSampler's partitions.

    PYTHONPATH=python /usr/bin/python3 -m pytest -q -p no:cacheprovider \
        tests/python/test_elastic_unit.py

The sources under python/ are imported (put first on sys.path here). They do not hold the compiled
ringmaster._ringmaster (it is built into <build>/python/ringmaster): when it cannot be imported, a
stand-in with the names the modules read at import time is installed; nothing here calls it.
"""
import copy
import importlib
import os
import random
import sys
import types

import pytest

torch = pytest.importorskip("torch")

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")
if "ringmaster" not in sys.modules:
    sys.path.insert(0, os.path.normpath(SRC))

import ringmaster  # noqa: E402

try:
    importlib.import_module("ringmaster._ringmaster")
except ImportError:
    class _Names:
        def __getattr__(self, name):
            return name

    _fake = types.ModuleType("ringmaster._ringmaster")
    _fake.op = _Names()
    _fake.dtype = _Names()
    _fake.StatusError = type("StatusError", (Exception,), {})
    sys.modules["ringmaster._ringmaster"] = _fake
    ringmaster._ringmaster = _fake

import ringmaster.torch as hvd  # noqa: E402
from ringmaster import basics as _basics  # noqa: E402
from ringmaster import elastic as common_elastic  # noqa: E402
from ringmaster.exceptions import HorovodInternalError, HostsUpdatedInterrupt  # noqa: E402
from ringmaster.torch import elastic  # noqa: E402
from ringmaster.torch import mpi_ops as _mpi_ops  # noqa: E402


class World:
    """This process's view of the job, and what the fakes were asked to do."""

    def __init__(self):
        self.rank = 0
        self.size = 1
        self.hosts_updated = False  # this rank's notice
        self.others_hosts_updated = False  # any other rank's notice (the allreduce's other inputs)
        self.others_processed = []  # other ranks' processed_indices, for allgather_object
        self.events = []
        self.allreduces = []


@pytest.fixture
def world(monkeypatch):
    w = World()
    monkeypatch.setattr(_basics, "rank", lambda: w.rank)
    monkeypatch.setattr(_basics, "size", lambda: w.size)
    monkeypatch.setattr(_basics, "_hosts_updated", lambda: w.hosts_updated, raising=False)

    def elastic_reset():
        w.events.append("reset")

    def reset_after_elastic():
        w.events.append("reset_after")

    monkeypatch.setattr(_basics, "_elastic_reset", elastic_reset, raising=False)
    monkeypatch.setattr(_mpi_ops, "_reset_after_elastic", reset_after_elastic, raising=False)

    def broadcast_object(obj, root_rank=0, name=None, process_set=None):
        assert root_rank == 0
        w.events.append("bcast_object")
        return obj  # rank 0's own object, as the real one returns on rank 0

    def broadcast_parameters(params, root_rank, process_set=None):
        assert root_rank == 0
        w.events.append("bcast_parameters")

    def broadcast_optimizer_state(optimizer, root_rank, process_set=None):
        assert root_rank == 0
        w.events.append("bcast_optimizer")

    def allgather_object(obj, name=None, process_set=None):
        return [obj] + list(w.others_processed)

    def allreduce(tensor, average=None, name=None, compression=None, op=None, **kwargs):
        w.allreduces.append((tensor.clone(), name, op))
        other = torch.tensor([1 if w.others_hosts_updated else 0], dtype=tensor.dtype)
        return torch.maximum(tensor, other)

    monkeypatch.setattr(elastic, "broadcast_object", broadcast_object)
    monkeypatch.setattr(elastic, "broadcast_parameters", broadcast_parameters)
    monkeypatch.setattr(elastic, "broadcast_optimizer_state", broadcast_optimizer_state)
    monkeypatch.setattr(elastic, "allgather_object", allgather_object)
    monkeypatch.setattr(_mpi_ops, "allreduce", allreduce)
    return w


class AgreeingObjectState(common_elastic.ObjectState):
    """An ObjectState whose hosts-updated agreement is a flag."""

    hosts_updated = False

    def _host_updates_agreed(self):
        return self.hosts_updated


def fixed_model_and_optimizer():
    model = torch.nn.Linear(3, 2)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]]))
        model.bias.copy_(torch.tensor([0.1, -0.2]))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, optimizer


def train_step(model, optimizer, scale=1.0):
    optimizer.zero_grad()
    x = torch.tensor([[1.0, 2.0, 3.0], [-1.0, 0.5, 2.0]]) * scale
    loss = (model(x) ** 2).sum()
    loss.backward()
    optimizer.step()


def model_copy(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def momentum_copy(optimizer):
    return [optimizer.state[p]["momentum_buffer"].clone()
            for group in optimizer.param_groups for p in group["params"]]


def assert_model_equal(model, expected):
    state = model.state_dict()
    assert sorted(state) == sorted(expected)
    for k, v in expected.items():
        assert torch.equal(state[k], v), k


def assert_momentum_equal(optimizer, expected):
    got = momentum_copy(optimizer)
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert torch.equal(a, b)


# ---- ObjectState ----

def test_object_state_commit_restore_round_trip():
    bcasts = []

    def bcast(obj):
        bcasts.append(copy.deepcopy(obj))
        return obj

    seen = [1]
    state = AgreeingObjectState(bcast, lambda: 0, epoch=0, batch=0, seen=seen)
    assert (state.epoch, state.batch, state.seen) == (0, 0, [1])
    assert state.seen is seen  # the attributes are the objects given, as Horovod's

    state.epoch = 3
    state.seen.append(2)
    state.commit()

    state.epoch = 5
    state.batch = 7
    state.seen.append(9)
    state.restore()
    assert (state.epoch, state.batch, state.seen) == (3, 0, [1, 2])

    # The committed values are copies: changing the restored list in place changes nothing saved.
    state.seen.append(10)
    state.restore()
    assert state.seen == [1, 2]

    state.sync()
    assert bcasts == [{"epoch": 3, "batch": 0, "seen": [1, 2]}]


def test_object_state_sync_takes_rank0_values():
    state = AgreeingObjectState(lambda obj: {"epoch": 4, "batch": 11}, lambda: 1, epoch=0, batch=0)
    state.sync()
    assert (state.epoch, state.batch) == (4, 11)
    state.epoch = 6
    state.restore()
    assert state.epoch == 4


def test_base_state_needs_an_agreement_hook():
    state = common_elastic.ObjectState(lambda obj: obj, lambda: 0, epoch=0)
    with pytest.raises(NotImplementedError):
        state.commit()


# ---- TorchState ----

def test_torch_state_restore_puts_back_model_and_optimizer(world):
    model, optimizer = fixed_model_and_optimizer()
    state = elastic.TorchState(model, optimizer, epoch=0)
    assert state.model is model and state.optimizer is optimizer

    train_step(model, optimizer)  # creates the momentum buffers
    state.epoch = 1
    state.commit()
    committed_model = model_copy(model)
    committed_momentum = momentum_copy(optimizer)

    train_step(model, optimizer, 2.0)
    train_step(model, optimizer, -1.0)
    state.epoch = 2
    assert not torch.equal(model.weight.detach(), committed_model["weight"])
    assert not torch.equal(momentum_copy(optimizer)[0], committed_momentum[0])

    state.restore()
    assert_model_equal(model, committed_model)
    assert_momentum_equal(optimizer, committed_momentum)
    assert state.epoch == 1
    # The optimizer still steps the model's own parameters.
    assert optimizer.param_groups[0]["params"][0] is model.weight

    # Training on from the restored state and restoring again gives the commit once more.
    train_step(model, optimizer, 3.0)
    state.restore()
    assert_model_equal(model, committed_model)
    assert_momentum_equal(optimizer, committed_momentum)


def test_torch_state_restore_before_any_commit_gives_initial_state(world):
    model, optimizer = fixed_model_and_optimizer()
    initial = model_copy(model)
    state = elastic.TorchState(model=model, optimizer=optimizer)
    train_step(model, optimizer)
    state.restore()
    assert_model_equal(model, initial)
    assert optimizer.state_dict()["state"] == {}


def test_torch_state_sync_broadcasts_model_optimizer_then_objects(world):
    model, optimizer = fixed_model_and_optimizer()
    state = elastic.TorchState(model, optimizer, epoch=0)
    world.events.clear()
    state.sync()
    assert world.events == ["bcast_parameters", "bcast_optimizer", "bcast_object"]


def test_torch_state_assigning_a_new_model_saves_it(world):
    model, optimizer = fixed_model_and_optimizer()
    state = elastic.TorchState(model, optimizer)
    other, _ = fixed_model_and_optimizer()
    with torch.no_grad():
        other.weight.fill_(7.0)
    state.model = other
    assert state.model is other
    expected = model_copy(other)
    with torch.no_grad():
        other.weight.fill_(-1.0)
    state.restore()
    assert_model_equal(other, expected)


# ---- check_host_updates ----

def test_check_host_updates_raises_only_when_agreed(world):
    state = elastic.TorchState(epoch=0)
    state.check_host_updates()  # nobody saw a notice
    assert len(world.allreduces) == 1
    tensor, name, op = world.allreduces[0]
    assert name == "ringmaster.elastic.check_host_updates"
    assert op == hvd.Max
    assert tensor.dtype == torch.int32 and tensor.tolist() == [0]

    world.others_hosts_updated = True  # another rank saw one: this one raises too
    with pytest.raises(HostsUpdatedInterrupt) as e:
        state.check_host_updates()
    assert e.value.skip_sync is False
    assert world.allreduces[1][0].tolist() == [0]

    world.others_hosts_updated = False
    world.hosts_updated = True  # this rank saw one: it contributes 1
    with pytest.raises(HostsUpdatedInterrupt):
        state.commit()
    assert world.allreduces[2][0].tolist() == [1]


def test_commit_saves_before_checking(world):
    state = elastic.TorchState(epoch=0)
    world.hosts_updated = True
    state.epoch = 3
    with pytest.raises(HostsUpdatedInterrupt):
        state.commit()
    state.epoch = 4
    state.restore()
    assert state.epoch == 3


# ---- run() ----

def test_run_retries_after_internal_error_with_state_restored(world):
    model, optimizer = fixed_model_and_optimizer()
    state = elastic.TorchState(model, optimizer, batch=0)
    callbacks = []
    state.register_reset_callbacks([lambda: callbacks.append("a"), lambda: callbacks.append("b")])
    seen = []

    @hvd.elastic.run
    def train(state, factor):
        seen.append((state.batch, model_copy(state.model)))
        world.events.append("train")
        if len(seen) == 1:
            train_step(state.model, state.optimizer)
            state.batch = 1
            state.commit()
            train_step(state.model, state.optimizer, 2.0)
            state.batch = 2
            raise HorovodInternalError("a peer went away")
        return state.batch * factor

    world.events.clear()
    assert train(state, 10) == 10
    assert callbacks == ["a", "b"]
    assert world.events.count("reset") == 1 and world.events.count("reset_after") == 1
    # Synced, ran, reset (the daemon's, then mpi_ops'), synced again, ran again.
    assert [e for e in world.events if e != "bcast_optimizer" and e != "bcast_object"] == [
        "bcast_parameters", "train", "reset", "reset_after", "bcast_parameters", "train"]
    # The second run saw the state as committed: one step taken, not two.
    assert seen[1][0] == 1
    one_step, one_step_optimizer = fixed_model_and_optimizer()
    train_step(one_step, one_step_optimizer)
    for k, v in model_copy(one_step).items():
        assert torch.equal(seen[1][1][k], v), k
    assert not torch.equal(seen[1][1]["weight"], seen[0][1]["weight"])
    assert_model_equal(state.model, model_copy(one_step))
    assert_momentum_equal(state.optimizer, momentum_copy(one_step_optimizer))


def test_run_reset_callbacks_follow_the_reset(world):
    state = AgreeingObjectState(lambda obj: obj, lambda: 0, n=0)
    order = []
    state.register_reset_callbacks([lambda: order.append("callback")])
    resets = []

    def reset():
        order.append("reset")
        resets.append(1)

    calls = []

    def func(state):
        calls.append(1)
        if len(calls) < 3:
            raise HorovodInternalError("failed")
        return "done"

    assert common_elastic.run_fn(func, reset)(state) == "done"
    assert order == ["reset", "callback", "reset", "callback"]
    assert len(resets) == 2


def test_run_without_mpi_ops_reset_hook(world, monkeypatch):
    monkeypatch.delattr(_mpi_ops, "_reset_after_elastic", raising=False)
    state = elastic.TorchState(n=0)
    calls = []

    @elastic.run
    def train(state):
        calls.append(1)
        if len(calls) == 1:
            raise HorovodInternalError("failed")
        return len(calls)

    world.events.clear()
    assert train(state) == 2
    assert world.events.count("reset") == 1 and "reset_after" not in world.events


def test_run_hosts_updated_keeps_state_and_syncs_again(world):
    model, optimizer = fixed_model_and_optimizer()
    state = elastic.TorchState(model, optimizer, batch=0)
    restores = []
    real_restore = state.restore
    state.restore = lambda: (restores.append(1), real_restore())
    callbacks = []
    state.register_reset_callbacks([lambda: callbacks.append(1)])
    seen = []

    @elastic.run
    def train(state):
        seen.append((state.batch, model_copy(state.model)))
        if len(seen) == 1:
            train_step(state.model, state.optimizer)
            state.batch = 5
            world.hosts_updated = True
            state.commit()  # saves, then raises HostsUpdatedInterrupt(skip_sync=False)
        return state.batch

    world.events.clear()
    assert train(state) == 5
    after_step = seen[1][1]
    assert restores == []
    assert callbacks == [1]
    assert world.events.count("bcast_parameters") == 2  # synced again: skip_sync was False
    assert world.events.count("reset") == 1
    assert_model_equal(model, after_step)


def test_run_hosts_updated_skip_sync_keeps_uncommitted_changes(world):
    model, optimizer = fixed_model_and_optimizer()
    state = elastic.TorchState(model, optimizer, batch=0)
    seen = []

    @elastic.run
    def train(state):
        seen.append((state.batch, model_copy(state.model)))
        if len(seen) == 1:
            train_step(state.model, state.optimizer)
            state.batch = 9  # not committed
            raise HostsUpdatedInterrupt(skip_sync=True)
        return state.batch

    world.events.clear()
    assert train(state) == 9  # neither restored nor synced back to the committed 0
    assert world.events.count("bcast_parameters") == 1
    assert world.events.count("reset") == 1
    assert not torch.equal(seen[1][1]["weight"], seen[0][1]["weight"])


def test_run_internal_error_during_sync_restores_and_retries(world):
    state = AgreeingObjectState(lambda obj: obj, lambda: 0, n=1)
    syncs = []
    real_sync = state.sync

    def sync():
        syncs.append(1)
        if len(syncs) == 1:
            raise HorovodInternalError("broadcast failed")
        real_sync()

    state.sync = sync
    resets = []
    assert common_elastic.run_fn(lambda s: s.n, lambda: resets.append(1))(state) == 1
    assert len(syncs) == 2 and len(resets) == 1


# ---- ElasticSampler ----

def sampler_for(world, rank, size, dataset, **kwargs):
    world.rank, world.size = rank, size
    return elastic.ElasticSampler(dataset, **kwargs)


def test_elastic_sampler_partitions_as_horovod(world):
    dataset = list(range(10))
    s0 = sampler_for(world, 0, 2, dataset, shuffle=False)
    s1 = sampler_for(world, 1, 2, dataset, shuffle=False)
    assert list(iter(s0)) == [0, 2, 4, 6, 8]
    assert list(iter(s1)) == [1, 3, 5, 7, 9]
    assert len(s0) == len(s1) == 5

    # Uneven: the first indices are repeated to give every rank as many.
    t = [sampler_for(world, r, 3, dataset, shuffle=False) for r in range(3)]
    assert [list(iter(s)) for s in t] == [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]

    # Shuffled: the same order on every rank, from seed + epoch.
    for epoch in (0, 3):
        order = list(range(10))
        random.Random(7 + epoch).shuffle(order)
        parts = []
        for r in range(2):
            s = sampler_for(world, r, 2, dataset, shuffle=True, seed=7)
            if epoch:
                s.set_epoch(epoch)
            parts.append(list(iter(s)))
        assert parts == [order[0::2], order[1::2]]


def test_elastic_sampler_record_batch_then_reset_to_three_ranks(world):
    dataset = list(range(10))
    s1 = sampler_for(world, 1, 2, dataset, shuffle=False)
    assert list(iter(s1)) == [1, 3, 5, 7, 9]
    s1.record_batch(0, 2)
    assert s1.processed_indices == {1, 3}

    s0 = sampler_for(world, 0, 2, dataset, shuffle=False)
    state = elastic.TorchState(sampler=s0, epoch=0)
    assert list(iter(s0)) == [0, 2, 4, 6, 8]
    assert s0.get_indices(0, 2) == [0, 2]
    assert s0.get_indices(2, 2) == [8]
    s0.record_batch(0, 2)
    assert s0.processed_indices == {0, 2}

    world.others_processed = [s1.processed_indices]
    state.commit()  # gathers every rank's processed indices
    # This iteration is unchanged by the commit.
    assert s0.indices == [0, 2, 4, 6, 8] and len(s0) == 5

    # Three ranks now: the sync after the reset repartitions what is left, 4..9.
    world.size = 3
    expected = {0: [4, 7], 1: [5, 8], 2: [6, 9]}
    for r in range(3):
        world.rank = r
        state.sync()
        assert (s0.num_replicas, s0.rank) == (3, r)
        assert s0.remaining_indices == [4, 5, 6, 7, 8, 9]
        assert list(iter(s0)) == expected[r] and len(s0) == 2

    # A failure after more batches puts back the committed processed indices.
    world.rank = 0
    state.sync()
    list(iter(s0))
    s0.record_batch(0, 1)
    assert 4 in s0.processed_indices
    state.restore()
    assert s0.processed_indices == {0, 1, 2, 3}
    s0.record_indices([4])
    state.restore()
    assert s0.processed_indices == {0, 1, 2, 3}

    # set_epoch clears them: the whole dataset again.
    s0.set_epoch(1)
    assert s0.processed_indices == set() and s0.remaining_indices == dataset
    assert list(iter(s0)) == [0, 3, 6, 9]


def test_elastic_sampler_state_dict_round_trip(world):
    dataset = list(range(10))
    s = sampler_for(world, 0, 2, dataset, shuffle=False)
    s.set_epoch(2)
    s.record_indices({0, 1, 5})
    d = s.state_dict()
    assert d == {"epoch": 2, "processed_indices": {0, 1, 5}}
    other = sampler_for(world, 1, 2, dataset, shuffle=False)
    other.load_state_dict(copy.deepcopy(d))
    assert other.epoch == 2
    assert other.remaining_indices == [2, 3, 4, 6, 7, 8, 9]
    assert list(iter(other)) == [3, 6, 8, 2]


def test_module_is_reachable_as_hvd_elastic():
    assert hvd.elastic is elastic
    assert hvd.elastic.run is elastic.run
    assert elastic.ObjectState is common_elastic.ObjectState
