"""A newcomer's first hour, as the README and docs/cli.md walk it: a coordinator and workers started
by hand on loopback, jobs submitted with the CLI, and every message checked word for word.

    /usr/bin/python3 -m pytest -q tests/cli/test_first_hour.py

Binaries come from $RINGMASTER_BIN_DIR (default <repo>/build/bin). Every process a test starts is
killed when it ends; every wait is bounded.
"""

import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("RINGMASTER_BIN_DIR", REPO / "build" / "bin")).resolve()
RM = str(BIN / "ringmaster")
PORT_RE = re.compile(r"ringmaster-coordinator listening on port (\d+)")
METRICS_RE = re.compile(r"ringmaster-coordinator metrics on port (\d+)")
UID = os.getuid()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class Proc:
    """A background process whose stdout and stderr go to files (read at any time)."""

    def __init__(self, argv, tmp, name, env=None, cwd=None):
        self.out = Path(tmp) / f"{name}.out"
        self.err = Path(tmp) / f"{name}.err"
        self.p = subprocess.Popen(argv, stdout=self.out.open("wb"), stderr=self.err.open("wb"),
                                  env=env, cwd=cwd, start_new_session=True)

    def stdout(self):
        return self.out.read_text(errors="replace")

    def stderr(self):
        return self.err.read_text(errors="replace")

    def alive(self):
        return self.p.poll() is None

    def stop(self, sig=signal.SIGTERM, timeout=10):
        if self.alive():
            self.p.send_signal(sig)
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)
        return self.p.returncode


def log_tail(proc, chars=6000):
    """The end of a coordinator's (or daemon's) stderr, for an assertion's message."""
    if not hasattr(proc, "stderr"):
        return ""
    return f"\n--- the end of its log ---\n{proc.stderr()[-chars:]}"


class Cluster:
    """Coordinators and workers started by hand, as the README does."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.procs = []
        self.count = 0
        # Daemons as on a fresh machine: artifacts under the test's own directory, and no
        # PYTHONPATH of the caller's (a job that needs the package must be sent it).
        self.env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        self.env["TMPDIR"] = str(tmp)
        # A lock taken against an order seen before aborts the daemon or coordinator (printing both
        # stacks), rather than deadlocking one run in a thousand.
        self.env["RINGMASTER_MUTEX_DEADLOCK_DETECTION"] = "abort"

    def coordinator(self, *extra, port=0, expect_port=True):
        self.count += 1
        c = Proc([str(BIN / "ringmaster-coordinator"), "--listen", f"127.0.0.1:{port}",
                  "--lease-seconds", "3", "--heartbeat-interval-seconds", "0.5", *extra],
                 self.tmp, f"coordinator{self.count}", env=self.env)
        self.procs.append(c)
        if expect_port:
            m = wait_for(lambda: PORT_RE.search(c.stdout()) or (not c.alive() and "exited"), 20,
                         "the coordinator's port")
            assert m != "exited", c.stderr()
            c.port = int(m.group(1))
            c.address = f"127.0.0.1:{c.port}"
        return c

    def worker(self, coordinator, host="h0", socket_path=None, extra=()):
        self.count += 1
        socket_path = socket_path or f"{self.tmp}/w{self.count}.sock"
        w = Proc([str(BIN / "ringmaster-worker"), "--coordinator", coordinator.address,
                  "--device", "cpu", "--host-name", host, "--socket", socket_path, *extra],
                 self.tmp, f"worker{self.count}", env=self.env)
        w.socket = socket_path
        self.procs.append(w)
        return w

    def cli(self, coordinator, *args, timeout=20, env=None, cwd=None):
        e = dict(os.environ if env is None else env)
        e["RINGMASTER_COORDINATOR"] = coordinator.address
        return subprocess.run([RM, *args], capture_output=True, text=True, timeout=timeout,
                              env=e, cwd=cwd)

    def job(self, coordinator, job_id):
        r = self.cli(coordinator, "status", job_id, "--json")
        assert r.returncode == 0, r.stderr + log_tail(coordinator)
        return json.loads(r.stdout)

    def wait_state(self, coordinator, job_id, states, timeout):
        return wait_for(lambda: (lambda j: j if j["state"] in states else None)(
            self.job(coordinator, job_id)), timeout, f"{job_id} to reach {states}")

    def idle_workers(self, coordinator):
        r = self.cli(coordinator, "workers", "--json")
        assert r.returncode == 0, r.stderr + log_tail(coordinator)
        return [w for w in json.loads(r.stdout).get("workers", [])
                if w["state"] == "WORKER_STATE_IDLE"]

    def close(self):
        for p in reversed(self.procs):
            p.stop(signal.SIGKILL if p.alive() else signal.SIGTERM)


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    yield c
    c.close()


def submit(cluster, coordinator, *args, **kw):
    r = cluster.cli(coordinator, "submit", *args, **kw)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()[0]


# --------------------------------------------------------------------------------------------------
# --help everywhere, and the usage errors a newcomer makes
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("binary,flags", [
    ("ringmaster-coordinator", ["--listen", "--listen-unix", "--metrics-listen", "--log-level", "--artifacts-dir",
                                "--lease-seconds", "--heartbeat-interval-seconds",
                                "--start-timeout", "--state-dir", "--resume-timeout", "--store",
                                "--tls-cert", "--tls-key", "--tls-ca", "--token-file",
                                "--admin-group", "--worker-group", "--insecure",
                                "--insecure-allow-remote", "--job-retention", "--max-ended-jobs",
                                "--max-active-jobs", "--max-active-jobs-per-user",
                                "--max-registrations-per-minute", "--advertise-address", "--leader-ttl",
                                "--max-source-bytes", "--max-output-bytes"]),
    ("ringmaster-worker", ["--coordinator", "--device", "--host-name", "--socket", "--iface",
                           "--metrics-listen", "--arena-mb", "--collective-timeout-seconds", "--log-level",
                           "--coordinator-grace", "--tls-cert", "--tls-key", "--tls-ca",
                           "--insecure", "--socket-group", "--attach-uid", "--work-dir"]),
])
def test_daemons_help_lists_their_own_flags_with_dashes(binary, flags):
    r = subprocess.run([str(BIN / binary), "--help"], capture_output=True, text=True, timeout=10)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: {binary} "), r.stdout
    listed = re.findall(r"^  (--[a-z0-9_-]+)", r.stdout, re.M)
    assert sorted(listed) == sorted(flags + ["--help"]), r.stdout
    assert "_" not in "".join(listed)
    assert "No flags matched" not in r.stdout + r.stderr


@pytest.mark.parametrize("command", ["submit", "jobs", "status", "cancel", "watch", "logs",
                                     "artifacts", "workers", "local"])
def test_every_cli_command_has_its_own_help(command):
    r = subprocess.run([RM, command, "--help"], capture_output=True, text=True, timeout=10)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: ringmaster {command}"), r.stdout
    if command in ("submit", "local"):
        assert r.stdout.splitlines()[0].endswith("[options] -- CMD [ARGS...]"), r.stdout
        assert "\n  --np N " in r.stdout and "\n  --fusion-threshold-mb MB " in r.stdout
    if command == "submit":
        assert "\n  --no-inherit-env " in r.stdout
    if command == "local":
        assert "\n  --metrics-port-base P " in r.stdout


def test_top_level_help_lists_every_command():
    r = subprocess.run([RM, "--help"], capture_output=True, text=True, timeout=10)
    assert r.returncode == 0
    for command in ["submit", "jobs", "status", "cancel", "watch", "logs", "artifacts", "workers",
                    "local"]:
        assert re.search(rf"^  {command}\b", r.stdout, re.M), command


def test_a_command_without_double_dash_says_to_put_it():
    r = subprocess.run([RM, "submit", "--np", "2", "python3", "x.py"], capture_output=True,
                       text=True, timeout=10)
    assert r.returncode == 2
    assert r.stderr.splitlines()[0] == (
        "ringmaster: submit: 'python3' is not an option; put -- before the command: "
        "ringmaster submit [options] -- python3 x.py")


def test_an_unreachable_coordinator_names_the_address_and_how_to_change_it():
    port = free_port()
    r = subprocess.run([RM, "--coordinator", f"127.0.0.1:{port}", "--timeout-seconds", "2", "jobs"],
                       capture_output=True, text=True, timeout=20)
    assert r.returncode == 1
    lines = r.stderr.splitlines()
    assert lines[0].startswith("ringmaster: UNAVAILABLE: "), r.stderr
    assert lines[1] == (
        f"(no coordinator answered at 127.0.0.1:{port}; is ringmaster-coordinator running there? "
        "Name another with --coordinator ADDR:PORT or RINGMASTER_COORDINATOR=ADDR:PORT)")


# --------------------------------------------------------------------------------------------------
# Workers: listing them, and a pending job that says why it waits
# --------------------------------------------------------------------------------------------------

def test_a_pending_job_says_why_it_waits_and_workers_are_listed(cluster):
    c = cluster.coordinator()
    r = cluster.cli(c, "workers")
    assert r.returncode == 0, r.stderr
    assert r.stdout == (f"no workers registered with the coordinator at {c.address}; start one "
                        f"with:\n  ringmaster-worker --coordinator {c.address} --device cpu\n")
    job = submit(cluster, c, "--np", "16", "--processes-per-host", "8", "--", "true")
    watch = Proc([RM, "--coordinator", c.address, "watch", job], cluster.tmp, "watch")
    cluster.procs.append(watch)
    status = cluster.cli(c, "status", job)
    assert "\nState:     PENDING\n" in status.stdout
    assert ("\nWaiting:   needs 16 idle cpu slots (at most 8 per host); 0 registered, 0 idle\n"
            in status.stdout), status.stdout

    w = cluster.worker(c, host="h0")
    wait_for(lambda: cluster.idle_workers(c), 20, "the worker to register")
    assert cluster.job(c, job)["waiting_reason"] == (
        "needs 16 idle cpu slots (at most 8 per host); 1 registered, 1 idle")
    table = cluster.cli(c, "workers").stdout.splitlines()
    assert table[0].split() == ["WORKER", "HOST", "ADDRESS", "DEVICE", "STATE", "JOB", "RANK",
                                "HEARTBEAT"]
    row = table[1].split()
    # A worker whose coordinator is on loopback has its data plane there too.
    assert re.fullmatch(r"worker-\d{6}", row[0]) and row[1:7] == [
        "h0", "127.0.0.1", "cpu", "IDLE", "-", "-"]
    assert re.fullmatch(r"\d+s", row[7]) and row[8] == "ago"

    # The coordinator logs registrations at its default level (info).
    wait_for(lambda: re.search(rf"worker {row[0]} registered: host h0 device cpu address 127.0.0.1",
                               c.stderr()), 5,
             "the registration in the coordinator's log")
    # ... and the loss of a worker.
    w.stop(signal.SIGKILL)
    wait_for(lambda: re.search(rf"worker {row[0]} on h0 lost: ", c.stderr()), 15,
             "the loss in the coordinator's log")
    lost = json.loads(cluster.cli(c, "workers", "--json").stdout)["workers"][0]
    assert lost["state"] == "WORKER_STATE_LOST"

    # watch printed each reason as it changed, then the cancel, and exits 1.
    assert cluster.cli(c, "cancel", job).returncode == 0
    watch.p.wait(10)
    assert watch.p.returncode == 1
    events = [line.split(None, 2)[2] for line in watch.stdout().splitlines()]
    assert events[:3] == [
        "registered: 16 ranks",
        "waiting: needs 16 idle cpu slots (at most 8 per host); 0 registered, 0 idle",
        "waiting: needs 16 idle cpu slots (at most 8 per host); 1 registered, 1 idle",
    ], watch.stdout()
    assert events[-1] == "cancelled by user", watch.stdout()


# --------------------------------------------------------------------------------------------------
# Ports and sockets in use are refused
# --------------------------------------------------------------------------------------------------

def test_a_coordinator_port_in_use_is_refused(cluster):
    first = cluster.coordinator("--metrics-listen", "127.0.0.1:0")
    metrics_port = int(wait_for(lambda: METRICS_RE.search(first.stdout()), 10, "metrics").group(1))
    second = cluster.coordinator(port=first.port, expect_port=False)
    assert second.p.wait(20) == 1
    assert second.stderr().splitlines()[-1] == (
        f"ringmaster-coordinator: cannot listen on 127.0.0.1:{first.port}: Address already in use "
        "(another process, e.g. a ringmaster-coordinator, listens there; choose another address "
        "with --listen)")
    third = cluster.coordinator("--metrics-listen", f"127.0.0.1:{metrics_port}", expect_port=False)
    assert third.p.wait(20) == 1
    assert third.stderr().splitlines()[-1] == (
        f"ringmaster-coordinator: cannot serve metrics on 127.0.0.1:{metrics_port}: Address already "
        "in use (choose another address with --metrics-listen)")
    # Every call still reaches the first one.
    for _ in range(8):
        assert cluster.cli(first, "jobs").returncode == 0


def test_a_worker_socket_in_use_is_refused_and_a_worker_removes_only_its_own(cluster):
    c = cluster.coordinator()
    first = cluster.worker(c, host="h0")
    wait_for(lambda: Path(first.socket).exists(), 10, "the first worker's socket")
    second = cluster.worker(c, host="h0", socket_path=first.socket)
    assert second.p.wait(20) == 1
    assert second.stderr().splitlines()[-1] == (
        f"ringmaster-worker: --socket {first.socket} is in use: another ringmaster-worker serves it "
        "(give each worker its own --socket)")
    assert Path(first.socket).exists()
    # The first worker still runs jobs through its socket.
    job = submit(cluster, c, "--np", "1", "--", str(BIN / "hello_allreduce"))
    assert cluster.wait_state(c, job, {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"}, 30)["state"] == \
        "JOB_STATE_SUCCEEDED"

    # Claiming a path is atomic: while another holds PATH.lock (a worker starting at the same
    # moment), the path is refused too.
    claimed = f"{cluster.tmp}/claimed.sock"
    with open(claimed + ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        racer = cluster.worker(c, host="h1", socket_path=claimed)
        assert racer.p.wait(20) == 1
        assert racer.stderr().splitlines()[-1] == (
            f"ringmaster-worker: --socket {claimed} is in use: another ringmaster-worker serves it "
            "(give each worker its own --socket)")
    assert not Path(claimed).exists()

    # A socket left by a dead daemon (nobody answers) is replaced.
    stale = f"{cluster.tmp}/stale.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(stale)
    s.close()
    third = cluster.worker(c, host="h1", socket_path=stale)
    wait_for(lambda: len(cluster.idle_workers(c)) == 2, 20, "the third worker to register")
    assert third.alive()
    # A worker whose socket path was taken over leaves the new one alone.
    os.unlink(stale)
    s = socket.socket(socket.AF_UNIX)
    s.bind(stale)
    assert third.stop() == 0
    assert Path(stale).exists()
    s.close()
    assert first.stop() == 0
    assert not Path(first.socket).exists()
    assert not Path(first.socket + ".lock").exists()


# --------------------------------------------------------------------------------------------------
# submit: the caller's directory and environment; a failure's reason
# --------------------------------------------------------------------------------------------------

PRINT_ENV = ("import os, ringmaster; print('cwd', os.getcwd()); "
             "print(*(f'{k}={os.environ.get(k)}' for k in "
             "('HOROVOD_FOO', 'NCCL_DEBUG', 'RINGMASTER_BAR', 'UNRELATED')))")


def test_submit_runs_in_the_callers_directory_with_its_environment(cluster, tmp_path):
    c = cluster.coordinator()
    cluster.worker(c)
    wait_for(lambda: cluster.idle_workers(c), 20, "the worker")
    workdir = tmp_path / "project"
    workdir.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HOROVOD_FOO="foo", NCCL_DEBUG="WARN", RINGMASTER_BAR="bar", UNRELATED="x")
    job = submit(cluster, c, "--np", "1", "--", "/usr/bin/python3", "-c", PRINT_ENV, env=env,
                 cwd=workdir)
    done = cluster.wait_state(c, job, {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"}, 30)
    logs = cluster.cli(c, "logs", job).stdout
    assert done["state"] == "JOB_STATE_SUCCEEDED", done.get("reason", "") + logs
    assert logs == (f"[0] cwd {workdir}\n"
                    "[0] HOROVOD_FOO=foo NCCL_DEBUG=WARN RINGMASTER_BAR=bar UNRELATED=None\n")

    # --no-inherit-env: only --env, in the worker's own directory; `import ringmaster` then fails,
    # and the reason ends with the rank's last output and the command that shows all of it.
    job = submit(cluster, c, "--np", "1", "--no-inherit-env", "--env", "NCCL_DEBUG=INFO", "--",
                 "/usr/bin/python3", "-c", PRINT_ENV, env=env, cwd=workdir)
    failed = cluster.wait_state(c, job, {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"}, 30)
    assert failed["state"] == "JOB_STATE_FAILED"
    lines = failed["reason"].split("\n")
    assert re.fullmatch(r"rank 0 on host h0 \(worker-\d{6}\) exited with status 1; its last output:",
                        lines[0]), failed["reason"]
    assert lines[-2] == "  ModuleNotFoundError: No module named 'ringmaster'", failed["reason"]
    assert lines[-1] == f"see all of it with: ringmaster logs {job} --rank 0"
    assert 2 <= len(lines) - 2 <= 5
    assert cluster.cli(c, "jobs").stdout.splitlines()[1].endswith(lines[0])


def test_the_other_ranks_of_a_failed_or_cancelled_job_show_their_final_state(cluster):
    c = cluster.coordinator()
    for _ in range(2):
        cluster.worker(c)
    wait_for(lambda: len(cluster.idle_workers(c)) == 2, 20, "two workers")
    job = submit(cluster, c, "--np", "2", "--", "sh", "-c",
                 'echo one; echo two; test "$HOROVOD_RANK" = 1 && exit 3; sleep 30')
    failed = cluster.wait_state(c, job, {"JOB_STATE_FAILED"}, 20)
    worker = failed["ranks"][1]["worker_id"]
    assert failed["reason"] == (
        f"rank 1 on host h0 ({worker}) exited with status 3; its last output:\n  one\n  two\n"
        f"see all of it with: ringmaster logs {job} --rank 1")
    assert [r["state"] for r in failed["ranks"]] == ["RANK_STATE_STOPPED", "RANK_STATE_EXITED"]
    status = cluster.cli(c, "status", job).stdout
    assert re.search(r"^0 +h0 +127\.0\.0\.1 +cpu +worker-\d+ +0/2 +0/1 +STOPPED +-$", status,
                     re.M), status
    assert re.search(r"^1 +h0 +127\.0\.0\.1 +cpu +worker-\d+ +1/2 +0/1 +EXITED +3$", status,
                     re.M), status

    wait_for(lambda: len(cluster.idle_workers(c)) == 2, 20, "the workers to be free")
    job = submit(cluster, c, "--np", "2", "--", "sleep", "30")
    cluster.wait_state(c, job, {"JOB_STATE_RUNNING"}, 20)
    assert cluster.cli(c, "cancel", job).returncode == 0
    cancelled = cluster.job(c, job)
    assert [r["state"] for r in cancelled["ranks"]] == ["RANK_STATE_STOPPED"] * 2


def test_an_ended_job_keeps_its_last_throughput(cluster):
    c = cluster.coordinator()
    for _ in range(2):
        cluster.worker(c)
    wait_for(lambda: len(cluster.idle_workers(c)) == 2, 20, "two workers")
    job = submit(cluster, c, "--np", "2", "--", str(BIN / "hello_allreduce"))
    done = cluster.wait_state(c, job, {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"}, 30)
    assert done["state"] == "JOB_STATE_SUCCEEDED"
    t = done["throughput"]
    # One allreduce of 1000 float32 values.
    assert int(t["tensors_negotiated"]) == 1 and int(t["bytes_negotiated"]) == 4000, t
    assert int(t["fusion_threshold_bytes"]) == 128 << 20
    time.sleep(1.5)
    again = cluster.job(c, job)["throughput"]
    assert again == t  # figures as of its end: they do not decay
    status = cluster.cli(c, "status", job).stdout
    assert re.search(r"^Last: +[\d.]+ MB/s allreduced, .* \(its last 10 s\); 1 tensors, 0\.0 MB "
                     r"since start; at its end: fusion_threshold=134217728 bytes", status, re.M), \
        status
    assert "\nLive:" not in status


# --------------------------------------------------------------------------------------------------
# What a newcomer sees from `local`, from two coordinators, and from a coordinator restart
# --------------------------------------------------------------------------------------------------

def test_local_echo_logs_no_error(tmp_path):
    for _ in range(3):
        r = subprocess.run([RM, "local", "--np", "2", "--", "echo", "hello"], capture_output=True,
                           text=True, timeout=60, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert sorted(r.stdout.splitlines()) == ["[0] hello", "[1] hello"]
        assert "error" not in r.stderr and "rendezvous is closed" not in r.stderr, r.stderr


def test_two_coordinators_keep_their_artifacts_apart(cluster, tmp_path):
    first, second = cluster.coordinator(port=free_port()), cluster.coordinator(port=free_port())
    for c in (first, second):
        cluster.worker(c)
        wait_for(lambda: cluster.idle_workers(c), 20, "a worker")
    base = Path(cluster.env["TMPDIR"]) / f"ringmaster-artifacts-{UID}"
    for c in (first, second):
        job = submit(cluster, c, "--np", "1", "--timeline", "timeline.json", "--",
                     str(BIN / "hello_allreduce"), cwd=tmp_path)
        assert job == "job-000001"
        assert cluster.wait_state(c, job, {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"}, 30)[
            "state"] == "JOB_STATE_SUCCEEDED"
        assert f"; artifacts in {base}/127.0.0.1-{c.port}\n" in c.stderr(), c.stderr()
    for c in (first, second):
        listed = cluster.cli(c, "artifacts", "job-000001", "--list").stdout
        assert listed.split()[0] == "timeline.json", listed
        timeline = base / f"127.0.0.1-{c.port}" / "job-000001" / "timeline.json"
        assert json.loads(timeline.read_text())  # whole, not wiped by the other coordinator
    # A coordinator on a port it picks (port 0) has a directory of its own too.
    third = cluster.coordinator()
    assert f"; artifacts in {base}/pid-{third.p.pid}\n" in wait_for(
        lambda: "artifacts in" in third.stderr() and third.stderr(), 10, "the log line")


def test_workers_outlive_a_coordinator_stop_and_join_its_successor(cluster):
    port = free_port()
    c = cluster.coordinator(port=port)
    w = cluster.worker(c)
    wait_for(lambda: cluster.idle_workers(c), 20, "the worker")
    assert c.stop(signal.SIGTERM) == 0
    time.sleep(1.5)
    assert w.alive(), w.stderr()
    successor = cluster.coordinator(port=port)
    wait_for(lambda: cluster.idle_workers(successor), 20, "the worker to join the new coordinator")
    job = submit(cluster, successor, "--np", "1", "--", str(BIN / "hello_allreduce"))
    assert cluster.wait_state(successor, job, {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"}, 30)[
        "state"] == "JOB_STATE_SUCCEEDED"


FAKE_CUDA = BIN.parent / "fake_cuda"


@pytest.mark.skipif(not (FAKE_CUDA / "libcudart.so.13").exists(),
                    reason="no fake CUDA runtime (built with CUDA only)")
def test_a_gpu_worker_on_a_machine_without_gpus_says_so():
    # The fake CUDA runtime with no devices answers as CUDA does without a usable GPU.
    env = {**os.environ, "LD_LIBRARY_PATH": str(FAKE_CUDA), "FAKE_CUDA_DEVICES": "0"}
    r = subprocess.run([str(BIN / "ringmaster-worker"), "--coordinator", "127.0.0.1:1", "--device",
                        "cuda:0"], capture_output=True, text=True, timeout=30, env=env)
    assert r.returncode == 1
    assert r.stderr.splitlines()[-1] == (
        "ringmaster-worker: --device cuda:0: cuda:0 cannot be used: no NVIDIA GPU is usable here "
        "(no CUDA-capable device is detected (fake CUDA); is the NVIDIA driver installed and the GPU "
        "visible, e.g. nvidia-smi lists it?); on a machine without GPUs run the worker with --device "
        "cpu")


def test_a_worker_given_an_interface_that_is_not_there_names_it_and_those_there_are(tmp_path):
    r = subprocess.run([str(BIN / "ringmaster-worker"), "--coordinator", "127.0.0.1:1", "--iface",
                        "nosuch0", "--socket", str(tmp_path / "w.sock")],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1
    m = re.fullmatch(r"ringmaster-worker: --iface: network interface 'nosuch0' has no address here; "
                     r"interfaces: (.+)", r.stderr.splitlines()[-1])
    assert m, r.stderr
    assert "lo" in m.group(1).split(", "), r.stderr
    assert not (tmp_path / "w.sock").exists()  # refused before it served anything
