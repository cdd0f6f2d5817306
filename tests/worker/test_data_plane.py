"""The CPU data plane end to end, with real processes on loopback: a coordinator, worker daemons on
two simulated hosts, and training programs (tests/worker/*.cc) that use the C++ client.

Run by ctest (label `multiprocess`) as: /usr/bin/python3 -m pytest tests/worker/test_data_plane.py
with RINGMASTER_BIN_DIR pointing at build/bin. Every wait has a deadline; the fixtures kill whatever
they started.
"""
import json
import os
import re
import signal
import subprocess
import time

import pytest

BIN = os.environ.get(
    "RINGMASTER_BIN_DIR",
    os.path.join(os.path.dirname(__file__), "..", "..", "build", "bin"))


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class Cluster:
    """A coordinator and `workers` daemons; worker i is on host h{i // per_host}. With `gpus`, worker
    i serves cuda:{i % per_host} (over the fake CUDA runtime, tests/fake_cuda, when `env` says so)."""

    def __init__(self, tmp_path, workers, per_host, gpus=False, env=None):
        self.tmp = tmp_path
        self.procs = []
        self.gpus = gpus
        self.per_host = per_host
        self.env = env
        log = open(tmp_path / "coordinator.log", "w")
        self.coordinator = subprocess.Popen(
            [f"{BIN}/ringmaster-coordinator", "--listen", "127.0.0.1:0", "--log-level", "info"],
            stdout=subprocess.PIPE, stderr=log, text=True)
        line = self.coordinator.stdout.readline()
        m = re.match(r"ringmaster-coordinator listening on port (\d+)", line)
        assert m, f"coordinator did not start: {line!r}"
        self.address = f"127.0.0.1:{m.group(1)}"
        self.workers = []
        for i in range(workers):
            self.workers.append(self.start_worker(f"h{i // per_host}", i))
        wait_for(lambda: self.connected_workers() >= workers, 10, "workers to connect")

    def start_worker(self, host, index):
        log = open(self.tmp / f"worker{index}.log", "w")
        device = ["--device", f"cuda:{index % self.per_host}"] if self.gpus else []
        return subprocess.Popen(
            [f"{BIN}/ringmaster-worker", "--coordinator", self.address, "--host-name", host,
             "--socket", str(self.tmp / f"w{index}.sock"), "--arena-mb", "64", "--log-level", "info",
             *device],
            stdout=log, stderr=subprocess.STDOUT, env=self.env)

    def connected_workers(self):
        with open(self.tmp / "coordinator.log") as f:
            return f.read().count(" connected")

    def cli(self, *args, check=True):
        r = subprocess.run([f"{BIN}/ringmaster", "--coordinator", self.address, *args],
                           capture_output=True, text=True, timeout=30)
        if check:
            assert r.returncode == 0, r.stderr
        return r

    def submit(self, np, *command, extra=()):
        out = self.cli("--json", "submit", "--np", str(np), *extra, "--", *command).stdout
        return json.loads(out)["id"]

    def job(self, job_id):
        return json.loads(self.cli("--json", "status", job_id).stdout)

    def wait_state(self, job_id, states, timeout):
        return wait_for(lambda: (j := self.job(job_id))["state"] in states and j, timeout,
                        f"{job_id} to reach {states}")

    def logs(self, job_id):
        return self.cli("logs", job_id).stdout

    def close(self):
        for p in self.workers + [self.coordinator]:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.workers + [self.coordinator]:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def pids_of(name, tmp):
    """Processes running `name` that this test's daemons started (their RINGMASTER_SOCKET lies in
    `tmp`): other tests running meanwhile use the same binaries."""
    r = subprocess.run(["pgrep", "-f", name], capture_output=True, text=True)
    mine = []
    for pid in (int(p) for p in r.stdout.split()):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue  # gone meanwhile
        if any(e.startswith(b"RINGMASTER_SOCKET=" + str(tmp).encode()) for e in env):
            mine.append(pid)
    return mine


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path, workers=4, per_host=2)
    yield c
    c.close()
    assert not pids_of(f"{BIN}/train_loop", tmp_path), "a training process outlived the test"


@pytest.mark.parametrize("np_", [2, 4])
@pytest.mark.parametrize("fusion", ["default", "off"])
def test_every_collective_and_dtype_matches_the_exact_reference(cluster, np_, fusion):
    extra = ["--processes-per-host", "2"] + (["--fusion-threshold-bytes", "0"] if fusion == "off" else [])
    job = cluster.submit(np_, f"{BIN}/collectives_check", extra=extra)
    done = cluster.wait_state(job, {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"}, 120)
    logs = cluster.logs(job)
    assert done["state"] == "JOB_STATE_SUCCEEDED", logs + done.get("reason", "")
    for rank in range(np_):
        assert re.search(rf"^\[{rank}\] collectives_check: rank {rank}: \d+ checks passed, 0 failed$",
                         logs, re.M), logs
    assert "FAIL" not in logs
    # Its loop of small allreduces: on one host (np 2) the daemons negotiated the cached ones among
    # themselves, every rank the same number (the coordinator saw the rest); across hosts, none.
    cluster.close()
    daemons = "".join((cluster.tmp / f"worker{i}.log").read_text() for i in range(4))
    local = re.findall(rf"job {job} rank (\d+) \(h\d\): (\d+) allreduces negotiated locally",
                       daemons)
    if np_ == 2:
        assert sorted(r for r, _ in local) == ["0", "1"], daemons
        assert local[0][1] == local[1][1] and int(local[0][1]) >= 250, local
    else:
        assert local == [], local


def test_without_local_negotiation_the_coordinator_negotiates_every_collective(cluster):
    job = cluster.submit(2, f"{BIN}/collectives_check",
                         extra=["--processes-per-host", "2", "--no-local-negotiation"])
    done = cluster.wait_state(job, {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"}, 120)
    logs = cluster.logs(job)
    assert done["state"] == "JOB_STATE_SUCCEEDED", logs + done.get("reason", "")
    assert len(re.findall(r"collectives_check: rank \d: \d+ checks passed, 0 failed$", logs, re.M)) == 2
    cluster.close()
    daemons = "".join((cluster.tmp / f"worker{i}.log").read_text() for i in range(4))
    assert f"job {job} rank 0 of 2: starting" in daemons  # these are the daemons that served it
    assert "negotiated locally" not in daemons, daemons


def check_collectives_then_read_worker_logs(cluster, extra):
    """Runs collectives_check on 4 ranks with `extra` flags, asserts every check of every rank
    passed, closes the cluster (the daemons log what they relayed as the job's rank goes) and
    returns the job and the four daemons' logs."""
    job = cluster.submit(4, f"{BIN}/collectives_check", extra=extra)
    done = cluster.wait_state(job, {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"}, 120)
    logs = cluster.logs(job)
    assert done["state"] == "JOB_STATE_SUCCEEDED", logs + done.get("reason", "")
    for rank in range(4):
        assert re.search(rf"^\[{rank}\] collectives_check: rank {rank}: \d+ checks passed, 0 failed$",
                         logs, re.M), logs
    cluster.close()
    return job, "".join((cluster.tmp / f"worker{i}.log").read_text() for i in range(4))


def test_through_a_negotiation_relay_every_collective_is_exact_with_a_message_per_host(cluster):
    """--negotiation-relay: on each host the daemon of the lower rank sends both ranks' request
    batches to the coordinator in one message and hands out the lists that come back."""
    job, worker_logs = check_collectives_then_read_worker_logs(
        cluster, ["--processes-per-host", "2", "--negotiation-relay"])
    relays = re.findall(rf"job {job} rank (\d): relays the negotiation of 2 ranks of its host",
                        worker_logs)
    assert sorted(relays) == ["0", "2"], worker_logs[-3000:]
    peers = re.findall(rf"job {job} relay rank \d: rank (\d) negotiates through this daemon",
                       worker_logs)
    assert sorted(peers) == ["1", "3"], worker_logs[-3000:]
    # Messages carried both ranks' batches (those that came within a cycle time of each other).
    relayed = re.findall(rf"job {job} relay rank \d: relayed (\d+) request batches of its "
                         r"ranks in (\d+) messages", worker_logs)
    assert len(relayed) == 2, worker_logs[-3000:]
    for batches, messages in relayed:
        assert int(batches) >= 10 and int(messages) < int(batches), (batches, messages)


def test_one_relay_for_two_hosts_carries_all_four_ranks_over_tcp(cluster):
    """--negotiation-relay-hosts 2 (which turns the relay on): the two (named) hosts share one
    relay, rank 0's daemon, which listens with TCP on its data plane address; the other three ranks
    link to it there."""
    job, worker_logs = check_collectives_then_read_worker_logs(
        cluster, ["--processes-per-host", "2", "--negotiation-relay-hosts", "2"])
    relays = re.findall(rf"job {job} rank (\d): relays the negotiation of (\d) ranks of its "
                        r"(hosts, at tcp:127\.0\.0\.1:\d+|host)", worker_logs)
    assert [r[:2] for r in relays] == [("0", "4")], worker_logs[-3000:]
    peers = re.findall(rf"job {job} relay rank 0: rank (\d) negotiates through this daemon",
                       worker_logs)
    assert sorted(peers) == ["1", "2", "3"], worker_logs[-3000:]
    relayed = re.findall(rf"job {job} relay rank 0: relayed (\d+) request batches of its "
                         r"ranks in (\d+) messages", worker_logs)
    assert len(relayed) == 1 and int(relayed[0][1]) < int(relayed[0][0]), relayed


@pytest.mark.parametrize("every,relay", [(5, False), (11, False), (7, True)])
def test_session_resets_lose_nothing_and_the_job_finishes_with_exact_results(tmp_path, every,
                                                                             relay):
    """Every `every`-th message a worker sends the coordinator is dropped as if lost in flight and
    its session cut (RINGMASTER_FAULT_DROP_SESSION): request batches, response lists and rank
    updates go again over the next session, so the job succeeds with every check exact. Through a
    negotiation relay, a relay's cut session makes its host's other rank resume on its own."""
    env = {**os.environ, "RINGMASTER_FAULT_DROP_SESSION": str(every)}
    cluster = Cluster(tmp_path, workers=4, per_host=2, env=env)
    try:
        # Twice in a row (two processes per rank, one after the other): drops fall mid-job.
        check = f"{BIN}/collectives_check"
        job = cluster.submit(4, "sh", "-c", f"{check} && {check}",
                             extra=["--processes-per-host", "2"] +
                             (["--negotiation-relay"] if relay else []))
        done = cluster.wait_state(job, {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"}, 120)
        logs = cluster.logs(job)
        # Every rank exits 0 only if every check of both runs was exact.
        assert done["state"] == "JOB_STATE_SUCCEEDED", logs + done.get("reason", "")
        # The output too arrives once each: re-sent after a reconnect, stored once.
        for rank in range(4):
            lines = re.findall(rf"^\[{rank}\] collectives_check: rank {rank}: \d+ checks passed, "
                               r"0 failed$", logs, re.M)
            assert len(lines) == 2, logs
        worker_logs = "".join((tmp_path / f"worker{i}.log").read_text() for i in range(4))
        drops = len(re.findall(r"fault injection: message \d+ to the coordinator dropped",
                               worker_logs))
        resumes = len(re.findall(r"session resumed; re-sending \d+ request batches", worker_logs))
        assert drops >= 2, worker_logs[-3000:]
        assert resumes >= 1, worker_logs[-3000:]
    finally:
        cluster.close()


def kill_a_training_process(cluster, rank, host):
    """Runs 4 ranks of train_loop, kills rank `rank`'s process (on `host`) once training runs, and
    checks the job fails within 10 s naming it, with every other rank stopped."""
    job = cluster.submit(4, f"{BIN}/train_loop", extra=["--processes-per-host", "2"])
    wait_for(lambda: cluster.logs(job).count("ready") == 4 and "step 10" in cluster.logs(job), 30,
             "training to run")
    pid = int(re.search(rf"^\[{rank}\] rank {rank} pid (\d+) ready$", cluster.logs(job),
                        re.M).group(1))
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    failed = cluster.wait_state(job, {"JOB_STATE_FAILED"}, 10)
    assert time.monotonic() - killed_at < 10
    # The reason's first line names the rank; its last output and how to see all of it follow.
    first, *tail = failed["reason"].split("\n")
    assert re.fullmatch(rf"rank {rank} on host {host} \(worker-\d+\) exited with status 137: "
                        r"killed by signal 9 \(Killed\); its last output:", first), failed["reason"]
    assert tail[-1] == f"see all of it with: ringmaster logs {job} --rank {rank}", failed["reason"]
    assert any(line.startswith("  ") and "step" in line for line in tail[:-1]), failed["reason"]
    wait_for(lambda: not pids_of(f"{BIN}/train_loop", cluster.tmp), 10, "the other ranks to be stopped")


def test_killing_a_training_process_fails_the_job_naming_rank_and_host(cluster):
    kill_a_training_process(cluster, 2, "h1")
    # The daemons are free again and run the next job.
    nxt = cluster.submit(4, f"{BIN}/hello_allreduce")
    assert cluster.wait_state(nxt, {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"}, 30)["state"] == \
        "JOB_STATE_SUCCEEDED", cluster.logs(nxt)


def kill_a_worker_daemon(cluster):
    """Runs 4 ranks of train_loop, kills the daemon of worker 3 (host h1) once training runs, and
    checks the job fails within 10 s naming its host, with every training process gone."""
    job = cluster.submit(4, f"{BIN}/train_loop", extra=["--processes-per-host", "2"])
    wait_for(lambda: "step 10" in cluster.logs(job), 30, "training to run")
    victim = cluster.workers[3]  # host h1
    killed_at = time.monotonic()
    victim.kill()
    victim.wait()
    failed = cluster.wait_state(job, {"JOB_STATE_FAILED"}, 10)
    assert time.monotonic() - killed_at < 10
    assert re.search(r"serving rank \d on host h1 ", failed["reason"]), failed["reason"]
    wait_for(lambda: not pids_of(f"{BIN}/train_loop", cluster.tmp), 10,
             "every training process (the dead daemon's too) to be gone")


def test_killing_a_worker_daemon_fails_the_job_naming_rank_and_host(cluster):
    kill_a_worker_daemon(cluster)
    nxt = cluster.submit(3, f"{BIN}/hello_allreduce")
    assert cluster.wait_state(nxt, {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"}, 30)["state"] == \
        "JOB_STATE_SUCCEEDED", cluster.logs(nxt)


def test_a_rank_exiting_non_zero_fails_the_job_with_its_status(cluster):
    job = cluster.submit(2, "sh", "-c", 'test "$HOROVOD_RANK" = 1 && exit 3; sleep 30')
    failed = cluster.wait_state(job, {"JOB_STATE_FAILED"}, 10)
    assert re.fullmatch(r"rank 1 on host h\d \(worker-\d+\) exited with status 3", failed["reason"])


def test_processes_started_elsewhere_attach_to_their_daemons(cluster, tmp_path):
    """The sidecar pattern: a job with no command; each rank's process is started by someone else
    and connects to its daemon's socket (RINGMASTER_SOCKET). A probe that never says hello does not
    end the rank; the job SUCCEEDS when the attached processes disconnect."""
    out = cluster.cli("--json", "submit", "--np", "2", "--processes-per-host", "1").stdout
    job = json.loads(out)["id"]
    placed = cluster.wait_state(job, {"JOB_STATE_STARTING"}, 10)
    # Which daemon is which worker id: each logs "registered as worker-N".
    ids = {}
    for i in range(len(cluster.workers)):
        m = re.search(r"registered as (worker-\d+)", (tmp_path / f"worker{i}.log").read_text())
        ids[m.group(1)] = i
    sockets = {r.get("rank", 0): str(tmp_path / f"w{ids[r['worker_id']]}.sock")
               for r in placed["ranks"]}
    import socket as pysocket
    probe = pysocket.socket(pysocket.AF_UNIX)
    probe.connect(sockets[0])
    probe.close()
    procs = [subprocess.Popen([f"{BIN}/hello_allreduce"], env={**os.environ, "RINGMASTER_SOCKET": s},
                              stdout=subprocess.PIPE, text=True) for s in sockets.values()]
    outputs = [p.communicate(timeout=30)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert all("want=1.5" in o for o in outputs), outputs
    assert cluster.wait_state(job, {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"}, 10)["state"] == \
        "JOB_STATE_SUCCEEDED"


PYTHON_DIR = os.path.normpath(os.path.join(BIN, "..", "python"))
FAKE_CUDA = os.path.normpath(os.path.join(BIN, "..", "fake_cuda"))


def start_fake_gpu_cluster(tmp_path, **extra_env):
    """Four GPU worker daemons, two "GPUs" per host, over the fake CUDA runtime and NCCL: the GPU
    daemons' fault handling (NCCL errors and aborts, job failure, recovery for the next job)
    without a GPU."""
    if not os.path.exists(os.path.join(FAKE_CUDA, "libcudart.so.13")):
        pytest.skip(f"no fake CUDA runtime under {FAKE_CUDA} (built with CUDA only)")
    env = {**os.environ, "LD_LIBRARY_PATH": FAKE_CUDA, "FAKE_CUDA_DEVICES": "2",
           "FAKE_NCCL_TIMEOUT_SECONDS": "60", "RINGMASTER_CHECK_SKIP_TIMING": "1", **extra_env}
    return Cluster(tmp_path, workers=4, per_host=2, gpus=True, env=env)


@pytest.fixture
def fake_gpu_cluster(tmp_path):
    c = start_fake_gpu_cluster(tmp_path)
    yield c
    c.close()
    assert not pids_of(f"{BIN}/train_loop", tmp_path), "a training process outlived the test"


def test_on_gpus_an_nccl_error_fails_the_job_with_it_though_the_process_runs_on(tmp_path):
    """Rank 1's 30th collective fails as a broken network does (an asynchronous ncclRemoteError):
    its daemon's watchdog aborts the communicator and reports to the coordinator, which fails the
    job with the NCCL error, naming the rank, host and GPU, even though the training process
    (which goes on sleeping after its error) never exits by itself; every rank is stopped."""
    cluster = start_fake_gpu_cluster(tmp_path, FAKE_NCCL_FAIL_RANK="1", FAKE_NCCL_FAIL_AT="30")
    try:
        job = cluster.submit(2, "sh", "-c", f"{BIN}/train_loop 1000; sleep 60",
                             extra=["--processes-per-host", "2"])
        failed = cluster.wait_state(job, {"JOB_STATE_FAILED"}, 30)
        first, *tail = failed["reason"].split("\n")
        assert re.fullmatch(
            r"rank 1 on host h0 \(worker-\d+\) failed: NCCL error on rank 1 \(h0, cuda:1\): a "
            r"remote peer failed or exited, or the network broke \(ncclRemoteError\); its last "
            r"output:", first), failed["reason"]
        assert tail[-1] == f"see all of it with: ringmaster logs {job} --rank 1", failed["reason"]
        # Every rank is stopped, the failed one's process too (it would sleep on).
        wait_for(lambda: not pids_of(f"{BIN}/train_loop", cluster.tmp), 10, "the ranks to be stopped")
    finally:
        cluster.close()


def test_on_gpus_killing_a_training_process_fails_the_job_and_the_daemons_recover(
        fake_gpu_cluster):
    cluster = fake_gpu_cluster
    # The survivors' collectives are aborted (never a hang in NCCL), their processes stopped.
    kill_a_training_process(cluster, 3, "h1")
    # The GPU daemons released the job (arena, events, communicator) and run the next one.
    nxt = cluster.submit(4, f"{BIN}/gpu_collectives_check", extra=["--processes-per-host", "2"])
    done = cluster.wait_state(nxt, {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"}, 60)
    assert done["state"] == "JOB_STATE_SUCCEEDED", cluster.logs(nxt)
    assert cluster.logs(nxt).count("all checks passed") == 4, cluster.logs(nxt)


def test_on_gpus_killing_a_worker_daemon_fails_the_job_naming_its_host(fake_gpu_cluster):
    cluster = fake_gpu_cluster
    kill_a_worker_daemon(cluster)  # h1's cuda:1
    nxt = cluster.submit(3, f"{BIN}/gpu_collectives_check")
    done = cluster.wait_state(nxt, {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"}, 60)
    assert done["state"] == "JOB_STATE_SUCCEEDED", cluster.logs(nxt)


@pytest.mark.skipif(not os.path.isdir(os.path.join(PYTHON_DIR, "ringmaster")),
                    reason="the ringmaster Python package is not built")
def test_a_second_process_on_an_attached_rank_is_refused(cluster, tmp_path):
    """One training process per rank: a second one connecting to the same daemon (say, a DataLoader
    worker calling init()) would share its arena. It is refused, naming the rank, the job and the
    attached process, and the attached one goes on."""
    out = cluster.cli("--json", "submit", "--np", "1", "--processes-per-host", "1").stdout
    job = json.loads(out)["id"]
    placed = cluster.wait_state(job, {"JOB_STATE_STARTING"}, 10)
    worker = placed["ranks"][0]["worker_id"]
    index = next(i for i in range(len(cluster.workers))
                 if f"registered as {worker}\n" in (tmp_path / f"worker{i}.log").read_text())
    env = {**os.environ, "RINGMASTER_SOCKET": str(tmp_path / f"w{index}.sock")}
    first = subprocess.Popen([f"{BIN}/train_loop"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert re.match(r"rank 0 pid (\d+) ready", first.stdout.readline())
        started = time.monotonic()
        second = subprocess.run(
            ["/usr/bin/python3", "-c", "import ringmaster.torch as hvd\n"
             "try:\n    hvd.init()\nexcept hvd.HorovodInternalError as e:\n    print(e)\n"],
            env={**env, "PYTHONPATH": PYTHON_DIR, "RINGMASTER_CONNECT_TIMEOUT_SECONDS": "60"},
            capture_output=True, text=True, timeout=60)
        # At once, not after the connect timeout: waiting would not change the answer.
        assert time.monotonic() - started < 20, second.stdout
        assert (f"rank 0 of job {job} already has a training process attached (pid {first.pid}): "
                "one process per rank") in second.stdout, second.stdout + second.stderr
        assert first.poll() is None, "the attached process was disturbed"
        assert cluster.job(job)["state"] == "JOB_STATE_RUNNING"
    finally:
        first.kill()
        first.wait()


@pytest.mark.parametrize("device,message", [
    ("gpu0", "--device 'gpu0' is not cpu or cuda:N"),
    # Absent on every machine: refused at start with CUDA's reason (or, in a build without CUDA,
    # because this daemon serves CPU slots only), before it ever registers.
    ("cuda:4096", "--device cuda:4096: "),
])
def test_a_bad_or_absent_device_is_refused_at_daemon_start(device, message):
    r = subprocess.run([os.path.join(BIN, "ringmaster-worker"), "--coordinator", "127.0.0.1:1",
                        "--device", device], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert message in r.stderr, r.stderr


@pytest.mark.skipif(not os.path.exists(os.path.join(FAKE_CUDA, "libcudart.so.13")),
                    reason="no fake CUDA runtime (built with CUDA only)")
def test_a_gpu_in_exclusive_process_mode_is_refused_at_daemon_start():
    """The daemon and the training process both need the GPU: a device in exclusive-process compute
    mode (over the fake CUDA runtime, which reports it) is refused before the daemon registers."""
    env = {**os.environ, "LD_LIBRARY_PATH": FAKE_CUDA, "FAKE_CUDA_DEVICES": "1",
           "FAKE_CUDA_COMPUTE_MODE": "3"}  # cudaComputeModeExclusiveProcess
    r = subprocess.run([os.path.join(BIN, "ringmaster-worker"), "--coordinator", "127.0.0.1:1",
                        "--device", "cuda:0"], capture_output=True, text=True, timeout=30, env=env)
    assert r.returncode != 0
    assert ("--device cuda:0: cuda:0 is in exclusive-process compute mode: the worker daemon and "
            "the training process must both use it (set the Default compute mode with nvidia-smi "
            "-c DEFAULT, or run MPS)") in r.stderr, r.stderr
