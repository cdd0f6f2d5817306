"""Floods against a real ringmaster-coordinator (jobs, labels, rendezvous keys, half-submitted
tensors), and bytes that are no request: what one caller sends cannot grow the coordinator
past its bounds (docs/security.md, "Bounds"). Each flood is refused with the exact status and
message once a bound is reached, nothing past it is kept, and the coordinator's resident memory
(VmRSS) stays under a stated budget.

    /usr/bin/python3 -m pytest -q tests/python/test_floods.py
"""
import queue
import re
import subprocess
import threading
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
    # Bytes that are not a RegisterJobRequest, sent to RegisterJob, register nothing, and the caller
    # is told its input was bad.
    for method in ["/ringmaster.v1.JobService/RegisterJob", "/ringmaster.v1.JobService/WatchJob",
                   "/ringmaster.v1.RendezvousService/Set"]:
        call = (channel.unary_stream if method.endswith("WatchJob") else channel.unary_unary)(method)
        with pytest.raises(grpc.RpcError) as e:
            r = call(b"\xff\xff\xff\xff", timeout=RPC_TIMEOUT)
            if method.endswith("WatchJob"):
                list(r)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, method
        assert e.value.details() == (f"the request to {method} does not parse as that method's "
                                     "request message (proto/ringmaster/v1); nothing was done")
    # The same on a worker's session stream: it ends at once, saying so.
    session = channel.stream_stream("/ringmaster.v1.WorkerService/Session")
    with pytest.raises(grpc.RpcError) as e:
        list(session(iter([b"\xff\xff\xff\xff"]), timeout=RPC_TIMEOUT))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details() == ("a session message does not parse as ringmaster.v1.WorkerMessage; "
                                 "the session ends")
    jobs = pb.job_pb2_grpc.JobServiceStub(channel)
    assert len(jobs.ListJobs(pb.job_pb2.ListJobsRequest(), timeout=RPC_TIMEOUT).jobs) == 0


class Session:
    """A worker's session held from Python: registered, open, heartbeating, its messages read on a
    thread."""

    def __init__(self, pb, channel, host):
        self.pb = pb
        workers = pb.worker_pb2_grpc.WorkerServiceStub(channel)
        r = workers.RegisterWorker(pb.worker_pb2.RegisterWorkerRequest(host=host, device="cpu",
                                                                       incarnation=1),
                                   timeout=RPC_TIMEOUT)
        self.worker_id = r.worker_id
        self.outgoing = queue.Queue()
        self.incoming = queue.Queue()
        self.outgoing.put(pb.worker_pb2.WorkerMessage(open=pb.worker_pb2.SessionOpen(
            worker_id=r.worker_id, incarnation=1, secret=r.session_secret)))
        self.call = workers.Session(iter(self.outgoing.get, None), timeout=120)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        # Heartbeats, as a daemon sends them: without them the worker's lease runs out (10 s).
        self.closed = threading.Event()
        self.beater = threading.Thread(target=self._beat, daemon=True)
        self.beater.start()

    def _beat(self):
        while not self.closed.wait(1.0):
            self.send(heartbeat=self.pb.worker_pb2.Heartbeat())

    def _read(self):
        try:
            for m in self.call:
                self.incoming.put(m)
        except grpc.RpcError:
            pass

    def send(self, **kind):
        self.outgoing.put(self.pb.worker_pb2.WorkerMessage(**kind))

    def next(self, kind, timeout=20):
        """The next message of `kind` (others are dropped)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                m = self.incoming.get(timeout=max(0.01, end - time.monotonic()))
            except queue.Empty:
                break
            if m.WhichOneof("kind") == kind:
                return m
        raise AssertionError(f"no {kind} within {timeout} s")

    def close(self):
        self.closed.set()
        self.outgoing.put(None)
        self.call.cancel()


def start_job(pb, channel, sessions):
    """A job of len(sessions) ranks on those workers; each session's assignment, by rank."""
    jobs = pb.job_pb2_grpc.JobServiceStub(channel)
    jobs.RegisterJob(pb.job_pb2.RegisterJobRequest(
        spec=pb.job_pb2.JobSpec(name="flood", np=len(sessions), command=["true"])),
        timeout=RPC_TIMEOUT)
    assignments = [s.next("assignment").assignment for s in sessions]
    for s, a in zip(sessions, assignments):
        s.send(rank_update=pb.worker_pb2.RankUpdate(job_id=a.job.id, epoch=a.epoch, rank=a.rank,
                                                    state=pb.job_pb2.RANK_STATE_STARTED))
    return assignments


def test_a_flood_of_rendezvous_keys_stops_at_the_epochs_bound(pb, coordinator):
    proc, channel = coordinator
    worker = Session(pb, channel, "h0")
    try:
        (a,) = start_job(pb, channel, [worker])
        rendezvous = pb.rendezvous_pb2_grpc.RendezvousServiceStub(channel)
        token = (("x-ringmaster-rendezvous-token", a.rendezvous_token),)
        base = rss(proc.pid)
        keys, refused = 100000, []
        value = b"v" * 100
        # 256 calls in flight at a time.
        for start in range(0, keys, 256):
            futures = [(i, rendezvous.Set.future(
                pb.rendezvous_pb2.SetRequest(job_id=a.job.id, epoch=a.epoch, key=f"k{i}",
                                             value=value),
                timeout=RPC_TIMEOUT, metadata=token)) for i in range(start, min(keys, start + 256))]
            for i, f in futures:
                try:
                    f.result()
                except grpc.RpcError as e:
                    refused.append((i, e.code(), e.details()))
        time.sleep(0.5)
        grown = rss(proc.pid) - base
        print(f"RSS grew {grown / MiB:.1f} MiB after {keys} rendezvous keys "
              f"({len(refused)} refused)")
        # Exactly the keys past the bound are refused, each saying so.
        assert len(refused) == keys - 65536, refused[:3]
        assert {code for _, code, _ in refused} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
        i, _, details = refused[-1]
        assert details == (f"the rendezvous of {a.job.id}/{a.epoch} holds 65536 keys, the most one "
                           f"job epoch may; key 'k{i}' not set")
        # 65,536 keys of ~100 bytes are kept: a budget of 96 MiB.
        assert grown < 96 * MiB, f"RSS grew {grown / MiB:.1f} MiB"
    finally:
        worker.close()


def test_a_flood_of_half_submitted_tensors_stops_at_the_jobs_bound(pb, coordinator):
    proc, channel = coordinator
    ranks = [Session(pb, channel, "h0"), Session(pb, channel, "h1")]
    try:
        assignments = start_job(pb, channel, ranks)
        rank0 = next(s for s, a in zip(ranks, assignments) if a.rank == 0)
        a = next(a for a in assignments if a.rank == 0)
        base = rss(proc.pid)
        tensors, per_batch = 200000, 5000
        # Rank 0 submits them all; rank 1 none: none is ever ready.
        for start in range(0, tensors, per_batch):
            batch = pb.worker_pb2.RequestBatch(job_id=a.job.id, epoch=a.epoch, rank=0)
            for i in range(start, start + per_batch):
                # common.proto: REQUEST_TYPE_ALLREDUCE = 1, DATA_TYPE_FLOAT32 = 7.
                batch.requests.add(name=f"grad.{i}", type=1, dtype=7, shape=[256])
            rank0.send(requests=batch)
        # Every tensor past the bound comes back as an error to rank 0 alone, naming it.
        errors = []
        end = time.monotonic() + 60
        while len(errors) < tensors - 65536 and time.monotonic() < end:
            m = rank0.next("responses", timeout=max(0.1, end - time.monotonic()))
            errors += [(name, e.error_message) for e in m.responses.rank_errors for name in e.names]
        assert len(errors) == tensors - 65536
        assert errors[0] == ("grad.65536", "Tensor 'grad.65536' was not accepted: 65536 tensors are "
                             "in negotiation in this job, the most one job may (did the other "
                             "ranks submit the tensors rank 0 (h0) submitted?)")
        assert errors[-1][0] == f"grad.{tensors - 1}"
        time.sleep(0.5)
        grown = rss(proc.pid) - base
        print(f"RSS grew {grown / MiB:.1f} MiB after {tensors} half-submitted tensors")
        # 65,536 pending tensors with their metadata: a budget of 128 MiB.
        assert grown < 128 * MiB, f"RSS grew {grown / MiB:.1f} MiB"
    finally:
        for s in ranks:
            s.close()
