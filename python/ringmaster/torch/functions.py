"""Horovod's helpers built on the collectives (horovod.torch.functions): broadcasting model
parameters, optimizer state and picklable objects, and gathering objects."""
import collections

import torch

from ringmaster.common.objects import allgather_object, broadcast_object  # noqa: F401
from ringmaster.torch.mpi_ops import (broadcast_async_, global_process_set, synchronize,
                                      _check_process_set)


def broadcast_parameters(params, root_rank, process_set=global_process_set):
    """Broadcasts the parameters from root_rank to every rank, in place.

    `params` is a dict (a model's `state_dict()`, broadcast in sorted key order) or a list of
    tensors or of (name, tensor) pairs (`list(model.named_parameters())`)."""
    _check_process_set(process_set)
    if isinstance(params, dict):
        params = sorted(params.items())
    elif isinstance(params, list):
        # Both named_parameters() and parameters().
        params = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError("invalid params of type: %s" % type(params))

    handles = [broadcast_async_(p, root_rank, name, process_set) for name, p in params]
    for handle in handles:
        synchronize(handle)


def broadcast_optimizer_state(optimizer, root_rank, process_set=global_process_set):
    """Broadcasts the optimizer's state (tensors in place) and its param groups' options (learning
    rate, momentum, ...) from root_rank to every rank. A new optimizer's state is created first by
    one step with zero gradients, as Horovod does."""
    _check_process_set(process_set)
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")

    state_dict = optimizer.state_dict()

    # A new optimizer has no state yet: create it with one step on zero gradients.
    if len(state_dict["state"]) == 0:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad and id(p) not in state_dict["state"]:
                    p.grad = p.data.new(p.size()).zero_()
                    if isinstance(optimizer, torch.optim.SparseAdam):
                        p.grad = p.grad.to_sparse()
        # A DistributedOptimizer's own step() allreduces every gradient, which would deadlock
        # unless every rank called it: take the wrapped optimizer's step.
        if getattr(optimizer, "_ringmaster_distributed", False):
            super(optimizer.__class__, optimizer).step()
        else:
            optimizer.step()
        state_dict = optimizer.state_dict()

    # The options of every param group (learning rate, betas, ...: numbers, tuples, None, strings)
    # travel as one pickled object and are set back with their own types.
    options = [{k: v for k, v in group.items() if k != "params"}
               for group in state_dict["param_groups"]]
    options = broadcast_object(options, root_rank, name="optimizer.param_groups",
                               process_set=process_set)
    for group, group_options in zip(optimizer.param_groups, options):
        group.update(group_options)

    if len(state_dict["state"]) == 0:
        return  # a stateless optimizer (plain SGD)

    # The state's tensors are broadcast in place (state_dict() shares them with the optimizer);
    # its other values (Python numbers) travel pickled.
    tensors = []
    scalars = {}
    occurrences = collections.defaultdict(int)
    for group in state_dict["param_groups"]:
        for pid in group["params"]:
            if pid not in state_dict["state"]:
                continue  # a parameter that does not require a gradient
            for name, value in state_dict["state"][pid].items():
                occurrences[name] += 1
                key = "%s.%d" % (str(name), occurrences[name])
                if torch.is_tensor(value):
                    tensors.append((key, value))
                else:
                    scalars[key] = (pid, name, value)
    broadcast_parameters(tensors, root_rank, process_set)
    if scalars:
        values = broadcast_object({k: v for k, (_, _, v) in scalars.items()}, root_rank,
                                  name="optimizer.state.scalars", process_set=process_set)
        for key, (pid, name, _) in scalars.items():
            state_dict["state"][pid][name] = values[key]
