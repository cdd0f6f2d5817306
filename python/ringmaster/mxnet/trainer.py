"""Horovod's training helpers for MXNet (horovod.mxnet's DistributedOptimizer,
DistributedTrainer and broadcast_parameters), with its semantics: gradients are averaged over the
ranks (of the process set) by allreduces pushed into MXNet's engine in the parameters' order, with
priority -i so that the first layers' go first; names are `<prefix><i>` (the trainer) or the
optimizer's index."""
import types
import warnings
from collections import OrderedDict, defaultdict

import mxnet as mx

from ringmaster import basics as _basics
from ringmaster.common.ops import split_list
from ringmaster.mxnet.compression import Compression
from ringmaster.mxnet.mpi_ops import (Average, _arena_array, _EachPlan, allreduce_, broadcast_,
                                      global_process_set, grouped_allreduce_)


class DistributedOptimizer(mx.optimizer.Optimizer):
    """Wraps an mx.optimizer.Optimizer: each update first averages the gradient over the ranks
    (in place, inside MXNet's engine), then runs the wrapped optimizer's update. `index` may be a
    list (MXNet's aggregated updates, MXNET_OPTIMIZER_AGGREGATION_SIZE): one allreduce each, or
    `num_groups` grouped allreduces."""

    def __init__(self, optimizer, gradient_predivide_factor=1.0, num_groups=0,
                 process_set=global_process_set):
        self._optimizer = optimizer
        self._gradient_predivide_factor = gradient_predivide_factor
        self._num_groups = num_groups
        self._process_set = process_set

    _OWN = ("_optimizer", "_gradient_predivide_factor", "_num_groups", "_process_set")

    def __getattr__(self, item):
        return getattr(self._optimizer, item)

    def __setattr__(self, name, value):
        # What a gluon.Trainer sets on its optimizer (rescale_grad at every step, param_dict)
        # reaches the wrapped one (Horovod's wrapper keeps it, so its gradients go unscaled).
        if name in self._OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self._optimizer, name, value)

    def create_state(self, index, weight):
        return self._optimizer.create_state(index, weight)

    def create_state_multi_precision(self, index, weight):
        return self._optimizer.create_state_multi_precision(index, weight)

    def _do_allreduce(self, index, grad):
        if self._process_set.size() == 1:
            return
        scale = dict(op=Average, prescale_factor=1.0 / self._gradient_predivide_factor,
                     postscale_factor=self._gradient_predivide_factor,
                     process_set=self._process_set)
        if not isinstance(index, (tuple, list)):
            allreduce_(grad, name=str(index), **scale)
            return
        if self._num_groups > 0:
            groups = zip(split_list(list(grad), self._num_groups),
                         split_list(list(index), self._num_groups))
            for i, (grads, indices) in enumerate(groups):
                if grads:
                    grouped_allreduce_(grads, name=f"{indices[0]}:{indices[-1]}", priority=-i,
                                       **scale)
            return
        for i in range(len(index)):
            allreduce_(grad[i], name=str(index[i]), priority=-i, **scale)

    def update(self, index, weight, grad, state):
        if self._process_set.included():
            self._do_allreduce(index, grad)
        self._optimizer.update(index, weight, grad, state)

    def update_multi_precision(self, index, weight, grad, state):
        if self._process_set.included():
            self._do_allreduce(index, grad)
        self._optimizer.update_multi_precision(index, weight, grad, state)

    def set_learning_rate(self, lr):
        self._optimizer.set_learning_rate(lr)

    def set_lr_mult(self, args_lr_mult):
        self._optimizer.set_lr_mult(args_lr_mult)

    def set_wd_mult(self, args_wd_mult):
        self._optimizer.set_wd_mult(args_wd_mult)


class DistributedTrainer(mx.gluon.Trainer):
    """A gluon.Trainer whose step() averages the gradients over the ranks (of `process_set`) with
    allreduces instead of a kvstore: `compression` (Compression.none or .fp16),
    `gradient_predivide_factor` (scale by 1/f before the sum and f/size after), `prefix` (names
    `<prefix><i>`: give each trainer of a program its own), `num_groups` (> 0: that many grouped
    allreduces, per dtype, instead of one per parameter)."""

    def __init__(self, params, optimizer, optimizer_params=None, compression=Compression.none,
                 gradient_predivide_factor=1.0, prefix=None, num_groups=0,
                 process_set=global_process_set):
        self._compression = compression
        self._process_set = process_set
        if isinstance(optimizer, DistributedOptimizer):
            optimizer = optimizer._optimizer
            warnings.warn("DistributedTrainer does not take DistributedOptimizer as its optimizer. "
                          "We have unwrapped it for you.")
        # Every rank orders the parameters alike (as gluon.Trainer does since MXNet 1.6).
        if isinstance(params, dict):
            params = OrderedDict(params)
        elif isinstance(params, (list, tuple)):
            params = sorted(params, key=lambda p: p.name)
        super().__init__(params, optimizer, optimizer_params=optimizer_params, kvstore=None)
        self._gradient_predivide_factor = gradient_predivide_factor
        if prefix is not None and not isinstance(prefix, str):
            raise ValueError(f"prefix must be a str, got {type(prefix).__name__}")
        self._prefix = prefix or ""
        self._num_groups = num_groups
        self._each_plan = None

    def _scale_args(self):
        return dict(op=Average, prescale_factor=1.0 / self._gradient_predivide_factor,
                    postscale_factor=self._gradient_predivide_factor,
                    process_set=self._process_set)

    def _grads_in_arena(self):
        """Moves each CPU gradient into the shared arena, once: a new buffer there takes the
        gradient's value and its place (autograd writes there from the next backward on), so the
        daemon reduces it where it is, with no copy in or out. A gradient that does not fit stays
        where it is (reduced there, at the cost of the copies)."""
        for param in self._params:
            grads = param._grad
            if param.grad_req == "null" or not grads or len(grads) != 1:
                continue
            grad = grads[0]
            if getattr(param, "_ringmaster_grad", None) is grad:
                continue  # in the arena already, or tried
            param._ringmaster_grad = grad
            if grad.context.device_type != "cpu" or grad.stype != "default":
                continue
            moved = _arena_array(grad.shape, grad.dtype)
            if moved is None:
                continue
            grad.copyto(moved)  # in MXNet's engine: after backward's write of grad
            data = param.list_data()[0]
            fresh = data._fresh_grad  # whether backward wrote it since the last step
            grads[0] = moved
            param._ringmaster_grad = moved
            mx.autograd.mark_variables([data], [moved], param.grad_req)
            data._fresh_grad = fresh

    def _allreduce_grads(self):
        if self._process_set.size() == 1 or not self._process_set.included():
            return
        if self._compression is Compression.none:
            self._grads_in_arena()
        entries = []  # (name, compressed gradient, decompression context, parameter)
        for i, param in enumerate(self._params):
            if param.grad_req != "null":
                compressed, ctx = self._compression.compress(param.list_grad()[0])
                entries.append((self._prefix + str(i), compressed, ctx, param))
        if self._num_groups > 0:
            for i, group in enumerate(split_list(entries, self._num_groups)):
                # One grouped allreduce per dtype within a group.
                by_dtype = defaultdict(list)
                for entry in group:
                    by_dtype[entry[1].dtype].append(entry)
                for same in by_dtype.values():
                    grouped_allreduce_([e[1] for e in same], name=f"{same[0][0]}:{same[-1][0]}",
                                       priority=-i, **self._scale_args())
        elif self._compression is Compression.none:
            # The same gradient arrays step after step: checked and named once, pushed together.
            grads = [e[1] for e in entries]
            plan = self._each_plan
            if plan is None or len(plan.tensors) != len(grads) or any(
                    a is not b for a, b in zip(plan.tensors, grads)):
                plan = self._each_plan = _EachPlan(
                    grads, [e[0] for e in entries], [-i for i in range(len(grads))],
                    **self._scale_args())
            plan.push()
        else:
            for i, (name, compressed, _, _) in enumerate(entries):
                allreduce_(compressed, name=name, priority=-i, **self._scale_args())
        if self._compression is not Compression.none:
            for _, compressed, ctx, param in entries:
                param.list_grad()[0][:] = self._compression.decompress(compressed, ctx)


def _append_broadcast_init(param, root_rank, name):
    """`param`'s _init_impl, followed by the broadcast of its data (deferred initialisation)."""
    init_impl = getattr(param, "_init_impl")

    def wrapped_init_impl(self, *args, **kwargs):
        init_impl(*args, **kwargs)
        broadcast_(self.data(), root_rank=root_rank, name=name)
    return wrapped_init_impl


def broadcast_parameters(params, root_rank=0, prefix=None):
    """Overwrites every rank's parameters with root_rank's: `params` is a dict of NDArrays or of
    gluon Parameters, or a ParameterDict (`block.collect_params()`). A parameter whose
    initialisation is deferred (its shape known at the first forward) is broadcast right after it
    is initialised. `prefix`: give each call of a program its own (the names are
    `<prefix><key>`)."""
    if _basics.size() == 1:
        return
    if prefix is not None and not isinstance(prefix, str):
        raise ValueError(f"prefix must be a str, got {type(prefix).__name__}")
    prefix = prefix or ""
    try:
        from mxnet.gluon.parameter import ParameterDict
        valid_types = (dict, ParameterDict)
    except ImportError:
        valid_types = (dict,)
    if not isinstance(params, valid_types):
        raise ValueError(f"invalid params of type: {type(params)}")
    tensors, names = [], []
    for name, p in sorted(params.items()):
        try:
            tensors.append(p.data() if isinstance(p, mx.gluon.parameter.Parameter) else p)
            names.append(prefix + str(name))
        except mx.gluon.parameter.DeferredInitializationError:
            p._init_impl = types.MethodType(_append_broadcast_init(p, root_rank, prefix + str(name)),
                                            p)
    for tensor, name in zip(tensors, names):
        broadcast_(tensor, root_rank, name=name)
