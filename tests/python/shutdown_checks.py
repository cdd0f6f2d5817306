"""Run as every rank of a `ringmaster local --np 2` job: `python3 shutdown_checks.py SCENARIO`.
What users of Horovod rely on when ranks end unevenly, a wait is interrupted or one operation
fails: each scenario prints "shutdown_checks: rank R: SCENARIO: ..." lines that test_shutdown.py
reads, and "FAIL ..." for what went wrong.

Scenarios:
  uneven-<op>   rank 1 finishes at once; rank 0 then calls <op> (allreduce, allgather, broadcast,
                barrier, join, optimizer: step 21 of a DistributedOptimizer loop that rank 1 ran for
                20 steps). Rank 0 prints how long the failing call took and its error.
  interrupt     rank 0 waits in join(), barrier() and synchronize() while rank 1 sleeps; a SIGALRM
                handler (as pytest-timeout uses) must run within a second of the alarm each time.
  one-failure   operations that fail for their own reasons (an allgather whose output does not
                fit the arena, a name over the bound, a sparse tensor, an allgather and a
                broadcast while a rank has joined) fail alone, with a message that says what to
                change, and the next operation works, on every rank.
  process-sets  add_process_set / remove_process_set test after test in one process, across
                shutdown() and init(): Horovod's ids, every collective exact.
  unnamed N     N unnamed allreduces; rank 0 prints its worker's and the coordinator's resident
                memory after a quarter of them and at the end, and, given
                SHUTDOWN_CHECKS_METRICS_BASE, how many each worker negotiated locally.
  kill-worker   rank 1 kills the worker daemon serving it while rank 0 waits in a barrier.
  pause N       N exact allreduces 0.5 s apart, while the test stops the coordinator.
"""
import os
import signal
import subprocess
import sys
import time

import torch

import ringmaster.torch as hvd
from ringmaster import basics

FAILURES = []


def fail(message):
    FAILURES.append(message)
    print(f"FAIL rank {hvd.rank()}: {message}", flush=True)


def say(rank, scenario, text):
    print(f"shutdown_checks: rank {rank}: {scenario}: {text}", flush=True)


def expect_error(what, call, *fragments):
    """Runs `call`; it must raise HorovodInternalError (or ValueError) whose message holds every
    fragment. Returns the message."""
    try:
        call()
    except (hvd.HorovodInternalError, ValueError) as e:
        message = str(e)
        for fragment in fragments:
            if fragment not in message:
                fail(f"{what}: error {message!r} lacks {fragment!r}")
        return message
    fail(f"{what}: no error")
    return ""


def uneven(op):
    hvd.init()
    rank = hvd.rank()
    scenario = f"uneven-{op}"
    if op == "optimizer":
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 2)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters())
        steps = 20 if rank == 1 else 25
        for step in range(steps):
            opt.zero_grad()
            model(torch.ones(4, 8)).sum().backward()
            start = time.monotonic()
            try:
                opt.step()
            except hvd.HorovodInternalError as e:
                say(rank, scenario, f"step {step + 1} failed after "
                    f"{time.monotonic() - start:.2f}s: {e}")
                return 1
        say(rank, scenario, f"finished {steps} steps")
        return 0
    if rank == 1:
        say(rank, scenario, "finishing at once")
        return 0
    time.sleep(1.0)  # rank 1 has exited by now
    calls = {
        "allreduce": lambda: hvd.allreduce(torch.ones(3), name="after.exit"),
        "allgather": lambda: hvd.allgather(torch.ones(2, 3), name="after.exit"),
        "broadcast": lambda: hvd.broadcast(torch.ones(3), root_rank=0, name="after.exit"),
        "barrier": hvd.barrier,
        "join": hvd.join,
    }
    start = time.monotonic()
    try:
        calls[op]()
    except hvd.HorovodInternalError as e:
        say(rank, scenario, f"failed after {time.monotonic() - start:.2f}s: {e}")
        return 1
    fail(f"{op} after rank 1 exited did not fail")
    return 1


def interrupt():
    hvd.init()
    rank = hvd.rank()

    class Alarm(Exception):
        pass

    def on_alarm(signum, frame):
        raise Alarm()

    signal.signal(signal.SIGALRM, on_alarm)
    if rank == 1:
        time.sleep(4.0)  # rank 0 waits for rank 1 meanwhile
        hvd.barrier()  # the one rank 0 started: every barrier in flight completes
        h = hvd.allreduce_async(torch.ones(2), name="late", op=hvd.Sum)
        hvd.synchronize(h)
        hvd.join()
        say(rank, "interrupt", "done")
        return 0
    waits = {
        "barrier": hvd.barrier,
        "synchronize": lambda: hvd.synchronize(
            hvd.allreduce_async(torch.ones(2), name="late", op=hvd.Sum)),
    }
    for what, call in waits.items():
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        start = time.monotonic()
        try:
            call()
            fail(f"{what} returned before rank 1 took part")
        except Alarm:
            say(rank, "interrupt", f"{what} interrupted after {time.monotonic() - start:.2f}s")
    # The interrupted operations are still in flight and complete once rank 1 takes part.
    time.sleep(5.0)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    start = time.monotonic()
    try:
        last = hvd.join()
        say(rank, "interrupt", f"join returned {last}")
    except Alarm:
        fail("join was interrupted, though rank 1 joins")
    signal.setitimer(signal.ITIMER_REAL, 0)
    return 0


def one_failure():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    arena = basics.client().topology.arena_bytes
    n = 0

    def next_works(after):
        nonlocal n
        n += 1
        got = hvd.allreduce(torch.full((3,), float(rank + 1)), op=hvd.Sum, name=f"next.{n}")
        want = torch.full((3,), float(size * (size + 1) // 2))
        if not torch.equal(got, want):
            fail(f"the allreduce after {after}: {got.tolist()}, want {want.tolist()}")
        else:
            say(rank, "one-failure", f"next allreduce exact after {after}")

    # An allgather whose output (size x the input) cannot fit this rank's arena.
    rows = arena // 4 // 64 // size + 1
    message = expect_error("an allgather larger than the arena",
                           lambda: hvd.allgather(torch.ones(rows, 64), name="too.big.gather"),
                           "does not fit the shared arena", "--arena-mb")
    say(rank, "one-failure", f"allgather too big: {message}")
    next_works("the oversized allgather")
    # Twice: the first failure latched nothing.
    expect_error("a second allgather larger than the arena",
                 lambda: hvd.allgather(torch.ones(rows, 64), name="too.big.gather.2"),
                 "does not fit the shared arena")
    next_works("a second oversized allgather")
    small = hvd.allgather(torch.full((1, 2), float(rank)), name="small.gather")
    if not torch.equal(small, torch.tensor([[float(r)] * 2 for r in range(size)])):
        fail(f"an allgather after the oversized ones: {small.tolist()}")

    # A name over the bound: the message quotes a prefix and the length, not the whole name.
    long_name = "n" * 5000
    message = expect_error("a name over 1024 bytes",
                           lambda: hvd.allreduce(torch.ones(2), name=long_name),
                           "... (5000 bytes)", "at most 1024")
    if len(message) > 600:
        fail(f"the error for a long name is {len(message)} characters long")
    say(rank, "one-failure", f"long name: {message}")
    next_works("the long name")

    # A sparse tensor: pointed to the sparse API.
    sparse = torch.sparse_coo_tensor(torch.tensor([[0, 2]]), torch.tensor([1.0, 2.0]), (4,))
    message = expect_error("a sparse tensor", lambda: hvd.allreduce(sparse, name="sparse"),
                           "sparse_allreduce_async", "sparse_as_dense=True")
    say(rank, "one-failure", f"sparse: {message}")

    # Allgather and broadcast while a rank has joined fail on every rank, as in Horovod.
    if rank == 1:
        last = hvd.join()
        say(rank, "one-failure", f"join returned {last}")
    else:
        expect_error("an allgather while rank 1 has joined",
                     lambda: hvd.allgather(torch.ones(1, 2), name="gather.with.join"),
                     "Allgather is not supported with Join at this time")
        expect_error("a broadcast while rank 1 has joined",
                     lambda: hvd.broadcast(torch.ones(2), root_rank=0, name="bcast.with.join"),
                     "Broadcast is not supported with Join at this time")
        say(rank, "one-failure", "allgather and broadcast refused while rank 1 joined")
        # An allreduce works: the joined rank adds zeros.
        got = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="sum.with.join")
        if not torch.equal(got, torch.ones(2)):
            fail(f"an allreduce while rank 1 has joined: {got.tolist()}")
        last = hvd.join()
        say(rank, "one-failure", f"join returned {last}")
    next_works("the join")
    return 0


def process_sets():
    rank = None
    for round_ in range(2):  # shutdown() and init() between rounds, as a test suite does
        hvd.init(process_sets="dynamic")
        rank = hvd.rank()
        ids = []
        for cycle in range(4):
            first = hvd.add_process_set([0, 1])
            second = hvd.add_process_set([0])
            ids.append((first.process_set_id, second.process_set_id))
            got = hvd.allreduce(torch.full((2,), float(rank + 1)), op=hvd.Sum,
                                name=f"in.set.{round_}.{cycle}", process_set=first)
            if not torch.equal(got, torch.full((2,), 3.0)):
                fail(f"round {round_} cycle {cycle}: allreduce in {first}: {got.tolist()}")
            if rank == 0:
                alone = hvd.allreduce(torch.ones(2), op=hvd.Sum, name=f"alone.{round_}.{cycle}",
                                      process_set=second)
                if not torch.equal(alone, torch.ones(2)):
                    fail(f"round {round_} cycle {cycle}: allreduce in {second}: {alone}")
            # Removed in the order added: Horovod reuses the freed ids first in, first out.
            hvd.remove_process_set(first)
            hvd.remove_process_set(second)
        say(rank, "process-sets", f"round {round_} ids {ids}")
        hvd.shutdown()
    return 0


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return -1.0


def coordinator_of(daemon):
    """The pid of the coordinator that `ringmaster local` (the daemon's parent) started."""
    with open(f"/proc/{daemon}/stat") as f:
        local = int(f.read().rsplit(")", 1)[1].split()[1])
    found = subprocess.run(["pgrep", "-P", str(local), "-f", "ringmaster-coordinator"],
                           capture_output=True, text=True).stdout.split()
    return int(found[0])


def unnamed(count):
    """`count` unnamed allreduces (Horovod's automatic names: each one new); rank 0 prints its
    worker's and the coordinator's resident memory after a warm-up and at the end."""
    hvd.init()
    rank = hvd.rank()
    daemon = os.getppid()  # the worker daemon runs this rank
    coordinator_pid = coordinator_of(daemon)
    t = torch.ones(4)
    warm = count // 4
    for i in range(count):
        if i == warm and rank == 0:
            before = (rss_mib(daemon), rss_mib(coordinator_pid))
        got = hvd.allreduce(t, op=hvd.Sum)
        if i % 997 == 0 and not torch.equal(got, torch.full((4,), float(hvd.size()))):
            fail(f"unnamed allreduce {i}: {got.tolist()}")
    if rank == 0:
        after = (rss_mib(daemon), rss_mib(coordinator_pid))
        say(rank, "unnamed", f"worker {before[0]:.1f} -> {after[0]:.1f} MiB, coordinator "
            f"{before[1]:.1f} -> {after[1]:.1f} MiB")
        base = os.environ.get("SHUTDOWN_CHECKS_METRICS_BASE")
        if base:
            # Worker i serves its metrics on base + 1 + i (ringmaster local --metrics-port-base).
            counts = [local_negotiations(int(base) + 1 + i) for i in range(hvd.size())]
            say(rank, "unnamed", "negotiated locally: " + " ".join(str(c) for c in counts))
    return 0


def local_negotiations(port):
    """A worker's ringmaster_local_negotiations_total{outcome="completed"}, summed over its
    series."""
    import urllib.request
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
               if line.startswith("ringmaster_local_negotiations_total{")
               and 'outcome="completed"' in line)


def kill_own_worker():
    """Rank 1 kills the worker daemon that serves it; rank 0 waits in a barrier meanwhile."""
    hvd.init()
    if hvd.rank() == 1:
        time.sleep(0.5)
        say(1, "kill-worker", "killing my worker")
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(30)
        return 0
    try:
        hvd.barrier()
    except hvd.HorovodInternalError as e:
        say(0, "kill-worker", f"barrier failed: {e}")
        return 1
    return 0


def paused_coordinator(steps):
    """Steps of an exact allreduce, 0.5 s apart, while the test stops the coordinator for a while."""
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    for step in range(steps):
        got = hvd.allreduce(torch.full((3,), float(rank + step)), op=hvd.Sum, name="step")
        want = sum(r + step for r in range(size))
        if not torch.equal(got, torch.full((3,), float(want))):
            fail(f"step {step}: {got.tolist()}, want {want}")
        time.sleep(0.5)
    say(rank, "pause", f"{steps} steps exact")
    return 0


def main():
    scenario = sys.argv[1]
    if scenario.startswith("uneven-"):
        code = uneven(scenario[len("uneven-"):])
    elif scenario == "unnamed":
        code = unnamed(int(sys.argv[2]))
    elif scenario == "kill-worker":
        code = kill_own_worker()
    elif scenario == "pause":
        code = paused_coordinator(int(sys.argv[2]))
    else:
        code = {"interrupt": interrupt, "one-failure": one_failure,
                "process-sets": process_sets}[scenario]()
    if FAILURES:
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
