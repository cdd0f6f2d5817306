"""Horovod's DistributedOptimizer (horovod.torch.optimizer) over Ringmaster.

Each parameter's gradient is allreduced asynchronously as soon as backward has produced it (a hook
on its gradient accumulator), so communication overlaps the rest of backward; `step()` waits for
every allreduce, then runs the wrapped optimizer's step. The gradients live in the shared arena:
the first time a parameter's gradient is reduced it moves into an arena buffer allocated for it
once (later backward passes accumulate into it in place), so the daemon reduces it without a copy
(without compression; with it, the compressed tensor is copied in and out as any other).
"""
import os
import warnings
import weakref
from contextlib import contextmanager

import torch

from ringmaster import basics as _basics
from ringmaster.torch.compression import Compression
from ringmaster.torch.functions import broadcast_object
from ringmaster.common.ops import split_list
from ringmaster.torch.mpi_ops import (Adasum, Average, allreduce_async_, global_process_set,
                                      grouped_allreduce_async_, sparse_allreduce_async,
                                      synchronize, _arena_empty, _check_process_set)



# Bytes of gradient buffers in the arena, every optimizer of this process together (a list: mutable
# from the finalizers).
_arena_grad_bytes = [0]


def _aligned(nbytes):
    return (nbytes + 63) // 64 * 64  # the arena allocator's alignment


def _release_arena_grad(nbytes):
    _arena_grad_bytes[0] -= nbytes

def _check_passes(optimizer, p):
    """Horovod's error for a gradient computed again after its allreduce was started."""
    if p in optimizer._handles and optimizer._handles[p][0] is not None:
        if optimizer._allreduce_delay[p] <= 0:
            raise AssertionError(
                "Gradients were computed more than backward_passes_per_step times before call to "
                "step(). Increase backward_passes_per_step to accumulate gradients locally.")


class _DistributedOptimizer(torch.optim.Optimizer):
    _ringmaster_distributed = True

    @staticmethod
    def _named(optimizer, named_parameters):
        """(name, parameter) pairs sorted by name, checked as Horovod checks them; automatic
        names when `named_parameters` is None."""
        if named_parameters is not None:
            named_parameters = list(named_parameters)
        else:
            named_parameters = [(f"allreduce.noname.{i}.{j}", v)
                                for i, param_group in enumerate(optimizer.param_groups)
                                for j, v in enumerate(param_group["params"])]
        if any(not isinstance(p, tuple) for p in named_parameters):
            raise ValueError("named_parameters should be a sequence of tuples (name, parameter), "
                             "usually produced by model.named_parameters().")

        dups = _DistributedOptimizer.find_duplicates([k for k, _ in named_parameters])
        if len(dups) > 0:
            raise ValueError("Parameter names in named_parameters must be unique. "
                             "Found duplicates: %s" % ", ".join(sorted(dups)))

        all_param_ids = {id(v) for param_group in optimizer.param_groups
                         for v in param_group["params"]}
        named_param_ids = {id(v) for k, v in named_parameters}
        unnamed_param_ids = all_param_ids - named_param_ids
        if len(unnamed_param_ids):
            raise ValueError("named_parameters was specified, but one or more model parameters "
                             "were not named. Python object ids: "
                             "%s" % ", ".join(str(i) for i in unnamed_param_ids))

        return sorted(named_parameters, key=lambda kv: kv[0])

    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1,
                 op=Average, gradient_predivide_factor=1.0, groups=None, sparse_as_dense=False,
                 process_set=global_process_set):
        super(self.__class__, self).__init__(params)
        self._compression = compression

        named_parameters = _DistributedOptimizer._named(self, named_parameters)
        self._parameter_names = {v: k for k, v in named_parameters}
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {v: self.backward_passes_per_step for _, v in named_parameters}
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set

        self._handles = {}
        self._grad_accs = []
        self._requires_update = set()
        self._synchronized = False
        self._should_synchronize = True
        self._arena_grads = {}  # parameter -> its gradient's buffer in the shared arena

        if groups is not None:
            if not (isinstance(groups, list) or groups > 0):
                raise ValueError("groups should be a non-negative integer or "
                                 "a list of list of torch.Tensor.")
            if isinstance(groups, list):
                grouped_parameter_ids = set()
                for group in groups:
                    for p in group:
                        if not isinstance(p, torch.Tensor):
                            raise ValueError("groups must consist of torch.Tensor.")
                        if id(p) in grouped_parameter_ids:
                            raise ValueError("A parameter can only appear once in groups.")
                        grouped_parameter_ids.add(id(p))
        self._groups = groups
        self._p_to_group = {}
        self._group_counts = {}

        # As Horovod: a single process reduces nothing, unless elastic (HOROVOD_ELASTIC=1).
        if _basics.size() > 1 or os.environ.get("HOROVOD_ELASTIC") == "1":
            self._register_hooks()

    def load_state_dict(self, *args, **kwargs):
        self._handles = {}
        self._synchronized = False
        self._should_synchronize = True
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        super(self.__class__, self).load_state_dict(*args, **kwargs)

    @staticmethod
    def find_duplicates(lst):
        seen = set()
        dups = set()
        for el in lst:
            if el in seen:
                dups.add(el)
            seen.add(el)
        return dups

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step

    def _register_hooks(self):
        if self._groups is not None:
            p_list = [p for param_group in self.param_groups for p in param_group["params"]
                      if p.requires_grad]
            # Every rank forms the groups in rank 0's parameter order.
            p_list_names = [self._parameter_names.get(p) for p in p_list]
            p_list_names = broadcast_object(p_list_names, root_rank=0,
                                            name="DistributedOptimizer.parameter_order")
            p_list = sorted(p_list, key=lambda p: p_list_names.index(self._parameter_names.get(p)))
            if isinstance(self._groups, list):
                p_groups = []
                grouped_id = set()
                p_list_ids = [id(p) for p in p_list]
                for group in self._groups:
                    p_groups.append([p for p in group if id(p) in p_list_ids])
                    for p in p_groups[-1]:
                        grouped_id.add(id(p))
                for p in p_list:
                    if id(p) not in grouped_id:
                        p_groups.append([p])
            else:
                p_groups = split_list(p_list, self._groups)
            p_groups = [tuple(p) for p in p_groups if p]
            for group in p_groups:
                for p in group:
                    self._p_to_group[p] = group
                self._group_counts[group] = 0

        for param_group in self.param_groups:
            for p in param_group["params"]:
                if p.requires_grad:
                    self._requires_update.add(p)
                    p_tmp = p.expand_as(p)
                    grad_acc = p_tmp.grad_fn.next_functions[0][0]
                    grad_acc.register_hook(self._make_hook(p))
                    self._grad_accs.append(grad_acc)

    def _grad_in_arena(self, p):
        """Moves p.grad into p's arena buffer (allocated once) unless it is already there. Only
        without compression: a compressed gradient is a new tensor, which the client copies."""
        grad = p.grad
        slot = _basics.topology().device
        on_slot = grad.device.type == "cpu" if slot < 0 else grad.device == torch.device("cuda", slot)
        if self._compression is not Compression.none or not on_slot or grad.is_sparse:
            return
        buf = self._arena_grads.get(p)
        if buf is None or buf.shape != grad.shape or buf.dtype != grad.dtype:
            # Gradients (of every optimizer of this process) take at most half of the arena: the
            # rest stages the tensors that are not there (the other gradients of a model too big
            # for it, compressed ones, ...).
            self._arena_grads.pop(p, None)  # a buffer of another shape is of no use any more
            nbytes = _aligned(grad.numel() * grad.element_size())
            budget = _basics.topology().arena_bytes // 2
            if _arena_grad_bytes[0] + nbytes > budget:
                return  # the client copies this gradient in and out
            buf = _arena_empty(grad.shape, grad.dtype)
            if buf is None:
                return  # the arena is full: the client copies this gradient in and out
            self._arena_grads[p] = buf
            _arena_grad_bytes[0] += nbytes
            weakref.finalize(buf, _release_arena_grad, nbytes)  # its memory goes with it
        if grad.data_ptr() != buf.data_ptr():
            buf.copy_(grad)
            p.grad = buf

    def _scale_factors(self):
        if self.op == Average:
            # Average divides by size after the sum; the predivision moves part of it before.
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _allreduce_grad_async(self, p):
        if p.grad is None:
            # Not computed here this time, but another rank may have computed it (a dynamic
            # graph): every rank must still submit it.
            p.grad = p.data.new(p.size()).zero_()
        name = self._parameter_names.get(p)
        if p.grad.is_sparse:
            if not self.sparse_as_dense:
                # Horovod's sparse path: the indices and values of every rank, allgathered.
                return sparse_allreduce_async(p.grad, name=name, op=self.op,
                                              process_set=self.process_set), None
            p.grad = p.grad.to_dense()
        self._grad_in_arena(p)
        tensor_compressed, ctx = self._compression.compress(p.grad)
        prescale_factor, postscale_factor = self._scale_factors()
        handle = allreduce_async_(tensor_compressed, name=name, op=self.op,
                                  prescale_factor=prescale_factor,
                                  postscale_factor=postscale_factor,
                                  process_set=self.process_set)
        return handle, ctx

    def _grouped_allreduce_grad_async(self, ps):
        name = self._parameter_names.get(ps[0])
        for p in ps:
            if p.grad is None:
                p.grad = p.data.new(p.size()).zero_()
            elif p.grad.is_sparse:
                if not self.sparse_as_dense:
                    raise ValueError("sparse gradients cannot be allreduced in groups: pass "
                                     "sparse_as_dense=True, or leave groups unset")
                p.grad = p.grad.to_dense()
            self._grad_in_arena(p)
        tensors_compressed, ctxs = zip(*[self._compression.compress(p.grad) for p in ps])
        prescale_factor, postscale_factor = self._scale_factors()
        handle = grouped_allreduce_async_(list(tensors_compressed), name=name, op=self.op,
                                          prescale_factor=prescale_factor,
                                          postscale_factor=postscale_factor,
                                          process_set=self.process_set)
        return handle, ctxs

    def _make_hook(self, p):
        def hook(*ignore):
            _check_passes(self, p)
            assert not p.grad.requires_grad
            assert self._allreduce_delay[p] > 0
            handle, ctx = None, None
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] == 0:
                if self._groups is not None:
                    group = self._p_to_group[p]
                    self._group_counts[group] += 1
                    if self._group_counts[group] == len(group):
                        handle, ctxs = self._grouped_allreduce_grad_async(group)
                        self._handles[group] = (handle, ctxs)
                        # The group's members had no-op entries until now.
                        for gp in group:
                            self._handles.pop(gp, None)
                        self._group_counts[group] = 0
                        return
                else:
                    handle, ctx = self._allreduce_grad_async(p)
            self._handles[p] = (handle, ctx)
        return hook

    def synchronize(self):
        """Waits for every gradient's allreduce (starting those whose hook has not fired) and
        writes the results into the gradients."""
        completed = set()
        for x in self._handles.keys():
            if isinstance(x, tuple):
                completed.update(x)
            else:
                completed.add(x)
        missing_p = self._requires_update - completed
        for p in self._ordered(missing_p):
            self._handles[p] = self._allreduce_grad_async(p)

        for p, (handle, ctx) in list(self._handles.items()):
            if handle is None:
                self._handles[p] = self._allreduce_grad_async(p)
        for p, (handle, ctx) in self._handles.items():
            if isinstance(p, tuple):
                outputs = synchronize(handle)
                for gp, output, gctx in zip(p, outputs, ctx):
                    self._allreduce_delay[gp] = self.backward_passes_per_step
                    self._set_grad(gp, self._compression.decompress(output, gctx))
                if self._groups is not None and self._group_counts[p] != 0:
                    self._group_counts[p] = 0
            else:
                output = synchronize(handle)
                self._allreduce_delay[p] = self.backward_passes_per_step
                if self._groups is not None:
                    group = self._p_to_group[p]
                    if self._group_counts[group] != 0:
                        self._group_counts[group] = 0
                if output.is_sparse:
                    p.grad = output
                else:
                    self._set_grad(p, self._compression.decompress(output, ctx))
        self._handles.clear()
        self._synchronized = True

    def _ordered(self, params):
        """`params` in the optimizer's parameter order, the same on every rank (a set's order is
        not)."""
        return [p for group in self.param_groups for p in group["params"] if p in params]

    @staticmethod
    def _set_grad(p, value):
        if value.data_ptr() != p.grad.data_ptr():
            p.grad.copy_(value)  # keeps the gradient in its arena buffer

    @contextmanager
    def skip_synchronize(self):
        """Within it, step() does not synchronize (call synchronize() yourself first, e.g. to
        clip the averaged gradients)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "context after optimizer.synchronize(). This can cause training "
                              "slowdown. You may want to consider using "
                              "optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code.")
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize(). This is "
                                 "prohibited as it can cause a race condition.")
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set):
    """Wraps `optimizer` so that step() applies the gradients averaged (op) over all ranks.

    named_parameters: `model.named_parameters()`, naming each gradient's allreduce (recommended;
    otherwise names follow the parameter order). compression: Compression.none or .fp16.
    backward_passes_per_step: backward passes accumulated locally before each allreduce.
    gradient_predivide_factor: divide by this before the sum and by size/factor after (Average
    only). groups: an int (that many fused groups) or a list of lists of parameters, each
    allreduced as one group. sparse_as_dense: allreduce sparse gradients as dense ones (else
    Horovod's sparse path: an allgather of indices and values). op=Adasum on more than one rank:
    Horovod's Adasum optimizer (each rank steps on its own gradients, and the parameters' changes
    are combined with Adasum). Process sets are not supported yet."""
    _check_process_set(process_set)
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if op == Adasum and _basics.size() > 1:
        cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
                   dict(_DistributedAdasumOptimizer.__dict__))
        return cls(optimizer.param_groups, named_parameters, compression,
                   backward_passes_per_step)
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed "
                      "in v0.23.0.", DeprecationWarning)
        if groups is None:
            groups = num_groups
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
               op, gradient_predivide_factor, groups, sparse_as_dense, process_set)


class _DistributedAdasumOptimizer(torch.optim.Optimizer):
    """Horovod's Adasum optimizer: when a parameter's gradient is ready, the wrapped optimizer
    steps on that parameter alone from a zero start, giving its change; the changes are combined
    over ranks with Adasum (asynchronously, as the gradients come); step() adds each combined
    change to the parameter's value before the step."""

    _ringmaster_distributed = True

    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        named = _DistributedOptimizer._named(self, named_parameters)
        self._parameter_names = {v: k for k, v in named}
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {v: backward_passes_per_step for _, v in named}
        self._handles = {}
        self._grad_accs = []
        self._requires_update = set()
        # Each parameter's value before its local step.
        self._starts = {v: torch.zeros_like(v, requires_grad=False) for _, v in named}
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    p.grad = p.data.new(p.size()).zero_()
                    self._requires_update.add(p)
                    grad_acc = p.expand_as(p).grad_fn.next_functions[0][0]
                    grad_acc.register_hook(self._make_hook(p))
                    self._grad_accs.append(grad_acc)

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def _delta_async(self, p):
        # The wrapped optimizer steps on p alone; p then holds its change (value - start).
        start = self._starts[p]
        stashed = [group["params"] for group in self.param_groups]
        for group in self.param_groups:
            group["params"] = [p] if any(p is v for v in group["params"]) else []
        try:
            start.data.copy_(p.data)
            super(self.__class__, self).step()
            p.data.sub_(start)
        finally:
            for group, params in zip(self.param_groups, stashed):
                group["params"] = params
        compressed, ctx = self._compression.compress(p.data)
        return allreduce_async_(compressed, name=self._parameter_names.get(p), op=Adasum), ctx

    def _make_hook(self, p):
        def hook(*ignore):
            _check_passes(self, p)
            self._allreduce_delay[p] -= 1
            handle, ctx = None, None
            if self._allreduce_delay[p] == 0:
                handle, ctx = self._delta_async(p)
            self._handles[p] = (handle, ctx)
        return hook

    def synchronize(self):
        """Nothing to do: step() applies the combined changes."""

    @contextmanager
    def skip_synchronize(self):
        raise AssertionError("Skipping synchronization is not supported when using Adasum "
                             "optimizer.")

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:  # the same order on every rank
            for p in group["params"]:
                if p in self._requires_update and self._handles.get(p, (None, None))[0] is None:
                    self._handles[p] = self._delta_async(p)
        for p, (handle, ctx) in self._handles.items():
            delta = self._compression.decompress(synchronize(handle), ctx)
            start = self._starts[p]
            start.data.add_(delta.data)
            p.data.copy_(start)
            self._allreduce_delay[p] = self.backward_passes_per_step
        self._handles.clear()
        return loss

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize(). This is "
                                 "prohibited as it can cause a race condition.")
        return super(self.__class__, self).zero_grad(*args, **kwargs)
