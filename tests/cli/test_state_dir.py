"""The durable job store (ringmaster-coordinator --state-dir), with real processes on loopback: jobs,
their states, reasons and events survive a kill -9 of the coordinator; job ids are never reused; a
job that was pending is placed after the restart; one that was running goes on running (its daemon
reattaches; tests/cli/test_coordinator_restart.py checks a training job in depth).

Run by ctest (label `cli`) with /usr/bin/python3 -m pytest; helpers from test_first_hour.py."""
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(__file__))
from test_first_hour import Cluster, free_port, submit, wait_for  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    yield c
    c.close()


def test_jobs_survive_a_coordinator_kill_and_ids_are_never_reused(cluster, tmp_path):
    state = tmp_path / "state"
    port = free_port()
    c = cluster.coordinator("--state-dir", str(state), port=port)
    cluster.worker(c, host="h0")
    wait_for(lambda: len(cluster.idle_workers(c)) == 1, 20, "the worker")
    done = submit(cluster, c, "--np", "1", "--name", "first", "--", "true")
    assert cluster.wait_state(c, done, {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"}, 30)["state"] == "JOB_STATE_SUCCEEDED"
    running = submit(cluster, c, "--np", "1", "--", "sleep", "60")
    cluster.wait_state(c, running, {"JOB_STATE_RUNNING"}, 30)
    pending = submit(cluster, c, "--np", "2", "--", "true")  # one worker: it waits
    assert cluster.job(c, pending)["state"] == "JOB_STATE_PENDING"
    assert (done, running, pending) == ("job-000001", "job-000002", "job-000003")

    c.stop(signal.SIGKILL)
    c2 = cluster.coordinator("--state-dir", str(state), port=port)
    first = cluster.job(c2, done)
    assert first["state"] == "JOB_STATE_SUCCEEDED"
    assert first["spec"]["name"] == "first"
    assert first["reason"] == "all 1 ranks exited 0"
    # The running job's daemon kept its process and reattaches: the job runs on.
    was_running = wait_for(lambda: (lambda j: j if any(
        e["message"].startswith("resumed after the coordinator restart") for e in j["events"])
        else None)(cluster.job(c2, running)), 20, "the running job to resume")
    assert was_running["state"] == "JOB_STATE_RUNNING"
    assert was_running["ranks"][0]["state"] == "RANK_STATE_STARTED"
    assert cluster.job(c2, pending)["state"] == "JOB_STATE_PENDING"
    # The counter goes on: no id is used twice (a reused id would wipe the old job's artifacts).
    after = submit(cluster, c2, "--np", "1", "--", "true")
    assert after == "job-000004"
    # The pending job is placed once two workers are free: the old one, once the running job is
    # cancelled, and a new one.
    assert cluster.cli(c2, "cancel", running).returncode == 0
    cluster.worker(c2, host="h1")
    assert cluster.wait_state(c2, pending, {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"}, 60)["state"] == "JOB_STATE_SUCCEEDED"
    assert cluster.wait_state(c2, after, {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"}, 60)["state"] == "JOB_STATE_SUCCEEDED"


def test_a_state_dir_that_cannot_be_created_is_refused_at_start(cluster, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    c = cluster.coordinator("--state-dir", str(blocker / "state"), expect_port=False)
    assert wait_for(lambda: not c.alive(), 20, "the coordinator to exit")
    assert c.p.returncode == 1
    assert c.stderr().strip() == (f"ringmaster-coordinator: --state-dir {blocker}/state: cannot "
                                  "create it: Not a directory")


def modes(root):
    """{path relative to root: mode} of root and everything under it."""
    out = {".": os.stat(root).st_mode & 0o7777}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            out[os.path.relpath(path, root)] = os.lstat(path).st_mode & 0o7777
    return out


def test_secrets_at_rest_are_private_whatever_the_umask_and_a_state_dir_made_before(cluster,
                                                                                   tmp_path):
    """As systemd's StateDirectory= makes it: the directory exists (0755) before the coordinator
    starts, under umask 022, with a file an earlier version left 0644."""
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    os.chmod(state, 0o755)
    (state / "left-by-an-older-version").write_text("x")
    os.chmod(state / "left-by-an-older-version", 0o644)
    old_umask = os.umask(0o022)
    try:
        c = cluster.coordinator("--state-dir", str(state), port=free_port())
        cluster.worker(c, host="h0")
        wait_for(lambda: len(cluster.idle_workers(c)) == 1, 20, "the worker")
        secret = "s3cr3t-AKIA-7f2d9c"
        job = submit(cluster, c, "--np", "1", "--env", f"AWS_SECRET_ACCESS_KEY={secret}",
                     "--timeline", "timeline.json", "--",
                     "sh", "-c", "echo the key is $AWS_SECRET_ACCESS_KEY")
        assert cluster.wait_state(c, job, {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"},
                                  30)["state"] == "JOB_STATE_SUCCEEDED"
    finally:
        os.umask(old_umask)
    found = modes(state)
    # The store, its WAL, the logs' journal and the artifacts are there, and all private.
    assert "jobs.db" in found and "logs" in found and "artifacts" in found, found
    loose = {p: oct(m) for p, m in found.items()
             if (m & 0o077) != 0 or (os.path.isdir(state / p) and m != 0o700)}
    assert loose == {}, loose
    # The secret is somewhere in the state (the job store keeps it to give it to the worker),
    # and nowhere another user may read.
    holders = []
    for p in found:
        path = state / p
        if path.is_file() and secret.encode() in path.read_bytes():
            holders.append(p)
            assert found[p] & 0o077 == 0, (p, oct(found[p]))
    assert holders, "the secret is in no file of the state directory"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand the directory to another user")
def test_a_state_dir_of_another_user_open_to_others_is_refused(cluster, tmp_path):
    state = tmp_path / "foreign"
    state.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chown(state, 65534, 65534)
    os.chmod(state, 0o755)
    c = cluster.coordinator("--state-dir", str(state), expect_port=False)
    assert wait_for(lambda: not c.alive(), 20, "the coordinator to exit")
    assert c.p.returncode == 1
    assert c.stderr().strip() == (
        f"ringmaster-coordinator: --state-dir {state}: it belongs to uid 65534 with mode 755: "
        f"other users could read the jobs' secrets in it, and this coordinator (uid 0) cannot make "
        f"it private. Give it to the coordinator's user (chown), remove others' access (chmod "
        f"o-rwx), or name a directory inside it that the coordinator creates")
