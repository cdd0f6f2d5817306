"""Horovod's shutdown semantics and one failure failing only itself, end to end: `ringmaster local
--np 2` jobs whose ranks run tests/python/shutdown_checks.py (real processes, one per rank, many
checks in sequence). Each run has a deadline far below what a hang would take.

    RINGMASTER_BIN_DIR=build/bin /usr/bin/python3 -m pytest -q tests/python/test_shutdown.py
"""
import os
import re
import signal
import socket
import subprocess
import time

import pytest

from test_torch_api import BIN, PYTHON, describe, pytestmark, run_local  # noqa: F401

CHECKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shutdown_checks.py")


def lines(r, rank, scenario):
    return re.findall(rf"^\[{rank}\] shutdown_checks: rank {rank}: {scenario}: (.*)$", r.stdout,
                      re.M)


@pytest.mark.parametrize("op", ["allreduce", "allgather", "broadcast", "barrier", "join"])
def test_a_collective_after_a_peer_finished_fails_at_once_naming_it(op):
    start = time.monotonic()
    r = run_local(2, PYTHON, CHECKS, f"uneven-{op}", timeout=60)
    took = time.monotonic() - start
    assert r.returncode == 1, describe(r)
    said = lines(r, 0, f"uneven-{op}")
    assert len(said) == 1, describe(r)
    m = re.match(r"failed after (\d+\.\d+)s: (.*)$", said[0])
    assert m, describe(r)
    assert float(m.group(1)) < 1.0, describe(r)
    ended = r"rank 1 on host local-0 \(worker-\d+\) exited with status 0"
    if op == "join":
        want = rf"Join can never complete: {ended} without joining \(one of the ranks finished " \
               r"execution\)\."
    else:
        kind = {"allreduce": "Allreduce", "allgather": "Allgather", "broadcast": "Broadcast",
                "barrier": "Barrier"}[op]
        name = r"barrier\.\d+" if op == "barrier" else r"after\.exit"
        want = rf"{kind} of tensor '{name}' can never complete: {ended} before submitting it " \
               r"\(one of the ranks finished execution\)\."
    assert re.fullmatch(want, m.group(2)), describe(r)
    # The job fails with that reason; ringmaster local says so and ends well within the bound.
    assert "ringmaster local: job FAILED: " in r.stderr, describe(r)
    assert "can never complete: rank 1 on host local-0" in r.stderr, describe(r)
    assert took < 30, describe(r)


def test_uneven_steps_of_the_distributed_optimizer_fail_the_longer_rank_at_its_extra_step():
    r = run_local(2, PYTHON, CHECKS, "uneven-optimizer", timeout=60)
    assert r.returncode == 1, describe(r)
    assert lines(r, 1, "uneven-optimizer") == ["finished 20 steps"], describe(r)
    said = lines(r, 0, "uneven-optimizer")
    assert len(said) == 1, describe(r)
    m = re.match(r"step 21 failed after (\d+\.\d+)s: Allreduce of tensor '(.*)' can never "
                 r"complete: rank 1 on host local-0 \(worker-000002\) exited with status 0 "
                 r"before submitting it \(one of the ranks finished execution\)\.$", said[0])
    assert m, describe(r)
    assert float(m.group(1)) < 1.0, describe(r)


def test_a_signal_handler_runs_while_join_barrier_and_synchronize_wait():
    r = run_local(2, PYTHON, CHECKS, "interrupt", timeout=60)
    assert r.returncode == 0, describe(r)
    assert "FAIL" not in r.stdout, describe(r)
    said = lines(r, 0, "interrupt")
    assert len(said) == 3, describe(r)
    for what, line in zip(["barrier", "synchronize"], said):
        m = re.match(rf"{what} interrupted after (\d+\.\d+)s$", line)
        assert m and 0.4 <= float(m.group(1)) < 1.5, describe(r)
    assert said[2] == "join returned 0", describe(r)
    assert lines(r, 1, "interrupt") == ["done"], describe(r)


def test_an_operation_that_fails_for_its_own_reasons_fails_alone_and_the_next_one_works():
    r = run_local(2, PYTHON, CHECKS, "one-failure", extra=("--arena-mb", "16"), timeout=90)
    assert r.returncode == 0, describe(r)
    assert "FAIL" not in r.stdout, describe(r)
    for rank in (0, 1):
        said = lines(r, rank, "one-failure")
        assert [s for s in said if s.startswith("next allreduce exact after")] == [
            "next allreduce exact after the oversized allgather",
            "next allreduce exact after a second oversized allgather",
            "next allreduce exact after the long name",
            "next allreduce exact after the join"], describe(r)
        gather = [s for s in said if s.startswith("allgather too big: ")][0]
        assert re.fullmatch(
            r"allgather too big: the allgather's output of \d+ bytes does not fit the shared "
            r"arena \(shared arena full: \d+ bytes requested, \d+ free\): start the workers with a "
            r"larger --arena-mb \(ringmaster local --arena-mb\), or gather less at once",
            gather), describe(r)
        assert f"long name: Invalid allreduce request for tensor '{'n' * 96}... (5000 bytes)' " \
               f"from rank {rank} (local-0): name is 5000 bytes long; at most 1024 are allowed." \
               in said, describe(r)
    assert "allgather and broadcast refused while rank 1 joined" in lines(r, 0, "one-failure")
    # The job succeeded: nothing was latched.
    assert "job FAILED" not in r.stderr, describe(r)


def test_process_set_ids_across_add_remove_cycles_and_reinit_as_in_horovod():
    r = run_local(2, PYTHON, CHECKS, "process-sets", extra=("--env", "HOROVOD_DYNAMIC_PROCESS_SETS=1"),
                  timeout=90)
    assert r.returncode == 0, describe(r)
    assert "FAIL" not in r.stdout, describe(r)
    for rank in (0, 1):
        # Freed ids are reused first in, first out: 1 and 2 every cycle.
        assert lines(r, rank, "process-sets") == [
            "round 0 ids [(1, 2), (1, 2), (1, 2), (1, 2)]",
            "round 1 ids [(1, 2), (1, 2), (1, 2), (1, 2)]"], describe(r)


def local_with(np, *command, extra=()):
    """Starts `ringmaster local` (not waiting): (the process, its coordinator's pid)."""
    proc = subprocess.Popen(
        [os.path.join(BIN, "ringmaster"), "local", "--np", str(np), *extra, "--", *command],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=os.path.dirname(CHECKS))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        found = subprocess.run(["pgrep", "-P", str(proc.pid), "-f", "ringmaster-coordinator"],
                               capture_output=True, text=True).stdout.split()
        if found:
            return proc, int(found[0])
        time.sleep(0.05)
    proc.kill()
    pytest.fail("ringmaster local started no coordinator")


def finish(proc, timeout):
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"ringmaster local did not finish within {timeout}s:\n{out}\n{err}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def free_port_block(n):
    """A port p with p .. p+n-1 free on loopback now."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n > 65535:
            continue
        try:
            held = []
            for p in range(base, base + n):
                t = socket.socket()
                held.append(t)
                t.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for t in held:
                t.close()
    pytest.fail(f"no block of {n} free ports on loopback")


def test_unnamed_allreduces_keep_the_worker_and_the_coordinator_flat():
    """Horovod's automatic names make every unnamed call a new tensor: per-name state is bounded
    (the worker's evicted cache entries, the coordinator's count of distinct names)."""
    base = free_port_block(3)
    r = run_local(2, PYTHON, CHECKS, "unnamed", "40000", timeout=150,
                  extra=["--metrics-port-base", str(base),
                         "--env", f"SHUTDOWN_CHECKS_METRICS_BASE={base}"])
    assert r.returncode == 0, describe(r)
    said = lines(r, 0, "unnamed")
    assert len(said) == 2, describe(r)
    # Negotiated like named ones: after the first, each unnamed allreduce's family entry in the
    # response cache stands for it, and the ranks agree through shared memory. Every round
    # completes on both ranks; a few may be diverted to the coordinator (a rank descheduled).
    counts = re.fullmatch(r"negotiated locally: (\d+) (\d+)", said[1])
    assert counts and counts.group(1) == counts.group(2), describe(r)
    assert int(counts.group(1)) >= 30000, describe(r)
    m = re.fullmatch(r"worker (\S+) -> (\S+) MiB, coordinator (\S+) -> (\S+) MiB", said[0])
    assert m, describe(r)
    worker_growth = float(m.group(2)) - float(m.group(1))
    coordinator_growth = float(m.group(4)) - float(m.group(3))
    # 30,000 new names after the warm-up: before the bound, 9 and 3 MiB.
    assert worker_growth < 1.5, describe(r)
    assert coordinator_growth < 1.5, describe(r)


def test_a_killed_worker_fails_the_job_naming_the_rank_it_served():
    start = time.monotonic()
    r = run_local(2, PYTHON, CHECKS, "kill-worker", timeout=60)
    assert r.returncode == 1, describe(r)
    m = re.search(r"^ringmaster local: job (\w+): (.*)$", r.stderr, re.M)
    assert m, describe(r)
    assert m.group(1) == "FAILED", describe(r)
    assert re.match(r"worker worker-\d+ serving rank 1 on host local-0 ", m.group(2)), describe(r)
    assert time.monotonic() - start < 30, describe(r)


@pytest.mark.parametrize("pause", [12, 30])
def test_a_coordinator_stopped_longer_than_the_lease_loses_no_job(pause):
    steps = 2 * (pause + 6)
    proc, coordinator = local_with(2, PYTHON, CHECKS, "pause", str(steps))
    time.sleep(3)  # the job runs
    os.kill(coordinator, signal.SIGSTOP)
    time.sleep(pause)
    os.kill(coordinator, signal.SIGCONT)
    r = finish(proc, steps * 0.5 + pause + 60)
    assert r.returncode == 0, describe(r)
    assert "FAIL" not in r.stdout, describe(r)
    for rank in (0, 1):
        assert lines(r, rank, "pause") == [f"{steps} steps exact"], describe(r)
    # Nobody was blamed for the coordinator's own silence.
    assert "was lost" not in r.stderr, describe(r)
