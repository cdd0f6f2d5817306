"""The container image as shipped (deploy/container/Containerfile, ctest label `image`): built by
scripts/build-image.sh from this build's .deb (cpack) on a base debootstrapped from Debian's
mirror, then run with podman as a cluster would run it: a coordinator container, and two "hosts"
(podman pods: one network address and one IPC namespace each, as a Kubernetes pod) each running two
worker daemon containers, all on a podman network of the test's own, with mutual TLS. A 4-rank job
submitted from a fifth container passes the collectives check with exact values.

    sudo RINGMASTER_BUILD_DIR=build /usr/bin/python3 -m pytest -q tests/image

Skipped, saying why, where podman cannot run containers (not root, podman or debootstrap missing,
a kernel or cgroup layout podman refuses). Every container, pod and network a test made is removed
when it ends, passed or not, and a later run removes what a killed run left behind.
"""
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("RINGMASTER_BUILD_DIR", REPO / "build")).resolve()
STORE = Path(os.environ.get("RINGMASTER_PODMAN_DIR", BUILD / "podman")).resolve()
IMAGE = "localhost/ringmaster:test"
RUN_LABEL = "ringmaster-test-run"  # its value: the pid of the test process that made the object
CA = "/etc/ringmaster/ca"  # where the test's certificates are mounted in every container


def podman_env():
    r = subprocess.run(["bash", str(REPO / "scripts" / "build-image.sh"), "--env"],
                       capture_output=True, text=True, check=True, timeout=30,
                       env=dict(os.environ, RINGMASTER_PODMAN_DIR=str(STORE)))
    env = dict(os.environ)
    for assignment in r.stdout.split()[1:]:  # "export A=x B=y"
        key, value = assignment.split("=", 1)
        env[key] = value
    return env


def podman(*args, timeout=120, check=True, env=None):
    r = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout,
                       env=env or ENV)
    if check and r.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: {r.stdout}{r.stderr}")
    return r


def unavailable_reason():
    if os.geteuid() != 0:
        return "podman runs rootful here: run the image tests as root"
    for tool in ("podman", "debootstrap", "cpack"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/install-deps.sh installs it)"
    return None


ENV = None
DEB = None  # the .deb the image was built from
BASE = "localhost/ringmaster-base:bookworm"  # scripts/build-image.sh's debootstrapped Debian 12


def remove_test_objects(run=None):
    """Removes the containers, pods and networks labelled by run `run` (None: by runs whose process
    is gone)."""
    def stale(labels):
        value = (labels or {}).get(RUN_LABEL)
        if value is None:
            return False
        if run is not None:
            return value == str(run)
        try:
            os.kill(int(value), 0)
            return False
        except (ProcessLookupError, ValueError):
            return True

    containers = json.loads(podman("ps", "-a", "--format", "json", check=False).stdout or "[]")
    names = [c["Id"] for c in containers if stale(c.get("Labels"))]
    if names:
        podman("rm", "-f", "-t", "2", *names, check=False)
    pods = json.loads(podman("pod", "ps", "--format", "json", check=False).stdout or "[]")
    names = [p["Id"] for p in pods if stale(p.get("Labels"))]
    if names:
        podman("pod", "rm", "-f", *names, check=False)
    networks = json.loads(podman("network", "ls", "--format", "json", check=False).stdout or "[]")
    names = [n["name"] for n in networks if stale(n.get("labels"))]
    if names:
        podman("network", "rm", "-f", *names, check=False)


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    global ENV
    ENV = podman_env()
    remove_test_objects()
    out = tmp_path_factory.mktemp("deb")
    r = subprocess.run(["cpack", "--config", str(BUILD / "CPackConfig.cmake"), "-B", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=BUILD)
    assert r.returncode == 0, r.stdout + r.stderr
    (deb,) = out.glob("ringmaster_*_amd64.deb")
    global DEB
    DEB = deb
    r = subprocess.run(["bash", str(REPO / "scripts" / "build-image.sh"), "--deb", str(deb),
                        "--tag", IMAGE], capture_output=True, text=True, timeout=900,
                       env=dict(os.environ, RINGMASTER_PODMAN_DIR=str(STORE)))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    # A machine whose kernel or cgroups podman cannot run containers on: skip, saying so.
    trial = podman("run", "--rm", IMAGE, "true", check=False)
    if trial.returncode != 0:
        pytest.skip(f"podman cannot run containers here: {trial.stderr.strip()[-500:]}")
    return IMAGE


def labelled():
    return ["--label", f"{RUN_LABEL}={os.getpid()}"]


def test_the_image_holds_the_package_and_runs_a_local_job(image, tmp_path):
    script = r"""
set -e
dpkg-query -W -f='${Package} ${Version} ${Status}\n' ringmaster
for c in ringmaster ringmaster-coordinator ringmaster-worker; do command -v "$c"; done
python3 -c 'import ringmaster.jobs, ringmaster._ringmaster as m; print("python", m.__file__)'
for c in g++ cc cmake; do if command -v "$c"; then echo "a compiler in the runtime image"; exit 1; fi; done
test ! -e /src && test ! -e /build
id ringmaster
ringmaster local --np 2 -- /usr/libexec/ringmaster/collectives_check
"""
    r = podman("run", "--rm", *labelled(), image, "sh", "-c", script, timeout=300)
    out = r.stdout
    assert re.search(r"^ringmaster \S+ install ok installed$", out, re.M), out
    assert "/usr/bin/ringmaster\n/usr/bin/ringmaster-coordinator\n/usr/bin/ringmaster-worker\n" \
        in out, out
    assert "python /usr/lib/python3/dist-packages/ringmaster/_ringmaster.cpython-" in out, out
    assert "uid=10001(ringmaster) gid=10001(ringmaster)" in out, out
    for rank in range(2):
        assert re.search(rf"^\[{rank}\] collectives_check: rank {rank}: \d+ checks passed, 0 failed$",
                         out, re.M), out


def test_a_gpu_slot_in_the_cpu_image_is_refused_saying_what_is_missing(image):
    """No CUDA in the image: a GPU worker says why at start, the daemon (and everything else)
    still runs."""
    r = podman("run", "--rm", *labelled(), image, "ringmaster-worker", "--device", "cuda:0",
               "--insecure", "--coordinator", "127.0.0.1:1", check=False, timeout=60)
    assert r.returncode != 0
    if (BUILD / "lib/ringmaster/libringmaster_cuda.so").exists():
        assert re.search(r"--device cuda:0: the GPU data plane "
                         r"\(/usr/lib/ringmaster/libringmaster_cuda\.so\) cannot be loaded: "
                         r"lib(nccl|cudart)\.so\.\d+: cannot open shared object file", r.stderr), \
            r.stderr
    else:
        assert "--device cuda:0: this build has no CUDA/NCCL" in r.stderr, r.stderr


def test_the_cloud_init_installer_installs_the_package_on_a_fresh_debian(image, tmp_path):
    """deploy/cloud-init/gpu-worker.yaml's installer, as written, on the bare Debian 12 base (with
    curl, which cloud images have): the package and its dependencies installed from apt, its user
    made, a worker unit enabled per GPU. systemd and the GPUs are stand-ins that record what they
    are asked (two GPUs); the installed package then runs a local job."""
    import yaml
    config = yaml.safe_load((REPO / "deploy/cloud-init/gpu-worker.yaml").read_text())
    files = {f["path"]: f["content"] for f in config["write_files"]}
    (tmp_path / "ringmaster-install").write_text(files["/usr/local/sbin/ringmaster-install"])
    (tmp_path / "worker.env").write_text(files["/etc/ringmaster/worker.env"])
    (tmp_path / "package-url").write_text(f"file://{DEB}\n")
    script = r"""
set -e
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq && apt-get install -y -qq --no-install-recommends curl >/dev/null
mkdir -p /etc/ringmaster
cp /in/worker.env /in/package-url /etc/ringmaster/
printf '#!/bin/sh
echo "$*" >> /tmp/systemctl.calls
' > /usr/local/bin/systemctl
printf '#!/bin/sh
echo "GPU 0: NVIDIA H200 (UUID: GPU-0)"
echo "GPU 1: NVIDIA H200 (UUID: GPU-1)"
'   > /usr/local/bin/nvidia-smi
chmod +x /usr/local/bin/systemctl /usr/local/bin/nvidia-smi
bash /in/ringmaster-install >/dev/null
echo "== calls"; cat /tmp/systemctl.calls
echo "== env"; cat /etc/ringmaster/worker-cuda1.env
echo "== user"; getent passwd ringmaster | cut -d: -f1,6,7
echo "== unit"; grep ^ExecStart= /usr/lib/systemd/system/ringmaster-worker@.service
echo "== local"
ringmaster local --np 2 -- /usr/libexec/ringmaster/collectives_check
"""
    r = podman("run", "--rm", *labelled(), "--network", "host", "-v", f"{tmp_path}:/in:ro",
               "-v", f"{DEB}:{DEB}:ro", BASE, "bash", "-c", script, timeout=600)
    out = r.stdout
    assert ("== calls\ndaemon-reload\nenable --now ringmaster-worker@cuda0\n"
            "enable --now ringmaster-worker@cuda1\n") in out, out + r.stderr
    assert "== env\nRINGMASTER_WORKER_INSTANCE_FLAGS=--metrics-listen 0.0.0.0:9402\n" in out, out
    assert "== user\nringmaster:/var/lib/ringmaster:/usr/sbin/nologin\n" in out, out
    assert "== unit\nExecStart=/usr/bin/ringmaster-worker --device %i " in out, out
    for rank in range(2):
        assert re.search(rf"^\[{rank}\] collectives_check: rank {rank}: \d+ checks passed, 0 failed$",
                         out, re.M), out


class ContainerCluster:
    """A coordinator container and `hosts` pods of `slots` worker containers each, on a network of
    their own, with the test's certificates mounted read-only at CA."""

    def __init__(self, image, ca, hosts=2, slots=2):
        self.image = image
        self.ca = ca
        self.net = f"rmtest{os.getpid()}"
        podman("network", "create", *labelled(), self.net)
        self.mount = ["-v", f"{ca}:{CA}:ro"]
        podman("run", "-d", *labelled(), "--name", f"{self.net}-coordinator", "--network", self.net,
               "--network-alias", "coordinator", *self.mount, image,
               "ringmaster-coordinator", "--listen", "0.0.0.0:50051",
               "--tls-cert", f"{CA}/coordinator/tls.crt", "--tls-key", f"{CA}/coordinator/tls.key",
               "--tls-ca", f"{CA}/ca.crt", "--metrics-listen", "0.0.0.0:9400")
        self.hosts = [f"host-{chr(ord('a') + i)}" for i in range(hosts)]
        for host in self.hosts:
            pod = f"{self.net}-{host}"
            podman("pod", "create", *labelled(), "--name", pod, "--hostname", host,
                   "--network", self.net)
            for slot in range(slots):
                podman("run", "-d", *labelled(), "--pod", pod, "--name", f"{pod}-w{slot}",
                       *self.mount,
                       "-e", f"RINGMASTER_TLS_CERT={CA}/worker/tls.crt",
                       "-e", f"RINGMASTER_TLS_KEY={CA}/worker/tls.key",
                       "-e", f"RINGMASTER_TLS_CA={CA}/ca.crt", image,
                       "ringmaster-worker", "--coordinator", "coordinator:50051", "--device", "cpu",
                       "--host-name", host, "--socket", f"/run/ringmaster/w{slot}.sock",
                       "--metrics-listen", f"0.0.0.0:{9401 + slot}")
        # One client container, kept running, for the CLI (`podman exec` is quicker than a run).
        podman("run", "-d", *labelled(), "--name", f"{self.net}-client", "--network", self.net,
               *self.mount, image, "sleep", "600")

    def exec(self, *args, timeout=60, check=True):
        return podman("exec", f"{self.net}-client", *args, timeout=timeout, check=check)

    def cli(self, *args, timeout=60):
        return self.exec("ringmaster", "--coordinator", "coordinator:50051",
                         "--tls-cert", f"{CA}/user/tls.crt", "--tls-key", f"{CA}/user/tls.key",
                         "--tls-ca", f"{CA}/ca.crt", *args, timeout=timeout).stdout

    def address(self, host):
        info = json.loads(podman("pod", "inspect", f"{self.net}-{host}").stdout)
        infra = info[0]["InfraContainerID"] if isinstance(info, list) else info["InfraContainerID"]
        networks = json.loads(podman("inspect", infra).stdout)[0]["NetworkSettings"]["Networks"]
        return networks[self.net]["IPAddress"]

    def idle(self):
        return [w for w in json.loads(self.cli("workers", "--json")).get("workers", [])
                if w["state"] == "WORKER_STATE_IDLE"]


def wait_for(predicate, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@pytest.fixture
def cluster(image, tmp_path):
    ca = tmp_path / "ca"
    subprocess.run(["bash", str(REPO / "scripts" / "dev-ca.sh"), str(ca),
                    "--san", "DNS:coordinator"], check=True, capture_output=True, timeout=60)
    try:
        yield ContainerCluster(image, ca)
    finally:
        remove_test_objects(run=os.getpid())


def test_a_4_rank_job_across_two_hosts_of_containers_passes_the_collectives_check(cluster):
    wait_for(lambda: len(cluster.idle()) == 4, 60, "4 idle workers")
    # The probes Kubernetes would ask, at the coordinator's metrics port.
    probe = ("import urllib.request as u\n"
             "for p in ('healthz', 'readyz'):\n"
             "    r = u.urlopen(f'http://coordinator:9400/{p}', timeout=5)\n"
             "    print(p, r.status)\n")
    assert cluster.exec("python3", "-c", probe).stdout == "healthz 200\nreadyz 200\n"

    job = json.loads(cluster.cli("--json", "submit", "--np", "4", "--processes-per-host", "2",
                                 "--", "/usr/libexec/ringmaster/collectives_check"))
    watch = cluster.cli("watch", job["id"], timeout=240)
    assert re.search(r"SUCCEEDED +all 4 ranks exited 0$", watch, re.M), watch
    status = json.loads(cluster.cli("status", job["id"], "--json"))
    assert status["state"] == "JOB_STATE_SUCCEEDED", status
    by_rank = {r.get("rank", 0): r for r in status["ranks"]}  # JSON leaves out zero values
    assert sorted(by_rank) == [0, 1, 2, 3], status
    for rank, r in by_rank.items():
        host = cluster.hosts[rank // 2]
        assert (r["host"], r["address"]) == (host, cluster.address(host)), status
        assert (r.get("local_rank", 0), r["local_size"]) == (rank % 2, 2), status
        assert (r.get("cross_rank", 0), r["cross_size"]) == (rank // 2, 2), status
    logs = cluster.cli("logs", job["id"])
    for rank in range(4):
        assert re.search(rf"^\[{rank}\] collectives_check: rank {rank}: \d+ checks passed, 0 failed$",
                         logs, re.M), logs

    # podman's init (containers.conf) passes SIGTERM on: the coordinator stops at once, cleanly.
    start = time.monotonic()
    podman("stop", "-t", "10", f"{cluster.net}-coordinator")
    assert time.monotonic() - start < 5
    state = json.loads(podman("inspect", f"{cluster.net}-coordinator").stdout)[0]["State"]
    assert state["ExitCode"] == 0, state
