"""Run as every rank of a job whose workers' arena is small (`ringmaster local --np 2 --arena-mb 16
-- python3 arena_overflow_checks.py`): a model whose gradients do not fit in the arena still trains,
and matches one process on the whole batch; a single tensor, or a group, larger than the arena is
refused with a message that says what to do, and the job goes on. Prints "arena_overflow_checks: rank R: ok (K of N gradients in the
arena)" or the failures; exits 0 only if every check passed.
"""
import copy
import sys

import torch
import torch.nn.functional as F

import ringmaster.torch as hvd
from ringmaster import basics


def main():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    arena = basics.client().topology.arena_bytes
    failures = []
    # 24 MiB of float32 gradients, twice what a 16 MiB arena gives the process (12 MiB).
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512, bias=False) for _ in range(24)])
    grad_bytes = sum(p.numel() * 4 for p in model.parameters())
    if grad_bytes <= arena:
        failures.append(f"the gradients ({grad_bytes} bytes) fit in the arena ({arena}): run with "
                        f"--arena-mb 16")
    reference = copy.deepcopy(model).double()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                   named_parameters=model.named_parameters())
    reference_opt = torch.optim.SGD(reference.parameters(), lr=0.01, momentum=0.9)
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(4 * size, 512, generator=g)
        y = torch.randn(4 * size, 512, generator=g)
        mine = slice(4 * rank, 4 * (rank + 1))
        opt.zero_grad()
        reference_opt.zero_grad()
        F.mse_loss(model(x[mine]), y[mine]).backward()
        F.mse_loss(reference(x.double()), y.double()).backward()
        opt.step()
        reference_opt.step()
    worst = max((p.detach().double() - q.detach()).abs().max().item()
                for p, q in zip(model.parameters(), reference.parameters()))
    if worst > 1e-5:
        failures.append(f"parameters differ from one process by {worst}")
    in_arena = len(opt._arena_grads)
    in_arena_bytes = sum(b.numel() * b.element_size() for b in opt._arena_grads.values())
    if not 0 < in_arena < 24 or in_arena_bytes > arena // 2:
        failures.append(f"{in_arena} gradients ({in_arena_bytes} bytes) in an arena of "
                        f"{arena}: want some, within half of it")
    direct = basics.topology().direct_access
    if direct:
        # The daemon reduces allreduce tensors where they are: the arena does not bound them.
        big = hvd.allreduce(torch.ones(arena // 4 + 1), op=hvd.Sum, name="too.big")
        if not torch.equal(big, torch.full((arena // 4 + 1,), float(size))):
            failures.append("a tensor larger than the arena was not reduced exactly")
        group = hvd.grouped_allreduce([torch.ones(arena // 8) for _ in range(3)], op=hvd.Sum,
                                      name="too.big.group")
        if not all(torch.equal(g, torch.full((arena // 8,), float(size))) for g in group):
            failures.append("a group larger than the arena was not reduced exactly")
        # Still bounded: one tensor larger than the worker's whole arena (client part + 1/3) is
        # refused, saying what to do.
        whole = arena * 4 // 3
        try:
            hvd.allreduce(torch.ones(whole // 4 + 1), name="beyond.the.arena")
            failures.append("a tensor larger than the worker's whole arena was accepted")
        except hvd.HorovodInternalError as e:
            want = (f"tensor 'beyond.the.arena': {whole + 4} bytes is more than the {whole}-byte "
                    f"arena this worker reduces at once: start the workers with a larger "
                    f"--arena-mb")
            if not str(e).startswith(want):
                failures.append(f"unexpected error for a tensor beyond the arena: {e}")
    else:
        # Staged through the arena (RINGMASTER_DIRECT_ACCESS=0): one tensor larger than the whole
        # arena is refused at once, saying what to do.
        try:
            hvd.allreduce(torch.ones(arena // 4 + 1), name="too.big")
            failures.append("a tensor larger than the arena was accepted")
        except hvd.HorovodInternalError as e:
            want = (f"shared arena full: {arena + 4} bytes requested, ")
            if (not str(e).startswith(want)
                    or "start the workers with a larger --arena-mb" not in str(e)):
                failures.append(f"unexpected error for a tensor larger than the arena: {e}")
        # A grouped allreduce whose members cannot all be in the arena at once (they complete
        # together): refused before any member is submitted, the job goes on.
        try:
            hvd.grouped_allreduce([torch.ones(arena // 8) for _ in range(3)], name="too.big.group")
            failures.append("a group larger than the arena was accepted")
        except hvd.HorovodInternalError as e:
            if not str(e).startswith(f"shared arena full: the grouped allreduce needs "
                                     f"{3 * arena // 2} bytes staged at once; the arena holds "
                                     f"{arena} bytes"):
                failures.append(f"unexpected error for a group larger than the arena: {e}")
    after = hvd.allreduce(torch.ones(4), op=hvd.Sum, name="after.refusals")
    if not torch.equal(after, torch.full((4,), float(size))):
        failures.append(f"allreduce after the refusals: {after}")
    for f in failures:
        print(f"FAIL rank {rank}: {f}", flush=True)
    if failures:
        return 1
    print(f"arena_overflow_checks: rank {rank}: ok ({in_arena} of 24 gradients in the arena; "
          f"direct access {'on' if direct else 'off'})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
