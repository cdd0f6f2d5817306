"""One rank of a shutdown chaos trial (tests/chaos/test_shutdown_chaos.py), under `ringmaster local
--arena-mb 16`: `python3 shutdown_chaos_rank.py STEPS EXIT_RANK EXIT_STEP GATHER_STEP`.

Every step allreduces (rank + step) and checks the exact sum. At GATHER_STEP (when >= 0) every rank
asks for an allgather whose output cannot fit the arena: it must fail alone, saying what to change,
and the step's allreduce must still be exact. At EXIT_STEP rank EXIT_RANK (when >= 0) finishes
early with status 0: the others' next allreduce must fail at once naming it.

Prints "[rank R] step S exact" progress, then one closing line:
  "rank R: STEPS steps, every result exact"                 (nothing went wrong)
  "rank R: finished early at step S"                        (the rank that exits early)
  "rank R: step S failed after Ts: MESSAGE"                 (a peer finished early)
and "FAIL ..." lines for anything not as expected (exit status 1).
"""
import sys
import time

import torch

import ringmaster.torch as hvd
from ringmaster import basics


def main():
    steps, exit_rank, exit_step, gather_step = (int(a) for a in sys.argv[1:5])
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    arena = basics.client().topology.arena_bytes
    failures = 0
    for step in range(steps):
        if step == exit_step and rank == exit_rank:
            print(f"rank {rank}: finished early at step {step}", flush=True)
            return 0
        if step == gather_step:
            rows = arena // 4 // 64 // size + 1
            try:
                hvd.allgather(torch.ones(rows, 64), name=f"too.big.{step}")
                print(f"FAIL rank {rank}: an allgather larger than the arena succeeded", flush=True)
                failures += 1
            except hvd.HorovodInternalError as e:
                if "--arena-mb" not in str(e):
                    print(f"FAIL rank {rank}: unexpected error {e}", flush=True)
                    failures += 1
        start = time.monotonic()
        try:
            got = hvd.allreduce(torch.full((5,), float(rank + step)), op=hvd.Sum, name="step")
        except hvd.HorovodInternalError as e:
            print(f"rank {rank}: step {step} failed after {time.monotonic() - start:.2f}s: {e}",
                  flush=True)
            return 1
        want = float(sum(r + step for r in range(size)))
        if not torch.equal(got, torch.full((5,), want)):
            print(f"FAIL rank {rank}: step {step}: {got.tolist()}, want {want}", flush=True)
            failures += 1
        time.sleep(0.1)
    if failures:
        return 1
    print(f"rank {rank}: {steps} steps, every result exact", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
