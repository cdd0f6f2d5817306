"""Elastic jobs end to end (ringmaster submit --min-np/--max-np, hvd.elastic): a coordinator and
worker daemons on loopback, examples/pytorch_elastic.py as the training script.

- a 3-rank job (min 2) loses a daemon (kill -9) mid-training and finishes with 2 ranks; its final
  model equals the one recomputed from rank 0's committed steps (which ranks took part in each);
- a 2-rank job (max 3) grows to 3 when a worker is added; every rank ends with rank 0's model;
- a process that raises inside a step: its slot starts a new process, which syncs from rank 0;
- below min_np for longer than the elastic timeout, the job fails saying how many ranks it had.

    RINGMASTER_BIN_DIR=build/bin /usr/bin/python3 -m pytest -q tests/python/test_elastic.py
"""
import os
import re
import signal
import sys
import time

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "cli"))
from test_first_hour import Cluster, REPO, submit, wait_for  # noqa: E402

sys.path.insert(0, str(REPO / "examples"))
from pytorch_elastic import FEATURES, batch  # noqa: E402

SCRIPT = str(REPO / "examples" / "pytorch_elastic.py")
PYTHON = "/usr/bin/python3"
TERMINAL = {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"}
LR = 0.05


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    yield c
    c.close()


def logs(cluster, c, job):
    r = cluster.cli(c, "logs", job)
    assert r.returncode == 0, r.stderr
    return r.stdout + r.stderr  # the ranks' stderr is the CLI's


def commits(text):
    """Rank 0's committed steps, in order: [(step, size), ...]."""
    return [(int(s), int(n)) for s, n in re.findall(r"^\[0\] commit (\d+) (\d+)$", text, re.M)]


def finals(text):
    """Each rank's final (size, weights)."""
    out = {}
    for rank, size, weights in re.findall(r"^\[(\d+)\] final (\d+) (.*)$", text, re.M):
        out[int(rank)] = (int(size), [float(w) for w in weights.split()])
    return out


def reference(steps):
    """The model after `steps` [(step, size)]: SGD on the average of ranks 0..size-1's gradients,
    as the ranks compute it."""
    w = torch.zeros(1, FEATURES, dtype=torch.float64)
    for step, size in steps:
        grads = []
        for rank in range(size):
            x, y = batch(step - 1, rank)
            wr = w.clone().requires_grad_(True)
            torch.nn.functional.mse_loss(x @ wr.t(), y).backward()
            grads.append(wr.grad)
        w = w - LR * (sum(grads) / size)
    return w.flatten().tolist()


def check_model(text, steps_total, size):
    done = commits(text)
    assert [s for s, _ in done] == list(range(1, steps_total + 1)), done
    expected = reference(done)
    got = finals(text)
    assert sorted(got) == list(range(size)), got
    for rank, (n, weights) in got.items():
        assert n == size, (rank, n)
        assert weights == pytest.approx(expected, rel=1e-12, abs=1e-12), rank
    return done


def test_a_killed_daemon_leaves_the_job_running_on_the_others(cluster):
    c = cluster.coordinator()
    daemons = [cluster.worker(c, host=f"h{i}") for i in range(3)]
    wait_for(lambda: len(cluster.idle_workers(c)) == 3, 20, "the workers")
    job = submit(cluster, c, "--min-np", "2", "--max-np", "3", "--", PYTHON, SCRIPT,
                 "--steps", "150", "--sleep", "0.03")
    wait_for(lambda: "commit 40 " in logs(cluster, c, job), 60, "training to run")
    victim = cluster.job(c, job)["ranks"][2]
    assert victim["host"] == "h2"
    daemons[2].stop(signal.SIGKILL)
    done = cluster.wait_state(c, job, TERMINAL, 90)
    text = logs(cluster, c, job)
    assert done["state"] == "JOB_STATE_SUCCEEDED", (done["reason"], text[-3000:])
    steps = check_model(text, 150, 2)
    sizes = [n for _, n in steps]
    # 3 ranks, then 2 from the kill on: never back.
    cut = sizes.index(2)
    assert cut >= 40 and set(sizes[:cut]) == {3} and set(sizes[cut:]) == {2}, sizes
    assert done.get("resets") == 1, done
    events = [e["message"] for e in done["events"]]
    assert any(re.match(rf"epoch 2: 2 ranks \(2 kept, 0 added\); gone: rank 2 on host h2 "
                        rf"\({victim['worker_id']}\)", e) for e in events), events
    status = cluster.cli(c, "status", job).stdout
    assert "\nElastic:   2..3 ranks, 1 resets, elastic timeout 600 s\n" in status, status
    assert "\nEpoch:     2\n" in status, status


def test_bad_elastic_bounds_are_refused_naming_the_field(cluster):
    c = cluster.coordinator()
    r = cluster.cli(c, "submit", "--min-np", "3", "--max-np", "2", "--", PYTHON, SCRIPT)
    assert r.returncode != 0
    assert "spec.min_np = 3 is out of bounds [1, np = 2]" in r.stderr, r.stderr
    r = cluster.cli(c, "submit", "--np", "2", "--reset-limit", "2", "--", PYTHON, SCRIPT)
    assert r.returncode != 0
    assert ("spec.reset_limit and spec.elastic_timeout_seconds need an elastic job "
            "(spec.min_np or spec.max_np)") in r.stderr, r.stderr
    r = cluster.cli(c, "submit", "--", PYTHON, SCRIPT)
    assert r.returncode == 2
    assert "submit needs --np N (or --min-np/--max-np for an elastic job)" in r.stderr, r.stderr


def test_an_added_worker_grows_the_job_at_the_next_commit(cluster):
    c = cluster.coordinator()
    cluster.worker(c, host="h0")
    cluster.worker(c, host="h1")
    wait_for(lambda: len(cluster.idle_workers(c)) == 2, 20, "the workers")
    job = submit(cluster, c, "--min-np", "2", "--max-np", "3", "--", PYTHON, SCRIPT,
                 "--steps", "120", "--sleep", "0.03")
    wait_for(lambda: "commit 20 " in logs(cluster, c, job), 60, "training to run")
    assert len(cluster.job(c, job)["ranks"]) == 2
    cluster.worker(c, host="h2")
    done = cluster.wait_state(c, job, TERMINAL, 90)
    text = logs(cluster, c, job)
    assert done["state"] == "JOB_STATE_SUCCEEDED", (done["reason"], text[-3000:])
    steps = check_model(text, 120, 3)  # the new rank ends with rank 0's model
    sizes = [n for _, n in steps]
    cut = sizes.index(3)
    assert cut >= 20 and set(sizes[:cut]) == {2} and set(sizes[cut:]) == {3}, sizes
    events = [e["message"] for e in done["events"]]
    assert "1 worker came free: the ranks reset into a bigger epoch at their next commit" in events
    assert any(e.startswith("epoch 2: 3 ranks (2 kept, 1 added)") for e in events), events


def test_a_process_that_raises_is_replaced_and_training_goes_on(cluster):
    c = cluster.coordinator()
    for i in range(3):
        cluster.worker(c, host=f"h{i}")
    wait_for(lambda: len(cluster.idle_workers(c)) == 3, 20, "the workers")
    # Submitted from Python this time (ringmaster.jobs), as a platform's launcher would.
    from ringmaster.jobs import Client
    with Client(c.address) as client:
        submitted = client.submit([PYTHON, SCRIPT, "--steps", "60", "--fail-at-step", "25"],
                                  min_np=2, max_np=3, reset_limit=5,
                                  env={"PYTHONPATH": os.environ["PYTHONPATH"]})
    assert (submitted.proto.spec.min_np, submitted.proto.spec.max_np) == (2, 3)
    job = submitted.id
    done = cluster.wait_state(c, job, TERMINAL, 90)
    text = logs(cluster, c, job)
    assert done["state"] == "JOB_STATE_SUCCEEDED", (done["reason"], text[-3000:])
    assert text.count("RuntimeError: rank 1 fails at step 25 (--fail-at-step)") == 1
    steps = check_model(text, 60, 3)
    assert {n for _, n in steps} == {3}  # the slot came back in the same reset
    events = [e["message"] for e in done["events"]]
    assert any(re.match(r"epoch 2: 3 ranks \(2 kept, 1 added\); gone: rank 1 on host h1 .*"
                        r"exited with status 1", e) for e in events), events


def test_below_min_np_past_the_elastic_timeout_the_job_fails_saying_so(cluster):
    c = cluster.coordinator()
    daemons = [cluster.worker(c, host=f"h{i}") for i in range(2)]
    wait_for(lambda: len(cluster.idle_workers(c)) == 2, 20, "the workers")
    job = submit(cluster, c, "--min-np", "2", "--max-np", "2", "--elastic-timeout", "3", "--",
                 PYTHON, SCRIPT, "--steps", "100000", "--sleep", "0.03")
    wait_for(lambda: "commit 10 " in logs(cluster, c, job), 60, "training to run")
    killed = time.monotonic()
    daemons[1].stop(signal.SIGKILL)
    done = cluster.wait_state(c, job, TERMINAL, 30)
    assert done["state"] == "JOB_STATE_FAILED"
    assert done["reason"] == ("elastic job had 1 rank for 3 s (--elastic-timeout), fewer than "
                              "min_np 2 (--min-np)"), done["reason"]
    assert 3 <= time.monotonic() - killed < 15


def test_a_straggler_is_evicted_and_its_host_kept_out_while_the_job_goes_on(cluster):
    # --straggler-action evict: the rank named late to submit leaves; the job goes on in a new
    # epoch with the others, and the evicted worker's host is not taken back (its cool-down is
    # 300 s) although its worker is free and the job is below max_np.
    c = cluster.coordinator()
    for i in range(4):
        cluster.worker(c, host=f"h{i // 2}")
    wait_for(lambda: len(cluster.idle_workers(c)) == 4, 20, "the workers")
    job = submit(cluster, c, "--min-np", "2", "--max-np", "4", "--straggler-action", "evict",
                 "--", PYTHON, SCRIPT, "--steps", "120", "--slow-rank", "3", "--slow-ms", "150")
    first = wait_for(lambda: (lambda j: j if len(j.get("ranks", [])) == 4 and
                              j["state"] == "JOB_STATE_RUNNING" else None)(cluster.job(c, job)),
                     60, "four ranks running")
    victim = first["ranks"][3]
    assert victim["host"] == "h1", first["ranks"]
    done = cluster.wait_state(c, job, TERMINAL, 180)
    text = logs(cluster, c, job)
    assert done["state"] == "JOB_STATE_SUCCEEDED", (done["reason"], text[-3000:])
    steps = check_model(text, 120, 3)
    sizes = [n for _, n in steps]
    cut = sizes.index(3)
    assert 1 <= cut <= 20 and set(sizes[:cut]) == {4} and set(sizes[cut:]) == {3}, sizes
    assert done.get("resets") == 1, done
    assert sorted(r["host"] for r in done["ranks"]) == ["h0", "h0", "h1"], done["ranks"]
    assert victim["worker_id"] not in [r["worker_id"] for r in done["ranks"]], done["ranks"]
    events = [e["message"] for e in done["events"]]
    placed = rf"rank 3 on host h1 \({victim['worker_id']}\)"
    evicted = [e for e in events if e.startswith("rank 3") and "--straggler-action evict" in e]
    assert len(evicted) == 1, events
    assert re.fullmatch(rf"{placed} holds the job back: [\d.]+ms behind the median rank per step "
                        rf"over the last \d+ steps \(late to submit: its compute or input is "
                        rf"slow\) \(--straggler-action evict\): {placed} leaves the job; host h1 "
                        rf"is kept out of it for 300 s", evicted[0]), evicted
    assert any(re.match(rf"epoch 2: 3 ranks \(3 kept, 0 added\); gone: {placed}", e)
               for e in events), events
    # No growth back onto h1 while the job ran, though its worker was free.
    assert not any("came free" in e for e in events), events
