"""End-to-end test of the coordinator's JobService from Python.

Proves the ringmaster.v1 API is usable from another language: the Python stubs are generated at test
time from proto/ringmaster/v1/*.proto with grpc_tools.protoc into a pytest temporary directory (no
generated code is committed), a real ringmaster-coordinator is started on an ephemeral port, and the
job API is exercised over gRPC.

Uses only Debian packages: python3-grpcio, python3-protobuf, python3-grpc-tools, python3-pytest.

    /usr/bin/python3 -m pytest -q tests/python/test_job_api.py

The coordinator binary is looked up in $RINGMASTER_BIN_DIR (default: <repo>/build/bin).

The tests share one coordinator and run in file order: test 1 registers "py-job", test 2 lists it
before test 3 cancels it.
"""

import importlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import grpc_tools
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO_ROOT / "proto"
BIN_DIR = Path(os.environ.get("RINGMASTER_BIN_DIR", str(REPO_ROOT / "build" / "bin")))
COORDINATOR = BIN_DIR / "ringmaster-coordinator"

RPC_TIMEOUT = 10  # seconds, for every unary RPC
STARTUP_TIMEOUT = 20  # seconds to wait for the "listening on port N" line
SHUTDOWN_TIMEOUT = 10  # seconds for a graceful exit after SIGTERM

LISTENING_RE = re.compile(r"ringmaster-coordinator listening on port (\d+)")
JOB_ID_RE = re.compile(r"^job-\d{6}$")


# --------------------------------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------------------------------


# proto3 `optional` needs protoc >= 3.12 (3.12-3.14 behind a flag). Debian 12's python3-grpc-tools
# (1.14.1) bundles libprotoc 3.5.1, which rejects the label. `optional T x = N;` is defined as sugar for a
# one-field oneof named "_x" (the "synthetic oneof"): same wire format, same HasField() presence. Where
# grpc_tools.protoc cannot compile the protos as they are, they are compiled from a copy with that
# rewrite applied.
OPTIONAL_FIELD_RE = re.compile(
    r"^(?P<indent>[ \t]*)optional\s+(?P<type>[\w.]+)\s+(?P<name>\w+)\s*=\s*(?P<number>\d+)\s*(?P<options>\[[^\]]*\])?\s*;",
    re.MULTILINE,
)


def desugar_proto3_optional(text):
    return OPTIONAL_FIELD_RE.sub(
        lambda m: "{indent}oneof _{name} {{ {type} {name} = {number}{options}; }}".format(
            indent=m["indent"],
            name=m["name"],
            type=m["type"],
            number=m["number"],
            options=" " + m["options"] if m["options"] else "",
        ),
        text,
    )


def run_protoc(proto_root, protos, out_dir):
    args = [sys.executable, "-m", "grpc_tools.protoc", f"-I{proto_root}"]
    # Well-known types (google/protobuf/*.proto), in case a proto ever imports one.
    wkt = Path(grpc_tools.__file__).parent / "_proto"
    if wkt.is_dir():
        args.append(f"-I{wkt}")
    args += [f"--python_out={out_dir}", f"--grpc_python_out={out_dir}", *protos]
    result = subprocess.run(args, cwd=proto_root, capture_output=True, text=True, timeout=60)
    return result.returncode, f"{' '.join(args)}\n{result.stdout}{result.stderr}"


@pytest.fixture(scope="module")
def pb(tmp_path_factory):
    """Generates the Python stubs into a temporary directory and imports them.

    Returns a namespace with job_pb2 and job_pb2_grpc.
    """
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / "ringmaster" / "v1").glob("*.proto"))
    assert protos, f"no .proto files under {PROTO_ROOT / 'ringmaster' / 'v1'}"

    out_dir = tmp_path_factory.mktemp("ringmaster_stubs")
    rc, log = run_protoc(PROTO_ROOT, protos, out_dir)
    if rc != 0 and "Explicit 'optional' labels are disallowed in the Proto3 syntax" in log:
        # Old bundled protoc (see desugar_proto3_optional): compile a desugared copy instead.
        desugared_root = tmp_path_factory.mktemp("ringmaster_protos_desugared")
        for rel in protos:
            dst = desugared_root / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_text(desugar_proto3_optional((PROTO_ROOT / rel).read_text()))
        out_dir = tmp_path_factory.mktemp("ringmaster_stubs_desugared")
        rc, log = run_protoc(desugared_root, protos, out_dir)
    assert rc == 0, f"grpc_tools.protoc failed (rc={rc}):\n{log}"

    # The generated modules import each other as ringmaster.v1.<name>_pb2; make the directory tree
    # importable as regular packages.
    for pkg in (out_dir / "ringmaster", out_dir / "ringmaster" / "v1"):
        (pkg / "__init__.py").touch()

    sys.path.insert(0, str(out_dir))
    try:
        importlib.invalidate_caches()
        job_pb2 = importlib.import_module("ringmaster.v1.job_pb2")
        job_pb2_grpc = importlib.import_module("ringmaster.v1.job_pb2_grpc")
        worker_pb2 = importlib.import_module("ringmaster.v1.worker_pb2")
        worker_pb2_grpc = importlib.import_module("ringmaster.v1.worker_pb2_grpc")
        rendezvous_pb2 = importlib.import_module("ringmaster.v1.rendezvous_pb2")
        rendezvous_pb2_grpc = importlib.import_module("ringmaster.v1.rendezvous_pb2_grpc")
        cluster_pb2 = importlib.import_module("ringmaster.v1.cluster_pb2")
        cluster_pb2_grpc = importlib.import_module("ringmaster.v1.cluster_pb2_grpc")
    finally:
        sys.path.remove(str(out_dir))

    class Stubs:
        pass

    stubs = Stubs()
    stubs.job_pb2 = job_pb2
    stubs.job_pb2_grpc = job_pb2_grpc
    stubs.worker_pb2 = worker_pb2  # for tests/python/test_floods.py
    stubs.worker_pb2_grpc = worker_pb2_grpc
    stubs.rendezvous_pb2 = rendezvous_pb2
    stubs.rendezvous_pb2_grpc = rendezvous_pb2_grpc
    stubs.cluster_pb2 = cluster_pb2  # for tests/chaos/test_flood.py
    stubs.cluster_pb2_grpc = cluster_pb2_grpc
    yield stubs

    for name in [m for m in sys.modules if m == "ringmaster" or m.startswith("ringmaster.")]:
        del sys.modules[name]


@pytest.fixture(scope="module")
def coordinator_port(tmp_path_factory):
    """Starts ringmaster-coordinator on port 0; yields the port; stops it with SIGTERM."""
    assert COORDINATOR.is_file() and os.access(COORDINATOR, os.X_OK), (
        f"coordinator binary not found or not executable: {COORDINATOR} "
        f"(set RINGMASTER_BIN_DIR to the directory holding ringmaster-coordinator)"
    )
    log_dir = tmp_path_factory.mktemp("coordinator")
    stderr_path = log_dir / "stderr.log"
    stderr_file = open(stderr_path, "wb")

    proc = subprocess.Popen(
        [str(COORDINATOR), "--listen", "127.0.0.1:0"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=stderr_file,
        text=True,
        bufsize=1,
    )

    # A reader thread drains stdout for the whole life of the process (so a full pipe can never block
    # the coordinator) and hands each line to the test through a queue.
    lines = queue.Queue()
    stdout_seen = []

    def drain():
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)  # EOF

    reader = threading.Thread(target=drain, name="coordinator-stdout", daemon=True)
    reader.start()

    def diagnostics():
        stderr_file.flush()
        return (
            f"\n--- coordinator stdout ---\n{''.join(stdout_seen)}"
            f"\n--- coordinator stderr ({stderr_path}) ---\n{stderr_path.read_text(errors='replace')}"
        )

    def kill():
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=SHUTDOWN_TIMEOUT)

    port = None
    deadline = time.monotonic() + STARTUP_TIMEOUT
    try:
        while port is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                pytest.fail(f"coordinator printed no 'listening on port N' line within {STARTUP_TIMEOUT} s" + diagnostics())
            try:
                line = lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                try:
                    rc = proc.wait(timeout=SHUTDOWN_TIMEOUT)
                except subprocess.TimeoutExpired:
                    rc = "still running"
                pytest.fail(f"coordinator closed stdout before it was listening (exit status {rc})" + diagnostics())
            stdout_seen.append(line)
            match = LISTENING_RE.search(line)
            if match:
                port = int(match.group(1))
        assert 0 < port < 65536, f"bad port {port}" + diagnostics()
    except BaseException:
        kill()
        stderr_file.close()
        raise

    try:
        yield port
    finally:
        try:
            if proc.poll() is not None:
                pytest.fail(f"coordinator died during the tests (exit status {proc.returncode})" + diagnostics())
            proc.send_signal(signal.SIGTERM)
            try:
                rc = proc.wait(timeout=SHUTDOWN_TIMEOUT)
            except subprocess.TimeoutExpired:
                pytest.fail(f"coordinator did not exit within {SHUTDOWN_TIMEOUT} s of SIGTERM" + diagnostics())
            assert rc == 0, f"coordinator exited with status {rc} after SIGTERM, expected 0" + diagnostics()
        finally:
            kill()
            reader.join(timeout=SHUTDOWN_TIMEOUT)
            stderr_file.close()


@pytest.fixture(scope="module")
def stub(pb, coordinator_port):
    # No HTTP proxy: the coordinator is on loopback, whatever *_proxy variables the environment sets.
    channel = grpc.insecure_channel(f"127.0.0.1:{coordinator_port}", options=[("grpc.enable_http_proxy", 0)])
    try:
        grpc.channel_ready_future(channel).result(timeout=RPC_TIMEOUT)
    except grpc.FutureTimeoutError:
        channel.close()
        pytest.fail(f"could not connect to the coordinator on 127.0.0.1:{coordinator_port} within {RPC_TIMEOUT} s")
    try:
        yield pb.job_pb2_grpc.JobServiceStub(channel)
    finally:
        # Closed before the coordinator fixture sends SIGTERM (the fixture was set up after it).
        channel.close()


def py_job_spec(pb, name="py-job"):
    spec = pb.job_pb2.JobSpec(
        name=name,
        np=2,
        processes_per_host=1,
        command=["python3", "train.py"],
        env={"A": "1"},
    )
    spec.knobs.cycle_time_ms = 5
    return spec


@pytest.fixture(scope="module")
def py_job(pb, stub):
    """The "py-job" registered once for tests 1-3: the Job returned by RegisterJob."""
    response = stub.RegisterJob(pb.job_pb2.RegisterJobRequest(spec=py_job_spec(pb)), timeout=RPC_TIMEOUT)
    assert response.HasField("job"), f"RegisterJob returned no job: {response}"
    return response.job


def list_jobs(pb, stub, states=()):
    return list(stub.ListJobs(pb.job_pb2.ListJobsRequest(states=list(states)), timeout=RPC_TIMEOUT).jobs)


def expect_rpc_error(call, code, details):
    with pytest.raises(grpc.RpcError) as excinfo:
        call()
    err = excinfo.value
    assert err.code() == code, f"expected {code}, got {err.code()}: {err.details()!r}"
    assert err.details() == details


# --------------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------------


def test_register_job_fills_defaults(pb, py_job):
    job_pb2 = pb.job_pb2
    job = py_job

    assert JOB_ID_RE.match(job.id), f"job id {job.id!r} does not match {JOB_ID_RE.pattern}"
    assert job.state == job_pb2.JOB_STATE_PENDING, job_pb2.JobState.Name(job.state)
    assert job.reason == ""
    assert len(job.ranks) == 0  # PENDING: no placement yet

    spec = job.spec
    assert spec.name == "py-job"
    assert spec.np == 2
    assert spec.processes_per_host == 1
    assert list(spec.command) == ["python3", "train.py"]
    # Values are secrets: a reply names the variables and redacts their values (docs/security.md).
    assert dict(spec.env) == {"A": "<redacted>"}

    knobs = spec.knobs
    for field in (
        "fusion_threshold_bytes",
        "cycle_time_ms",
        "cache_capacity",
        "autotune_warmup_samples",
        "autotune_steps_per_sample",
        "autotune_bayes_opt_max_samples",
        "autotune_gaussian_process_noise",
        "stall_check_seconds",
    ):
        assert knobs.HasField(field), f"knobs.{field} was not filled in"
    assert knobs.cycle_time_ms == 5
    assert knobs.fusion_threshold_bytes == 134217728
    assert knobs.cache_capacity == 1024
    assert knobs.stall_check_seconds == 60
    assert knobs.autotune_warmup_samples == 3
    assert knobs.autotune_steps_per_sample == 10
    assert knobs.autotune_bayes_opt_max_samples == 20
    assert knobs.autotune_gaussian_process_noise == 0.8
    assert knobs.autotune is False

    # No worker is registered: the job says why it waits.
    assert [e.message for e in job.events] == [
        "registered: 2 ranks",
        "waiting: needs 2 idle cpu slots (at most 1 per host); 0 registered, 0 idle"]
    assert job.waiting_reason == "needs 2 idle cpu slots (at most 1 per host); 0 registered, 0 idle"
    assert job.events[0].state == job_pb2.JOB_STATE_PENDING


def test_list_jobs(pb, stub, py_job):
    job_pb2 = pb.job_pb2

    all_ids = [j.id for j in list_jobs(pb, stub)]
    assert py_job.id in all_ids

    listed = next(j for j in list_jobs(pb, stub) if j.id == py_job.id)
    assert listed.spec.name == "py-job"
    assert listed.state == job_pb2.JOB_STATE_PENDING

    pending_ids = [j.id for j in list_jobs(pb, stub, [job_pb2.JOB_STATE_PENDING])]
    assert py_job.id in pending_ids

    cancelled_ids = [j.id for j in list_jobs(pb, stub, [job_pb2.JOB_STATE_CANCELLED])]
    assert py_job.id not in cancelled_ids


def test_cancel_job(pb, stub, py_job):
    job_pb2 = pb.job_pb2

    cancelled = stub.CancelJob(job_pb2.CancelJobRequest(job_id=py_job.id, reason="from python"), timeout=RPC_TIMEOUT).job
    assert cancelled.id == py_job.id
    assert cancelled.state == job_pb2.JOB_STATE_CANCELLED, job_pb2.JobState.Name(cancelled.state)
    assert cancelled.reason == "cancelled: from python"

    got = stub.GetJob(job_pb2.GetJobRequest(job_id=py_job.id), timeout=RPC_TIMEOUT).job
    assert got.id == py_job.id
    assert got.state == job_pb2.JOB_STATE_CANCELLED, job_pb2.JobState.Name(got.state)
    assert got.reason == "cancelled: from python"

    cancelled_ids = [j.id for j in list_jobs(pb, stub, [job_pb2.JOB_STATE_CANCELLED])]
    assert py_job.id in cancelled_ids
    pending_ids = [j.id for j in list_jobs(pb, stub, [job_pb2.JOB_STATE_PENDING])]
    assert py_job.id not in pending_ids

    expect_rpc_error(
        lambda: stub.CancelJob(job_pb2.CancelJobRequest(job_id=py_job.id, reason="again"), timeout=RPC_TIMEOUT),
        grpc.StatusCode.FAILED_PRECONDITION,
        f"job {py_job.id} is CANCELLED; it cannot become CANCELLED",
    )


def test_bad_input(pb, stub):
    job_pb2 = pb.job_pb2
    count_before = len(list_jobs(pb, stub))

    spec = py_job_spec(pb, name="py-bad-np")
    spec.np = 0
    spec.processes_per_host = 0
    expect_rpc_error(
        lambda: stub.RegisterJob(job_pb2.RegisterJobRequest(spec=spec), timeout=RPC_TIMEOUT),
        grpc.StatusCode.INVALID_ARGUMENT,
        "spec.np = 0 is out of bounds [1, 4096]",
    )

    unnamed = py_job_spec(pb, name="")
    expect_rpc_error(
        lambda: stub.RegisterJob(job_pb2.RegisterJobRequest(spec=unnamed), timeout=RPC_TIMEOUT),
        grpc.StatusCode.INVALID_ARGUMENT,
        "spec.name must be 1..128 bytes; got 0",
    )

    expect_rpc_error(
        lambda: stub.GetJob(job_pb2.GetJobRequest(job_id="job-999999"), timeout=RPC_TIMEOUT),
        grpc.StatusCode.NOT_FOUND,
        "job 'job-999999' not found",
    )

    assert len(list_jobs(pb, stub)) == count_before


def test_watch_job_until_cancelled(pb, stub):
    job_pb2 = pb.job_pb2
    job = stub.RegisterJob(job_pb2.RegisterJobRequest(spec=py_job_spec(pb, name="py-watch")), timeout=RPC_TIMEOUT).job
    assert job.state == job_pb2.JOB_STATE_PENDING

    # The deadline bounds the whole stream: if it never ends, iteration raises DEADLINE_EXCEEDED.
    stream = stub.WatchJob(job_pb2.WatchJobRequest(job_id=job.id), timeout=RPC_TIMEOUT)
    try:
        first = next(stream)
        assert first.job.id == job.id
        assert first.job.state == job_pb2.JOB_STATE_PENDING, job_pb2.JobState.Name(first.job.state)
        assert not first.HasField("event"), f"first message has an event: {first.event}"

        stub.CancelJob(job_pb2.CancelJobRequest(job_id=job.id, reason="watched"), timeout=RPC_TIMEOUT)

        try:
            rest = list(stream)  # returns only once the server ends the stream
        except grpc.RpcError as err:
            pytest.fail(f"WatchJob stream did not end by itself: {err.code()}: {err.details()!r}")
    finally:
        stream.cancel()  # no-op once the stream has ended

    assert stream.code() == grpc.StatusCode.OK, f"{stream.code()}: {stream.details()!r}"
    assert rest, "no message after the first one"
    assert all(m.HasField("event") for m in rest)
    cancelled = [m for m in rest if m.event.state == job_pb2.JOB_STATE_CANCELLED]
    assert cancelled, f"no CANCELLED event in {[job_pb2.JobState.Name(m.event.state) for m in rest]}"
    assert cancelled[-1].job.state == job_pb2.JOB_STATE_CANCELLED
    assert cancelled[-1].job.reason == "cancelled: watched"
    assert rest[-1].job.state == job_pb2.JOB_STATE_CANCELLED
