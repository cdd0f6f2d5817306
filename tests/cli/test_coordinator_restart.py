"""A coordinator restarted with the same --state-dir and --listen resumes the jobs it had, with real
processes on loopback: the daemons keep their ranks' processes and communicators, reattach, and the
job finishes with every step's result exact (train_loop checks each one); a rank whose daemon does
not come back fails the job, named, after --resume-timeout.

Run by ctest (label `cli`) with /usr/bin/python3 -m pytest; helpers from test_first_hour.py."""
import os
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from test_first_hour import BIN, Cluster, free_port, submit, wait_for  # noqa: E402

import pytest  # noqa: E402

TRAIN = str(BIN / "train_loop")


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    yield c
    c.close()


def start(cluster, tmp_path, *extra, workers=4, per_host=2):
    """A coordinator with a state dir, and `workers` daemons, `per_host` per host (h0, h1, ...)."""
    state = tmp_path / "state"
    port = free_port()
    c = cluster.coordinator("--state-dir", str(state), *extra, port=port)
    daemons = [cluster.worker(c, host=f"h{i // per_host}") for i in range(workers)]
    wait_for(lambda: len(cluster.idle_workers(c)) == workers, 20, "the workers")
    return c, daemons, state, port


def exact_lines(logs, np_, steps):
    return {rank: len(re.findall(rf"^\[{rank}\] rank {rank}: {steps} steps, every result exact$",
                                 logs, re.M)) for rank in range(np_)}


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill9", "sigterm"])
def test_a_running_job_survives_a_coordinator_restart_with_every_step_exact(cluster, tmp_path, sig):
    c, _, state, port = start(cluster, tmp_path)
    job = submit(cluster, c, "--np", "4", "--processes-per-host", "2", "--", TRAIN, "300")
    wait_for(lambda: "step 40" in cluster.cli(c, "logs", job).stdout, 30, "training to run")
    c.stop(sig)
    time.sleep(0.5)  # the ranks go on without it; their next steps wait for negotiation
    c2 = cluster.coordinator("--state-dir", str(state), port=port)
    done = cluster.wait_state(c2, job, {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"}, 60)
    logs = cluster.cli(c2, "logs", job).stdout
    assert done["state"] == "JOB_STATE_SUCCEEDED", done.get("reason", "") + logs
    assert done["reason"] == "all 4 ranks exited 0"
    # Every step of every rank ran once, with the exact sum: 0 steps lost.
    assert exact_lines(logs, 4, 300) == {0: 1, 1: 1, 2: 1, 3: 1}, logs
    events = [e["message"] for e in done["events"]]
    assert any(m.startswith("the coordinator restarted; waiting up to 1m for the job's 4 ranks")
               for m in events), events
    assert any(m.startswith("resumed after the coordinator restart: every rank reattached")
               for m in events), events
    # The same daemons serve the next job.
    after = submit(cluster, c2, "--np", "4", "--", TRAIN, "5")
    assert cluster.wait_state(c2, after, {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"}, 30)["state"] \
        == "JOB_STATE_SUCCEEDED"


def test_a_rank_whose_daemon_does_not_reattach_fails_the_job_naming_it(cluster, tmp_path):
    # One daemon per host: the host names the daemon.
    c, daemons, state, port = start(cluster, tmp_path, "--resume-timeout", "3s", per_host=1)
    job = submit(cluster, c, "--np", "4", "--", TRAIN)
    wait_for(lambda: "step 10" in cluster.cli(c, "logs", job).stdout, 30, "training to run")
    victim = cluster.job(c, job)["ranks"][3]
    daemon = daemons[int(victim["host"][1:])]
    c.stop(signal.SIGKILL)
    daemon.stop(signal.SIGKILL)
    restarted = time.monotonic()
    c2 = cluster.coordinator("--state-dir", str(state), "--resume-timeout", "3s", port=port)
    failed = cluster.wait_state(c2, job, {"JOB_STATE_FAILED", "JOB_STATE_SUCCEEDED"}, 20)
    assert time.monotonic() - restarted < 10
    # First what went wrong, then (when one was quick enough) the rank that failed of it.
    first, *then = failed["reason"].split("; then ", 1)
    assert first == ("1 rank did not reattach within 3s of the coordinator's restart "
                     f"(--resume-timeout): rank 3 on host {victim['host']} ({victim['worker_id']})")
    assert not then or re.match(r"rank [0-2] on host h[0-3] \(worker-\d+\) exited with status 1",
                                then[0]), failed["reason"]
    # The other daemons stopped their ranks and are free for the next job.
    wait_for(lambda: len(cluster.idle_workers(c2)) == 3, 15, "the other workers to be idle")
    assert all(d.alive() for d in daemons if d is not daemon)
    nxt = submit(cluster, c2, "--np", "3", "--", TRAIN, "5")
    assert cluster.wait_state(c2, nxt, {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"}, 30)["state"] \
        == "JOB_STATE_SUCCEEDED"


@pytest.fixture
def etcd(tmp_path):
    """A real etcd on loopback (Debian's etcd-server), with its own data directory."""
    if not os.path.exists("/usr/bin/etcd"):
        pytest.skip("etcd is not installed (etcd-server; scripts/install-deps.sh installs it)")
    client, peer = free_port(), free_port()
    c, p = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    proc = subprocess.Popen(
        ["/usr/bin/etcd", "--name=t", f"--data-dir={tmp_path / 'etcd'}", f"--listen-client-urls={c}",
         f"--advertise-client-urls={c}", f"--listen-peer-urls={p}",
         f"--initial-advertise-peer-urls={p}", f"--initial-cluster=t={p}", "--log-level=error"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        yield f"etcd://127.0.0.1:{client}"
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(tmp_path / "etcd", ignore_errors=True)


def test_with_jobs_in_etcd_a_running_job_survives_a_coordinator_kill(cluster, tmp_path, etcd):
    # Jobs in etcd (--store), the output and artifacts under --state-dir.
    c, _, state, port = start(cluster, tmp_path, "--store", etcd)
    job = submit(cluster, c, "--np", "4", "--processes-per-host", "2", "--", TRAIN, "200")
    wait_for(lambda: "step 40" in cluster.cli(c, "logs", job).stdout, 30, "training to run")
    c.stop(signal.SIGKILL)
    c2 = cluster.coordinator("--state-dir", str(state), "--store", etcd, port=port)
    done = cluster.wait_state(c2, job, {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"}, 60)
    logs = cluster.cli(c2, "logs", job).stdout
    assert done["state"] == "JOB_STATE_SUCCEEDED", done.get("reason", "") + logs
    assert exact_lines(logs, 4, 200) == {0: 1, 1: 1, 2: 1, 3: 1}, logs
    assert any(e["message"].startswith("resumed after the coordinator restart")
               for e in done["events"]), done["events"]
    # Ids go on from what etcd holds.
    assert submit(cluster, c2, "--np", "1", "--", "true") == "job-000002"


def test_an_etcd_that_does_not_answer_is_refused_at_start_naming_it(cluster):
    c = cluster.coordinator("--store", "etcd://127.0.0.1:1", expect_port=False)
    assert wait_for(lambda: not c.alive(), 20, "the coordinator to exit")
    assert c.p.returncode == 1
    assert c.stderr().strip().startswith(
        "ringmaster-coordinator: --store etcd://127.0.0.1:1: etcd does not answer ("), c.stderr()
