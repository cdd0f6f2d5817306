"""Shutdown chaos (ctest label `chaos`): `ringmaster local` jobs (2 or 3 ranks, each running
tests/chaos/shutdown_chaos_rank.py: exact allreduces step after step) with one fault drawn at a
random moment per trial:

- a rank finishes early (status 0): every other rank's next allreduce fails within a second naming
  it, and the job FAILED with that reason;
- a rank, a worker daemon or the coordinator is frozen (SIGSTOP, then SIGCONT) for up to 3 s (the
  coordinator up to 14 s, past its 10 s lease): the job SUCCEEDED, every step exact;
- every rank asks for an allgather that cannot fit the arena: it fails alone, every step exact;
- Ctrl-C (SIGINT to `ringmaster local`): the job CANCELLED, exit 130, nothing left in /tmp;
- kill -9 of `ringmaster local`: what it left is removed by the next run's start.

Every trial has a bound well below a hang. Trial count from RINGMASTER_SHUTDOWN_CHAOS_TRIALS
(default 12), the draw from RINGMASTER_CHAOS_SEED.

    RINGMASTER_BIN_DIR=build/bin /usr/bin/python3 -m pytest -q tests/chaos/test_shutdown_chaos.py
"""
import glob
import os
import random
import re
import signal
import subprocess
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BIN = os.path.abspath(os.environ.get("RINGMASTER_BIN_DIR", os.path.join(ROOT, "build", "bin")))
RANK = os.path.join(HERE, "shutdown_chaos_rank.py")
PYTHON = "/usr/bin/python3"
TRIALS = int(os.environ.get("RINGMASTER_SHUTDOWN_CHAOS_TRIALS", "12"))
SEED = int(os.environ.get("RINGMASTER_CHAOS_SEED", str(int(time.time()))))
STEPS = 60
KINDS = ["early-exit", "freeze-rank", "freeze-worker", "freeze-coordinator", "oversized",
         "ctrl-c", "kill-local"]
TMP = tempfile.gettempdir()

pytestmark = pytest.mark.skipif(
    not glob.glob(os.path.join(BIN, "..", "python", "ringmaster", "_ringmaster*.so")),
    reason=f"the ringmaster Python module is not built under {BIN}/..")


def children(pid, name):
    out = subprocess.run(["pgrep", "-P", str(pid), "-f", name], capture_output=True,
                         text=True).stdout.split()
    return [int(p) for p in out]


def start(np_, exit_rank=-1, exit_step=-1, gather_step=-1):
    return subprocess.Popen(
        [os.path.join(BIN, "ringmaster"), "local", "--np", str(np_), "--arena-mb", "16", "--",
         PYTHON, RANK, str(STEPS), str(exit_rank), str(exit_step), str(gather_step)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=HERE,
        start_new_session=True)


def ranks_of(local):
    """The rank processes of a running `ringmaster local` (children of its worker daemons)."""
    out = []
    for worker in children(local.pid, "ringmaster-worker"):
        out += children(worker, "shutdown_chaos_rank")
    return out


def wait_until(predicate, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def leftovers(pid):
    return sorted(glob.glob(os.path.join(TMP, f"ringmaster-{pid}-*")) +
                  glob.glob(os.path.join(TMP, f"ringmaster-local-{pid}-*")))


def freeze(pid, seconds):
    os.kill(pid, signal.SIGSTOP)
    time.sleep(seconds)
    os.kill(pid, signal.SIGCONT)


def collect(local, bound):
    try:
        out, err = local.communicate(timeout=bound)
    except subprocess.TimeoutExpired:
        os.killpg(local.pid, signal.SIGKILL)
        out, err = local.communicate()
        pytest.fail(f"the trial did not end within {bound}s (a hang):\n{out}\n{err}")
    return out, err


def exact_everywhere(out, np_):
    return all(re.search(rf"^\[{r}\] rank {r}: {STEPS} steps, every result exact$", out, re.M)
               for r in range(np_))


def run_trial(rng, kind):
    np_ = rng.choice([2, 3])
    what = f"{kind} (np {np_}, seed {SEED})"
    if kind == "early-exit":
        exit_rank, exit_step = rng.randrange(np_), rng.randrange(3, STEPS - 3)
        began = time.monotonic()
        local = start(np_, exit_rank=exit_rank, exit_step=exit_step)
        out, err = collect(local, 60)
        assert local.returncode == 1, f"{what}\n{out}\n{err}"
        assert re.search(rf"^\[{exit_rank}\] rank {exit_rank}: finished early at step {exit_step}$",
                         out, re.M), f"{what}\n{out}\n{err}"
        for r in range(np_):
            if r == exit_rank:
                continue
            m = re.search(rf"^\[{r}\] rank {r}: step {exit_step} failed after (\S+)s: Allreduce of "
                          rf"tensor 'step' can never complete: rank {exit_rank} on host local-0 "
                          rf"\(worker-\d+\) exited with status 0 before submitting it", out, re.M)
            assert m and float(m.group(1)) < 1.0, f"{what}: rank {r}\n{out}\n{err}"
        assert re.search(rf"^ringmaster local: job FAILED: .*rank {exit_rank} on host local-0",
                         err, re.M), f"{what}\n{err}"
        assert time.monotonic() - began < 45, what
        return
    if kind == "oversized":
        local = start(np_, gather_step=rng.randrange(1, STEPS - 1))
        out, err = collect(local, 90)
        assert local.returncode == 0 and exact_everywhere(out, np_), f"{what}\n{out}\n{err}"
        return
    local = start(np_)
    assert wait_until(lambda: len(ranks_of(local)) == np_, 20), f"{what}: the ranks did not start"
    time.sleep(rng.uniform(0.5, 3.0))
    if kind in ("freeze-rank", "freeze-worker", "freeze-coordinator"):
        if kind == "freeze-rank":
            target, seconds = rng.choice(ranks_of(local)), rng.uniform(0.5, 3.0)
        elif kind == "freeze-worker":
            target = rng.choice(children(local.pid, "ringmaster-worker"))
            seconds = rng.uniform(0.5, 3.0)
        else:
            target = children(local.pid, "ringmaster-coordinator")[0]
            seconds = rng.uniform(3.0, 14.0)
        freeze(target, seconds)
        out, err = collect(local, 120)
        assert local.returncode == 0 and exact_everywhere(out, np_), \
            f"{what}, frozen {seconds:.1f}s\n{out}\n{err}"
        assert "was lost" not in err, f"{what}\n{err}"
        return
    if kind == "ctrl-c":
        os.kill(local.pid, signal.SIGINT)
        signalled = time.monotonic()
        out, err = collect(local, 30)
        assert local.returncode == 130, f"{what}\n{out}\n{err}"
        assert "ringmaster local: job CANCELLED: cancelled: interrupted by SIGINT" in err, err
        assert time.monotonic() - signalled < 15, what
        assert leftovers(local.pid) == [], f"{what}: left {leftovers(local.pid)}"
        return
    assert kind == "kill-local"
    os.killpg(local.pid, signal.SIGKILL)
    local.communicate()
    assert wait_until(lambda: not children(local.pid, "ringmaster"), 10)
    left = leftovers(local.pid)
    # The next run's start removes them (their pid is gone).
    nxt = start(2)
    out, err = collect(nxt, 90)
    assert nxt.returncode == 0 and exact_everywhere(out, 2), f"{what}\n{out}\n{err}"
    gone = [p for p in left if os.path.exists(p)]
    assert gone == [], f"{what}: {gone} still there after the next run"
    if left:
        assert re.search(r"^ringmaster local: removed \d+ sockets and directories left in ", err,
                         re.M), f"{what}\n{err}"


def test_faults_at_random_moments_end_every_job_exactly_and_within_its_bound():
    rng = random.Random(SEED)
    kinds = [KINDS[i % len(KINDS)] for i in range(TRIALS)]
    rng.shuffle(kinds)
    print(f"seed {SEED}: {kinds}")
    for kind in kinds:
        began = time.monotonic()
        run_trial(rng, kind)
        print(f"{kind}: {time.monotonic() - began:.1f}s")
