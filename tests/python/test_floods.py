"""Floods against a real ringmaster-coordinator: what one caller sends cannot grow the coordinator
past its bounds (docs/security.md, "Bounds"). Each flood is refused with the exact status and
message once a bound is reached, nothing past it is kept, and the coordinator's resident memory
(VmRSS) stays under a stated budget.

    /usr/bin/python3 -m pytest -q tests/python/test_floods.py
"""
import re
import subprocess
import time

import grpc
import pytest

from test_job_api import COORDINATOR, RPC_TIMEOUT, pb  # noqa: F401 (pb: the stubs fixture)

MAX_ACTIVE = 100
MiB = 1 << 20


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"^VmRSS:\s+(\d+) kB", f.read(), re.M).group(1)) * 1024


@pytest.fixture
def coordinator(tmp_path):
    log = open(tmp_path / "coordinator.log", "wb")
    proc = subprocess.Popen([str(COORDINATOR), "--listen", "127.0.0.1:0",
                             "--max-active-jobs", str(MAX_ACTIVE), "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=log, text=True)
    line = proc.stdout.readline()
    port = int(re.search(r"listening on port (\d+)", line).group(1))
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    grpc.channel_ready_future(channel).result(timeout=10)
    yield proc, channel
    channel.close()
    proc.terminate()
    proc.wait(timeout=15)


def spec(pb, name, env_bytes):
    s = pb.job_pb2.JobSpec(name=name, np=1, command=["true"])
    for i in range(env_bytes // 60000):
        s.env[f"V{i}"] = "x" * 60000
    return s


def test_a_flood_of_jobs_with_large_environments_stops_at_the_active_job_bound(pb, coordinator):
    proc, channel = coordinator
    jobs = pb.job_pb2_grpc.JobServiceStub(channel)
    jobs.ListJobs(pb.job_pb2.ListJobsRequest(), timeout=RPC_TIMEOUT)
    base = rss(proc.pid)
    accepted, refused = [], []
    for i in range(MAX_ACTIVE + 50):  # each spec holds 240,000 bytes of environment
        try:
            r = jobs.RegisterJob(pb.job_pb2.RegisterJobRequest(spec=spec(pb, f"flood-{i}", 240000)),
                                 timeout=RPC_TIMEOUT)
            accepted.append(r.job.id)
        except grpc.RpcError as e:
            refused.append((e.code(), e.details()))
    assert len(accepted) == MAX_ACTIVE
    assert set(refused) == {(grpc.StatusCode.RESOURCE_EXHAUSTED,
                             f"the coordinator holds {MAX_ACTIVE} jobs that have not ended, the most "
                             "it takes (--max-active-jobs): wait for some to end, or cancel some")}
    # 100 jobs x 240 KB = 24 MB of environment, held once (replies are redacted): a budget of 96 MiB.
    grown = rss(proc.pid) - base
    print(f"RSS grew {grown / MiB:.1f} MiB for {MAX_ACTIVE} jobs of 240 KB")
    assert grown < 96 * MiB, f"RSS grew {grown / MiB:.1f} MiB"

    # Every page of the listing is within the client's default 4 MiB limit; values are redacted.
    listed = jobs.ListJobs(pb.job_pb2.ListJobsRequest(), timeout=RPC_TIMEOUT)
    assert len(listed.jobs) == MAX_ACTIVE
    assert set(listed.jobs[0].spec.env.values()) == {"<redacted>"}
    # Cancel says so when it cancels, and the slots come back.
    for job_id in accepted:
        r = jobs.CancelJob(pb.job_pb2.CancelJobRequest(job_id=job_id), timeout=RPC_TIMEOUT)
        assert r.job.state == pb.job_pb2.JOB_STATE_CANCELLED
    r = jobs.RegisterJob(pb.job_pb2.RegisterJobRequest(spec=spec(pb, "after", 0)), timeout=RPC_TIMEOUT)
    assert r.job.id == f"job-{MAX_ACTIVE + 1:06d}"


def test_a_spec_over_its_total_bound_is_refused_naming_it(pb, coordinator):
    proc, channel = coordinator
    jobs = pb.job_pb2_grpc.JobServiceStub(channel)
    with pytest.raises(grpc.RpcError) as e:
        jobs.RegisterJob(pb.job_pb2.RegisterJobRequest(spec=spec(pb, "big", 300000)),
                         timeout=RPC_TIMEOUT)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # 5 values of 60,000 bytes, their names V0..V4, the name "big" and the command "true".
    assert e.value.details() == ("spec holds 300017 bytes of command, env, labels, name and "
                                 "working_dir; at most 262144")


def test_registrations_with_huge_labels_are_refused_and_kept_nowhere(pb, coordinator):
    proc, channel = coordinator
    workers = pb.worker_pb2_grpc.WorkerServiceStub(channel)
    label = "x" * (10 * MiB)
    base = rss(proc.pid)
    for i in range(10):
        request = pb.worker_pb2.RegisterWorkerRequest(host=f"h{i}", device="cpu",
                                                      labels={"zone": label})
        with pytest.raises(grpc.RpcError) as e:
            workers.RegisterWorker(request, timeout=RPC_TIMEOUT)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.details() == "labels['zone'] must be at most 256 bytes; got 10485760"
    time.sleep(0.5)
    grown = rss(proc.pid) - base
    print(f"RSS grew {grown / MiB:.1f} MiB after 10 registrations of 10 MB labels")
    # gRPC keeps a receive buffer or two of the largest message (10 MB): a budget of 64 MiB.
    assert grown < 64 * MiB, f"RSS grew {grown / MiB:.1f} MiB"


def test_an_unknown_method_or_garbage_is_answered_with_what_is_served(pb, coordinator):
    proc, channel = coordinator
    call = channel.unary_unary("/ringmaster.v1.Nope/Do")
    with pytest.raises(grpc.RpcError) as e:
        call(b"\x00garbage", timeout=RPC_TIMEOUT)
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert e.value.details() == (
        "unknown method '/ringmaster.v1.Nope/Do': this is a ringmaster-coordinator, serving "
        "ringmaster.v1.JobService, WorkerService, RendezvousService and ClusterService "
        "(proto/ringmaster/v1)")
    # Bytes that are not a RegisterJobRequest, sent to RegisterJob, register nothing. (gRPC itself
    # answers them, before any handler runs, with UNIMPLEMENTED and no message: not yet ours to
    # word; docs/security.md.)
    register = channel.unary_unary("/ringmaster.v1.JobService/RegisterJob")
    with pytest.raises(grpc.RpcError):
        register(b"\xff\xff\xff\xff", timeout=RPC_TIMEOUT)
    jobs = pb.job_pb2_grpc.JobServiceStub(channel)
    assert len(jobs.ListJobs(pb.job_pb2.ListJobsRequest(), timeout=RPC_TIMEOUT).jobs) == 0
