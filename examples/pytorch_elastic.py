"""Elastic training with Horovod's API on Ringmaster: a linear model trained step by step under
`hvd.elastic.run`, committing its state after every step. Ranks may come and go while it runs: a
lost rank (its daemon killed, its process failed) or an added worker starts a new epoch, the
surviving ranks go back to their last commit, and every rank takes rank 0's state.

    ringmaster local --min-np 2 --max-np 3 -- python3 examples/pytorch_elastic.py --steps 200

On a cluster: `ringmaster submit --min-np 2 --max-np 8 -- python3 pytorch_elastic.py`.

Each rank's batch at step s depends on (s, rank), so the average gradient depends on who took
part: rank 0 prints one line per committed step ("commit STEP SIZE"), and every rank its final
weights ("final SIZE W..."), from which tests/python/test_elastic.py recomputes the model exactly.
--fail-at-step N makes the rank-1 process of the first epoch raise at step N (a process that
fails inside a step); --sleep S slows each step down; --slow-rank R --slow-ms M makes the process
that starts as rank R of the first epoch compute M ms longer each step, a straggler for
`--straggler-action evict` to drop (docs/operations.md, "Finding a slow rank").
"""
import argparse
import os
import sys
import time

import torch

import ringmaster.torch as hvd

FEATURES = 8


def batch(step, rank):
    """Rank `rank`'s inputs and targets at `step` (the same on every run)."""
    g = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(16, FEATURES, generator=g, dtype=torch.float64)
    y = x.sum(dim=1, keepdim=True) * 0.5
    return x, y


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds per step")
    parser.add_argument("--fail-at-step", type=int, default=-1)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--slow-ms", type=float, default=0.0)
    parser.add_argument("--print-time", action="store_true",
                        help="end each commit line with the time (seconds since the Unix epoch)")
    args = parser.parse_args()

    hvd.init()
    model = torch.nn.Linear(FEATURES, 1, bias=False).double()
    with torch.no_grad():
        model.weight.zero_()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr),
                                         named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, optimizer, step=0)
    # The process that starts as rank 1 of the job's first epoch fails once (--fail-at-step).
    first_epoch = os.environ.get("RINGMASTER_EPOCH") == "1"
    fails = hvd.rank() == 1 and first_epoch
    slow = args.slow_ms / 1000 if hvd.rank() == args.slow_rank and first_epoch else 0.0

    def on_reset():
        print(f"rank {hvd.rank()}: reset, now {hvd.size()} ranks", flush=True)

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state):
        while state.step < args.steps:
            if fails and state.step == args.fail_at_step:
                raise RuntimeError(f"rank 1 fails at step {state.step} (--fail-at-step)")
            if slow:
                time.sleep(slow)  # computes longer: late to submit its gradients
            x, y = batch(state.step, hvd.rank())
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            state.step += 1
            if hvd.rank() == 0:  # commit() saves first: the step is committed from here on
                when = f" {time.time():.3f}" if args.print_time else ""
                print(f"commit {state.step} {hvd.size()}{when}", flush=True)
            state.commit()
            if args.sleep > 0:
                time.sleep(args.sleep)

    train(state)
    weights = " ".join(repr(w) for w in model.weight.detach().flatten().tolist())
    print(f"final {hvd.size()} {weights}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
