"""One user's flood does not starve the cluster (ctest label `chaos`): a coordinator with mutual TLS,
two worker daemons, user 'user' training a 2-rank job (tests/worker/train_loop: every step checked
exactly) while user 'alice' sends 1,000 RegisterJob calls, 16 at a time, each with about 200 KB of
environment and np=4096.

Checked: every one of alice's calls gets an answer that says what happened (OK, or
RESOURCE_EXHAUSTED naming the limit: never UNAVAILABLE for a job that exists), she holds at most
her per-user bound, the training job SUCCEEDED with every step exact and took at most twice as long
as the same job on a quiet coordinator, no worker lost its lease, and the coordinator's resident
memory is back near where it started once alice's jobs are cancelled.

    RINGMASTER_BIN_DIR=build/bin /usr/bin/python3 -m pytest -q tests/chaos/test_flood.py
"""
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from test_job_api import pb  # noqa: E402,F401 (a fixture: the generated stubs)

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("RINGMASTER_BIN_DIR", REPO / "build" / "bin")).resolve()
TRAIN = BIN / "train_loop"
STEPS = 250
FLOOD = 1000
PER_USER = 100
MiB = 1 << 20


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"^VmRSS:\s+(\d+) kB", f.read(), re.M).group(1)) * 1024


def channel(ca, pair, port):
    creds = grpc.ssl_channel_credentials(
        root_certificates=(ca / "ca.crt").read_bytes(),
        private_key=(ca / pair / "tls.key").read_bytes(),
        certificate_chain=(ca / pair / "tls.crt").read_bytes())
    ch = grpc.secure_channel(f"localhost:{port}", creds,
                             options=[("grpc.max_send_message_length", 8 * MiB)])
    grpc.channel_ready_future(ch).result(timeout=10)
    return ch


@pytest.fixture
def cluster(tmp_path):
    ca = tmp_path / "ca"
    subprocess.run(["bash", str(REPO / "scripts" / "dev-ca.sh"), str(ca)], check=True,
                   capture_output=True)
    subprocess.run(["bash", str(REPO / "scripts" / "dev-ca.sh"), str(ca), "--issue", "alice",
                    "--cn", "alice"], check=True, capture_output=True)
    tls = lambda pair: ["--tls-cert", str(ca / pair / "tls.crt"), "--tls-key",  # noqa: E731
                        str(ca / pair / "tls.key"), "--tls-ca", str(ca / "ca.crt")]
    procs = []
    coordinator = subprocess.Popen(
        [str(BIN / "ringmaster-coordinator"), "--listen", "127.0.0.1:0", *tls("coordinator"),
         "--state-dir", str(tmp_path / "state"), "--max-active-jobs-per-user", str(PER_USER),
         "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=open(tmp_path / "coordinator.log", "wb"), text=True)
    procs.append(coordinator)
    port = int(re.search(r"listening on port (\d+)", coordinator.stdout.readline()).group(1))
    env = dict(os.environ, RINGMASTER_TLS_CERT=str(ca / "worker" / "tls.crt"),
               RINGMASTER_TLS_KEY=str(ca / "worker" / "tls.key"),
               RINGMASTER_TLS_CA=str(ca / "ca.crt"))
    for i in range(2):
        procs.append(subprocess.Popen(
            [str(BIN / "ringmaster-worker"), "--coordinator", f"localhost:{port}", "--device",
             "cpu", "--host-name", "h0", "--socket", str(tmp_path / f"w{i}.sock")],
            env=env, stdout=open(tmp_path / f"worker{i}.log", "wb"), stderr=subprocess.STDOUT))
    yield ca, port, coordinator, tmp_path
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()


def train(pb, jobs, name):
    """Runs the training job to its end; (its job, its logs, seconds from RUNNING to the end)."""
    spec = pb.job_pb2.JobSpec(name=name, np=2, command=[str(TRAIN), str(STEPS)])
    job = jobs.RegisterJob(pb.job_pb2.RegisterJobRequest(spec=spec), timeout=10).job
    running = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        job = jobs.GetJob(pb.job_pb2.GetJobRequest(job_id=job.id), timeout=10).job
        state = pb.job_pb2.JobState.Name(job.state)
        if state == "JOB_STATE_RUNNING" and running is None:
            running = time.monotonic()
        if state in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"):
            break
        time.sleep(0.05)
    took = time.monotonic() - (running or deadline)
    logs = "".join(chunk.data.decode() for r in jobs.GetLogs(
        pb.job_pb2.GetLogsRequest(job_id=job.id, all_ranks=True), timeout=20)
        for chunk in r.chunks)
    return job, logs, took


def test_a_flood_from_one_user_leaves_another_users_training_exact_and_on_time(pb, cluster):
    ca, port, coordinator, tmp = cluster
    user_jobs = pb.job_pb2_grpc.JobServiceStub(channel(ca, "user", port))
    admin = pb.cluster_pb2_grpc.ClusterServiceStub(channel(ca, "admin", port))
    deadline = time.monotonic() + 20
    while len(admin.ListWorkers(pb.cluster_pb2.ListWorkersRequest(), timeout=10).workers) < 2:
        assert time.monotonic() < deadline, "the workers did not register"
        time.sleep(0.1)

    job, logs, quiet = train(pb, user_jobs, "quiet")
    assert pb.job_pb2.JobState.Name(job.state) == "JOB_STATE_SUCCEEDED", job.reason
    base = rss(coordinator.pid)

    alice = pb.job_pb2_grpc.JobServiceStub(channel(ca, "alice", port))
    answers, registered = {}, []
    lock = threading.Lock()

    def flood(worker):
        for i in range(worker, FLOOD, 16):
            spec = pb.job_pb2.JobSpec(name=f"flood-{i}", np=4096, command=["true"])
            for k in range(3):
                spec.env[f"V{k}"] = "x" * 65000
            try:
                r = alice.RegisterJob(pb.job_pb2.RegisterJobRequest(spec=spec), timeout=30)
                outcome = "OK"
                with lock:
                    registered.append(r.job.id)
            except grpc.RpcError as e:
                outcome = e.code().name
                if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    outcome += ": " + re.sub(r"\d+", "N", e.details())
            with lock:
                answers[outcome] = answers.get(outcome, 0) + 1

    result = {}
    trainer = threading.Thread(target=lambda: result.update(
        zip(("job", "logs", "took"), train(pb, user_jobs, "during-the-flood"))))
    trainer.start()
    time.sleep(1.0)  # the training job is placed and running
    flooders = [threading.Thread(target=flood, args=(w,)) for w in range(16)]
    began = time.monotonic()
    for t in flooders:
        t.start()
    for t in flooders:
        t.join(timeout=300)
    flood_took = time.monotonic() - began
    trainer.join(timeout=180)
    print(f"quiet {quiet:.1f}s, during the flood {result.get('took', -1):.1f}s; flood "
          f"{flood_took:.1f}s: {answers}")

    # Every call was answered, and says what happened: no job exists that its client was told
    # failed.
    assert sum(answers.values()) == FLOOD, answers
    assert set(answers) <= {
        "OK",
        "RESOURCE_EXHAUSTED: user 'alice' holds N jobs that have not ended, the most one user may "
        "(--max-active-jobs-per-user): wait for some to end, or cancel some",
        "RESOURCE_EXHAUSTED: user 'alice' registered N jobs in the last minute, the most one user "
        "may (--max-registrations-per-minute): retry in Ns",
        "RESOURCE_EXHAUSTED: the coordinator has N registrations waiting to be stored: retry in a "
        "moment"}, answers
    assert answers.get("OK", 0) == len(registered) <= PER_USER, answers
    listed = alice.ListJobs(pb.job_pb2.ListJobsRequest(), timeout=30).jobs
    assert sorted(j.id for j in listed) == sorted(registered)

    # The other user's training: exact, on time, no worker lost.
    job = result["job"]
    assert pb.job_pb2.JobState.Name(job.state) == "JOB_STATE_SUCCEEDED", job.reason
    for rank in (0, 1):
        assert f"rank {rank}: {STEPS} steps, every result exact" in result["logs"], result["logs"]
    assert result["took"] <= 2 * quiet + 1.0, (quiet, result["took"])
    workers = admin.ListWorkers(pb.cluster_pb2.ListWorkersRequest(), timeout=10).workers
    assert len(workers) == 2 and all(
        pb.cluster_pb2.WorkerState.Name(w.state) != "WORKER_STATE_LOST" for w in workers), workers
    assert not any("lost" in e.message for e in job.events), [e.message for e in job.events]

    # Cancelled, alice's jobs give their memory back.
    for job_id in registered:
        alice.CancelJob(pb.job_pb2.CancelJobRequest(job_id=job_id), timeout=30)
    time.sleep(6)  # the coordinator trims freed memory every 5 s
    grown = rss(coordinator.pid) - base
    print(f"coordinator RSS {base / MiB:.0f} MiB before the flood, +{grown / MiB:.0f} MiB after")
    assert grown < 48 * MiB, f"RSS still {grown / MiB:.0f} MiB above its start"
