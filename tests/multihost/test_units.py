"""The systemd units as shipped (deploy/systemd): `systemd-analyze verify` passes on each, and their
ExecStart lines, run with their environment files in namespace hosts (tests/multihost/netns.py),
make a working cluster: a coordinator host and two worker hosts of two CPU slots each, named by
their host names, run a 4-rank job.

What systemd would do is done by hand, in the open: the environment files are read and their
variables expanded into ExecStart as systemd expands them (`${VAR}` one word, `$VAR` split on
white space, `%i` the instance); the directories systemd creates (/run/ringmaster,
/var/lib/ringmaster) and the install prefix's /usr/local/bin are pointed at the test's own. The
environment files are edited as an operator does: the coordinator's address.
"""
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from netns import assert_collectives_passed, hosts_or_skip, wait_for

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("RINGMASTER_BIN_DIR", REPO / "build" / "bin")).resolve()
UNITS = REPO / "deploy" / "systemd"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # systemd's default


def service_section(unit):
    """[Service]'s entries: key -> list of values, in order."""
    entries, section = {}, None
    for line in unit.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line
        elif section == "[Service]":
            key, value = line.split("=", 1)
            entries.setdefault(key, []).append(value)
    return entries


def read_env_file(path):
    env = {}
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, value = line.split("=", 1)
            env[key] = value.strip('"')
    return env


def exec_start(unit, env, instance=""):
    """ExecStart as systemd runs it: argv after %i and $VAR / ${VAR} expansion."""
    (line,) = service_section(unit)["ExecStart"]
    argv = []
    for word in line.replace("%i", instance).split():
        if m := re.fullmatch(r"\$\{(\w+)\}", word):
            argv.append(env.get(m.group(1), ""))
        elif m := re.fullmatch(r"\$(\w+)", word):
            argv.extend(env.get(m.group(1), "").split())
        else:
            assert "$" not in word, f"{unit.name}: cannot expand {word}"
            argv.append(word)
    return argv


def unit_environment(unit, credentials):
    """Environment= assignments, with %d (the credentials directory) expanded."""
    env = {}
    for value in service_section(unit).get("Environment", []):
        for assignment in value.split():
            key, v = assignment.split("=", 1)
            env[key] = v.replace("%d", str(credentials))
    return env


def load_credentials(unit, directory, pair):
    """What LoadCredential= copies into the credentials directory: here from dev-ca.sh's `pair`
    (the unit names /etc/ringmaster/tls/FILE)."""
    directory.mkdir(parents=True)
    for value in service_section(unit).get("LoadCredential", []):
        name, path = value.split(":", 1)
        assert path == f"/etc/ringmaster/tls/{name}", value
        shutil.copy(pair / name, directory / name)
    assert sorted(p.name for p in directory.iterdir()) == ["ca.crt", "tls.crt", "tls.key"]


def environment_files(unit, instance=""):
    """(path, optional) for each EnvironmentFile=, %i expanded."""
    files = []
    for value in service_section(unit).get("EnvironmentFile", []):
        optional = value.startswith("-")
        files.append((value.lstrip("-").replace("%i", instance), optional))
    return files


def localize(argv, tmp, host):
    """The install prefix and systemd's directories, pointed at the build and the test's own."""
    out = []
    for word in argv:
        word = word.replace("/usr/local/bin/", f"{BIN}/")
        word = word.replace("/run/ringmaster/", f"{tmp}/{host}-run/")
        word = word.replace("/var/lib/ringmaster", f"{tmp}/{host}-state")
        out.append(word)
    return out


def test_systemd_analyze_verify_passes_on_every_unit(tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    units = []
    for unit in sorted(UNITS.glob("*.service")):
        # A template is verified as an instance; the binaries are where `cmake --install` puts
        # them, here the build's.
        name = unit.name.replace("@.service", "@cuda0.service")
        (tmp_path / name).write_text(unit.read_text().replace("/usr/local/bin/", f"{BIN}/"))
        units.append(str(tmp_path / name))
    assert len(units) == 2, units
    r = subprocess.run(["systemd-analyze", "verify", *units], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr




@pytest.fixture
def hosts():
    yield from hosts_or_skip(3, names=["coordinator", "node-a", "node-b"])


def test_the_units_exec_start_lines_with_their_environment_files_run_a_job(hosts, tmp_path):
    coordinator_host = hosts[0]
    address = f"{coordinator_host.address}:50051"
    # The coordinator: its environment file as shipped, the listen address set to its host's.
    unit = UNITS / "ringmaster-coordinator.service"
    assert environment_files(unit) == [("/etc/ringmaster/coordinator.env", True)]
    ca = tmp_path / "ca"
    subprocess.run(["bash", str(REPO / "scripts" / "dev-ca.sh"), str(ca), "--san",
                    f"IP:{coordinator_host.address}"], check=True, capture_output=True, timeout=60)
    load_credentials(unit, tmp_path / "coordinator-credentials", ca / "coordinator")
    env = read_env_file(UNITS / "coordinator.env")
    env["RINGMASTER_LISTEN"] = address
    env.update(unit_environment(unit, tmp_path / "coordinator-credentials"))
    os.makedirs(tmp_path / "coordinator-state")
    log = tmp_path / "coordinator.log"
    argv = localize(exec_start(unit, env), tmp_path, "coordinator")
    coordinator_host.popen(argv, log, env={"PATH": PATH, "TMPDIR": str(tmp_path), **env})
    wait_for(lambda: "listening on" in log.read_text(errors="replace"), 20, "the coordinator")

    # Two worker hosts, instances cpu0 and cpu1 each, worker.env with the coordinator's address and
    # a worker-INSTANCE.env giving each its metrics port (as worker.env's comment shows).
    unit = UNITS / "ringmaster-worker@.service"
    assert environment_files(unit, "cpu0") == [("/etc/ringmaster/worker.env", False),
                                               ("/etc/ringmaster/worker-cpu0.env", True)]
    shared = read_env_file(UNITS / "worker.env")
    shared["RINGMASTER_COORDINATOR"] = address
    for h in hosts.hosts[1:]:
        os.makedirs(tmp_path / f"{h.name}-run")
        credentials = tmp_path / f"{h.name}-credentials"
        load_credentials(unit, credentials, ca / "worker")
        for slot in range(2):
            instance = f"cpu{slot}"
            env = dict(shared, RINGMASTER_WORKER_INSTANCE_FLAGS=f"--metrics-listen 0.0.0.0:{9401 + slot}",
                       **unit_environment(unit, credentials))
            argv = localize(exec_start(unit, env, instance), tmp_path, h.name)
            h.popen(argv, tmp_path / f"{h.name}-{instance}.log",
                    env={"PATH": PATH, "TMPDIR": str(tmp_path), **env})

    def cli(*args):
        r = coordinator_host.run([str(BIN / "ringmaster"), "--coordinator", address,
                                  "--tls-ca", str(ca / "ca.crt"), "--tls-cert",
                                  str(ca / "user" / "tls.crt"), "--tls-key",
                                  str(ca / "user" / "tls.key"), *args], env={"PATH": PATH})
        assert r.returncode == 0, r.stderr
        return r.stdout

    def idle():
        workers = json.loads(cli("workers", "--json")).get("workers", [])
        return sorted((w["host"], w["address"]) for w in workers
                      if w["state"] == "WORKER_STATE_IDLE")

    wait_for(lambda: len(idle()) == 4, 30, "4 idle workers")
    assert idle() == [("node-a", hosts[1].address)] * 2 + [("node-b", hosts[2].address)] * 2
    # Each instance serves its metrics and probes where its environment file said (the
    # coordinator's: coordinator.env's --metrics-listen 0.0.0.0:9400), reached from the
    # coordinator's host as Prometheus would.
    for h, port in [(hosts[0], 9400)] + [(h, p) for h in hosts.hosts[1:] for p in (9401, 9402)]:
        for path in ("/metrics", "/healthz", "/readyz"):
            url = f"http://{h.address}:{port}{path}"
            r = coordinator_host.run(["/usr/bin/python3", "-c", "import sys, urllib.request; "
                                      f"print(urllib.request.urlopen('{url}', timeout=5).status)"])
            assert r.stdout.strip() == "200", (url, r.stderr)

    job = json.loads(cli("--json", "submit", "--np", "4", "--processes-per-host", "2", "--",
                         str(BIN / "collectives_check")))["id"]
    done = wait_for(lambda: (lambda j: j if j["state"] in {
        "JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"} else None)(
        json.loads(cli("status", job, "--json"))), 180, "the job")
    logs = cli("logs", job)
    assert done["state"] == "JOB_STATE_SUCCEEDED", f"{done.get('reason')}\n{logs}"
    assert_collectives_passed(logs, 4)
    assert sorted(r["host"] for r in done["ranks"]) == ["node-a", "node-a", "node-b", "node-b"]
    # The coordinator keeps its jobs in its state directory (--state-dir in the unit).
    assert {"artifacts", "jobs.db", "logs"} <= {p.name for p in (tmp_path / "coordinator-state").iterdir()}


def test_the_cloud_init_example_is_valid_and_starts_the_shipped_units():
    import yaml
    text = (REPO / "deploy" / "cloud-init" / "gpu-worker.yaml").read_text()
    assert text.startswith("#cloud-config\n")
    config = yaml.safe_load(text)
    files = {f["path"]: f for f in config["write_files"]}
    env = {}
    for line in files["/etc/ringmaster/worker.env"]["content"].splitlines():
        if line and not line.startswith("#"):
            key, value = line.split("=", 1)
            env[key] = value
    # It writes what the worker unit reads, and enables that unit's instances.
    unit = UNITS / "ringmaster-worker@.service"
    assert ("/etc/ringmaster/worker.env", False) in environment_files(unit)
    assert set(env) == {"RINGMASTER_COORDINATOR", "RINGMASTER_WORKER_FLAGS"}
    installer = files["/usr/local/sbin/ringmaster-install"]["content"]
    assert 'systemctl enable --now "ringmaster-worker@cuda$i"' in installer
    assert "RINGMASTER_WORKER_INSTANCE_FLAGS=" in installer
    # It installs the package (tests/image runs it on a fresh Debian root).
    assert 'apt-get install -y -qq --no-install-recommends "$deb"' in installer
    assert set(files) == {"/etc/ringmaster/worker.env", "/etc/ringmaster/package-url",
                          "/usr/local/sbin/ringmaster-install"}
    r = subprocess.run(["bash", "-n"], input=installer, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert config["runcmd"] == [["/usr/local/sbin/ringmaster-install"]]
