"""ringmaster.jobs, the Python job client, against a real coordinator and worker daemons on
loopback: a job submitted, watched, its logs and artifacts read; errors raised with the
coordinator's code and message; bearer tokens (the `token=` argument and RINGMASTER_TOKEN) and job
ownership; a follower replica's refusal followed to the leader is covered by the chaos suite's
replicas for the CLI and workers.

    PYTHONPATH=build/python /usr/bin/python3 -m pytest -q tests/python/test_jobs_client.py
"""
import os
import re
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "cli"))
from test_first_hour import BIN, Cluster, wait_for  # noqa: E402

from ringmaster.jobs import Client, RingmasterError  # noqa: E402


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    yield c
    c.close()


def test_a_job_submitted_from_python_runs_and_its_logs_and_artifacts_come_back(cluster, tmp_path):
    coordinator = cluster.coordinator()
    for i in range(2):
        cluster.worker(coordinator, host=f"h{i}")
    with Client(coordinator.address) as client:
        wait_for(lambda: len(cluster.idle_workers(coordinator)) == 2, 20, "the workers")
        job = client.submit([str(BIN / "collectives_check")], np=2, processes_per_host=1,
                            name="from-python", timeline="timeline.json", cycle_time_ms=2)
        assert re.fullmatch(r"job-\d{6}", job.id) and job.name == "from-python" and job.np == 2
        assert job.state in ("PENDING", "STARTING", "RUNNING")
        states = [j.state for j in client.watch(job.id)]
        assert states[-1] == "SUCCEEDED", states
        done = client.get(job.id)
        assert done.done and done.reason == "all 2 ranks exited 0"
        # One rank per host (--processes-per-host 1).
        assert sorted((r.rank, r.state, r.exit_code) for r in done.ranks) == [
            (0, "EXITED", 0), (1, "EXITED", 0)]
        assert sorted(r.host for r in done.ranks) == ["h0", "h1"]
        text = "".join(c.text for c in client.logs(job.id) if c.rank == 1)
        assert re.search(r"collectives_check: rank 1: \d+ checks passed, 0 failed", text), text
        assert [j.id for j in client.list()] == [job.id]
        assert [j.id for j in client.list(states=["RUNNING"])] == []
        names = [n for n, size in client.artifacts(job.id) if size > 0]
        assert names == ["timeline.json"], names
        (path,) = client.download(job.id, tmp_path / "out")
        assert open(path).read().lstrip().startswith("[")  # Chrome trace JSON
        # The coordinator's refusals keep its code and message.
        with pytest.raises(RingmasterError) as e:
            client.get("job-999999")
        assert (e.value.code, e.value.message) == ("NOT_FOUND", "job 'job-999999' not found")
        with pytest.raises(RingmasterError) as e:
            client.submit(["true"], np=0)
        assert (e.value.code, e.value.message) == ("INVALID_ARGUMENT",
                                                   "spec.np = 0 is out of bounds [1, 4096]")


def test_an_attached_job_runs_ringmaster_torch_processes_started_by_the_user(cluster, tmp_path):
    """submit(attached=True): the ranks are processes the user starts (as a Kubernetes Indexed
    Job's pods), each naming the job and its index; rank r lands on the worker its process used."""
    coordinator = cluster.coordinator()
    workers = [cluster.worker(coordinator, host=f"h{i}") for i in range(2)]
    script = tmp_path / "train.py"
    script.write_text("import torch, ringmaster.torch as hvd\n"
                      "hvd.init()\n"
                      "total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)\n"
                      "print('rank', hvd.rank(), 'of', hvd.size(), 'sum', total.item(), flush=True)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGMASTER_")}
    env["PYTHONPATH"] = str(BIN.parent / "python")
    env["RINGMASTER_ATTACH_JOB"] = "attached-torch"
    # Started before the job exists: worker h1's process is index 0, h0's index 1.
    procs = [subprocess.Popen([sys.executable, str(script)],
                              env=dict(env, RINGMASTER_SOCKET=workers[1 - index].socket,
                                       JOB_COMPLETION_INDEX=str(index)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for index in range(2)]
    try:
        with Client(coordinator.address) as client:
            wait_for(lambda: len(cluster.idle_workers(coordinator)) == 2, 20, "the workers")
            with pytest.raises(RingmasterError) as e:
                client.submit(["python3", "train.py"], np=2, name="x", attached=True)
            assert e.value.code == "INVALID_ARGUMENT", e.value.message
            job = client.submit([], np=2, name="attached-torch", attached=True)
            states = [j.state for j in client.watch(job.id)]
            assert states[-1] == "SUCCEEDED", states
            done = client.get(job.id)
            assert sorted((r.rank, r.host) for r in done.ranks) == [(0, "h1"), (1, "h0")]
        outputs = [p.communicate(timeout=60)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    for index, out in enumerate(outputs):
        assert procs[index].returncode == 0, out
        assert f"rank {index} of 2 sum 3.0" in out, out


def test_tokens_authenticate_and_each_user_sees_only_their_own_jobs(cluster, tmp_path,
                                                                    monkeypatch):
    tokens = tmp_path / "tokens.csv"
    tokens.write_text('alice-token,alice,1\nbob-token,bob,2\n')
    coordinator = cluster.coordinator("--token-file", str(tokens))
    alice = Client(coordinator.address, token="alice-token")
    job = alice.submit(["true"], np=1)  # no worker: it stays PENDING
    assert job.owner == "alice" and job.state == "PENDING"
    monkeypatch.setenv("RINGMASTER_TOKEN", "bob-token")
    bob = Client(coordinator.address)  # the token from RINGMASTER_TOKEN
    with pytest.raises(RingmasterError) as e:
        bob.get(job.id)
    assert e.value.code == "PERMISSION_DENIED"
    assert job.id in e.value.message and "alice" not in e.value.message
    assert bob.list() == []
    with pytest.raises(RingmasterError) as e:
        bob.cancel(job.id)
    assert e.value.code == "PERMISSION_DENIED"
    assert alice.get(job.id).state == "PENDING"  # bob's cancel changed nothing
    with pytest.raises(RingmasterError) as e:
        Client(coordinator.address, token="wrong").list()
    assert e.value.code == "UNAUTHENTICATED"
    monkeypatch.delenv("RINGMASTER_TOKEN")
    with pytest.raises(RingmasterError) as e:
        Client(coordinator.address).list()
    assert e.value.code == "UNAUTHENTICATED"
    assert alice.cancel(job.id, reason="done with it").state == "CANCELLED"
