"""The Kubernetes manifests as shipped (deploy/kubernetes), with no API server: rendered with
`kubectl kustomize`, checked for what a platform engineer relies on, then run. Each pod's container
runs its exact command, args and env from the rendered YAML in a namespace host standing for its
node (tests/multihost/netns.py): `$(VAR)` expanded from its env as the kubelet does (values,
ConfigMap keys, the downward API's node name and pod IP); the Service's DNS name resolved to the
coordinator pod's address (the host's /etc/hosts); the image's /usr/bin/ringmaster* and its volumes'
mount paths pointed at the build and at directories of the test's own. The probes are asked at the
paths and ports the YAML names, and the example Job runs through the daemons.
"""
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from netns import assert_collectives_passed, hosts_or_skip, wait_for

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("RINGMASTER_BIN_DIR", REPO / "build" / "bin")).resolve()
K8S = REPO / "deploy" / "kubernetes"
KUBECTL = shutil.which("kubectl")
# Where the image (the .deb) installs Ringmaster, and where this build has it.
IMAGE_PATHS = {**{f"/usr/bin/{b}": f"{BIN}/{b}"
                  for b in ("ringmaster", "ringmaster-coordinator", "ringmaster-worker")},
               "/usr/libexec/ringmaster/": f"{BIN}/"}

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed "
                                "(scripts/install-deps.sh installs Debian's kubernetes-client)")


def render(path):
    r = subprocess.run([KUBECTL, "kustomize", str(path)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def find(docs, kind, name):
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def test_the_overlays_render_with_probes_security_and_monitoring():
    cpu = render(K8S / "overlays" / "cpu")
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in cpu)
    assert kinds == [
        ("ConfigMap", "ringmaster-coordinator"), ("DaemonSet", "ringmaster-worker"),
        ("Deployment", "ringmaster-coordinator"), ("Namespace", "ringmaster"),
        ("PersistentVolumeClaim", "ringmaster-coordinator-state"),
        ("PodDisruptionBudget", "ringmaster-worker"), ("Service", "ringmaster-coordinator"),
        ("Service", "ringmaster-worker-metrics"), ("ServiceMonitor", "ringmaster")]
    assert all(d["metadata"].get("namespace") == "ringmaster" for d in cpu if d["kind"] != "Namespace")
    for kind, name in [("Deployment", "ringmaster-coordinator"), ("DaemonSet", "ringmaster-worker")]:
        pod = find(cpu, kind, name)["spec"]["template"]
        assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
        for c in pod["spec"]["containers"]:
            assert c["image"] == "localhost/ringmaster:0.1.0"
            assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
            assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            assert c["securityContext"]["readOnlyRootFilesystem"] is True
            assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
            assert "requests" in c["resources"]
    service = find(cpu, "Service", "ringmaster-coordinator")
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {"grpc": 50051, "metrics": 9400}
    # Mutual TLS everywhere, from Secrets (tls.crt, tls.key, ca.crt as cert-manager writes them).
    pod = find(cpu, "Deployment", "ringmaster-coordinator")["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert {"--tls-cert=/etc/ringmaster/tls/tls.crt", "--tls-key=/etc/ringmaster/tls/tls.key",
            "--tls-ca=/etc/ringmaster/tls/ca.crt"} <= set(args), args
    assert {v["name"]: v.get("secret", {}).get("secretName") for v in pod["volumes"]}["tls"] == \
        "ringmaster-coordinator-tls"
    for doc, kind, name, secret in [(cpu, "DaemonSet", "ringmaster-worker", "ringmaster-worker-tls"),
                                    (render(K8S / "overlays" / "gpu"), "DaemonSet",
                                     "ringmaster-worker", "ringmaster-worker-tls"),
                                    (render(K8S / "example"), "Job", "ringmaster-collectives-check",
                                     "ringmaster-user-tls")]:
        pod = find(doc, kind, name)["spec"]["template"]["spec"]
        assert {v["name"]: v.get("secret", {}).get("secretName") for v in pod["volumes"]}["tls"] == secret
        for c in pod["containers"]:
            env = {e["name"]: e.get("value") for e in c["env"]}
            assert env["RINGMASTER_TLS_CA"] == "/etc/ringmaster/tls/ca.crt", (name, c["name"])
            assert {"name": "tls", "mountPath": "/etc/ringmaster/tls", "readOnly": True} in \
                c["volumeMounts"], (name, c["name"])

    gpu = render(K8S / "overlays" / "gpu")
    pod = find(gpu, "DaemonSet", "ringmaster-worker")["spec"]["template"]["spec"]
    assert pod["hostIPC"] is True
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    containers = pod["containers"]
    assert [c["name"] for c in containers] == [f"worker-cuda{i}" for i in range(8)]
    sockets, ports = set(), set()
    for c in containers:
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert "--device=cuda:0" in c["args"]  # the device plugin's one GPU, as the container sees it
        sockets.update(a for a in c["args"] if a.startswith("--socket="))
        ports.add(c["readinessProbe"]["httpGet"]["port"])
    assert len(sockets) == 8 and ports == set(range(9401, 9409))
    # Prometheus reaches every GPU daemon: the metrics Service names each port, the ServiceMonitor
    # scrapes each (and the coordinator's).
    service = find(gpu, "Service", "ringmaster-worker-metrics")
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {
        f"metrics-{i}": 9401 + i for i in range(8)}
    endpoints = find(gpu, "ServiceMonitor", "ringmaster")["spec"]["endpoints"]
    assert [e["port"] for e in endpoints] == ["metrics"] + [f"metrics-{i}" for i in range(8)]




def test_the_ha_overlay_runs_two_coordinator_replicas_on_etcd():
    ha = render(K8S / "overlays" / "ha")
    # No volume a second replica could not mount: the jobs are in etcd.
    assert not [d for d in ha if d["kind"] == "PersistentVolumeClaim"]
    deployment = find(ha, "Deployment", "ringmaster-coordinator")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    pod = deployment["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    args = c["args"]
    assert {"--store=$(ETCD)", "--leader-ttl=$(LEADER_TTL)",
            "--advertise-address=$(POD_IP):50051", "--state-dir=/var/lib/ringmaster/state",
            "--tls-cert=/etc/ringmaster/tls/tls.crt"} <= set(args), args
    env = {e["name"]: e.get("valueFrom") for e in c["env"]}
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    config = find(ha, "ConfigMap", "ringmaster-coordinator")["data"]
    assert config["ETCD"].startswith("etcd://") and config["LEADER_TTL"] == "5s"
    assert {v["name"]: v for v in pod["volumes"]}["state"] == {"name": "state", "emptyDir": {}}
    # Only the leader is ready (a follower's /readyz is 503), so the Service sends it everything.
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0][
        "podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"


# The Secrets the manifests mount, and the scripts/dev-ca.sh pair each holds in the test (an operator
# makes them as docs/security.md shows).
SECRET_PAIRS = {"ringmaster-coordinator-tls": "coordinator", "ringmaster-worker-tls": "worker",
                "ringmaster-user-tls": "user"}


class Pod:
    """One pod's container, run as the kubelet would on the node `host`."""

    def __init__(self, docs, pod_spec, container, host, tmp, name, extra_env=None):
        self.host, self.name, self.container = host, name, container
        env = dict(extra_env or {})
        for e in container.get("env", []):
            if "value" in e:
                env[e["name"]] = e["value"]
            elif ref := e["valueFrom"].get("configMapKeyRef"):
                env[e["name"]] = find(docs, "ConfigMap", ref["name"])["data"][ref["key"]]
            else:
                field = e["valueFrom"]["fieldRef"]["fieldPath"]
                env[e["name"]] = {"spec.nodeName": host.name, "status.podIP": host.address}[field]
        mounts = {}
        volumes = {v["name"]: v for v in pod_spec.get("volumes", [])}
        for m in container.get("volumeMounts", []):
            d = tmp / name / m["name"]
            # A hostPath is the node's: every pod on the node that mounts it shares it.
            if host_path := volumes.get(m["name"], {}).get("hostPath"):
                d = tmp / f"{host.name}{host_path['path'].replace('/', '-')}"
            d.mkdir(parents=True, exist_ok=True)
            mounts[m["mountPath"]] = str(d)
            # A Secret volume holds what the Secret holds: here the pair dev-ca.sh made for it.
            if secret := volumes.get(m["name"], {}).get("secret"):
                pair = SECRET_PAIRS[secret["secretName"]]
                for f in ("tls.crt", "tls.key", "ca.crt"):
                    shutil.copy(tmp / "ca" / pair / f, d / f)

        paths = {**IMAGE_PATHS, **mounts}
        # One pass, each path where a word or a flag's value starts (a mount's directory is itself
        # under /tmp: it must not be replaced twice).
        pattern = re.compile(r"(^|[=\s])(" + "|".join(
            re.escape(p) for p in sorted(paths, key=len, reverse=True)) + r")(?=/|$|\s)?")

        def localize(word):
            word = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], word)
            return pattern.sub(lambda m: m.group(1) + paths[m.group(2)], word)

        self.argv = [localize(w) for w in container["command"] + container.get("args", [])]
        self.env = {"PATH": f"{BIN}:/usr/local/bin:/usr/bin:/bin", "TMPDIR": mounts.get("/tmp", str(tmp)),
                    **{k: pattern.sub(lambda m: m.group(1) + paths[m.group(2)], v)
                       for k, v in env.items()}}
        self.log = tmp / f"{name}.log"

    def start(self):
        self.proc = self.host.popen(self.argv, self.log, env=self.env)
        return self

    def get(self, port, path):
        url = f"http://{self.host.address}:{port}{path}"
        code = ("import sys, urllib.request, urllib.error\n"
                f"try: print(urllib.request.urlopen('{url}', timeout=3).status)\n"
                "except urllib.error.HTTPError as e: print(e.code)\n"
                "except OSError: print(0)")
        return int(self.host.run(["/usr/bin/python3", "-c", code]).stdout.strip() or 0)

    def wait_probes(self, timeout=30):
        """Readiness, then liveness, each 200 at the path and port the YAML names."""
        for probe in ("readinessProbe", "livenessProbe"):
            http = self.container[probe]["httpGet"]
            wait_for(lambda: self.get(http["port"], http["path"]) == 200, timeout,
                     f"{self.name}'s {probe} {http['path']}:{http['port']}\n{self.log.read_text()}")


@pytest.fixture
def hosts():
    yield from hosts_or_skip(3, names=["node-0", "node-1", "node-2"])


def test_the_cpu_overlay_runs_as_rendered_and_the_example_job_succeeds(hosts, tmp_path):
    subprocess.run(["bash", str(REPO / "scripts" / "dev-ca.sh"), str(tmp_path / "ca")], check=True,
                   capture_output=True, timeout=60)
    docs = render(K8S / "overlays" / "cpu")
    coordinator = find(docs, "Deployment", "ringmaster-coordinator")["spec"]["template"]["spec"]
    worker = find(docs, "DaemonSet", "ringmaster-worker")["spec"]["template"]["spec"]
    service = find(docs, "Service", "ringmaster-coordinator")["metadata"]["name"]
    # The coordinator pod on node-0; the Service's name resolves to it everywhere (kube-dns).
    for h in hosts.hosts:
        h.set_hosts_file({service: hosts[0].address,
                          f"{service}.ringmaster.svc.cluster.local": hosts[0].address})
    c = Pod(docs, coordinator, coordinator["containers"][0], hosts[0], tmp_path, "coordinator").start()
    c.wait_probes()
    # The DaemonSet: a worker pod on every node.
    workers = [Pod(docs, worker, worker["containers"][0], h, tmp_path, f"worker-{h.name}").start()
               for h in hosts.hosts]
    for w in workers:
        w.wait_probes()

    def cli(*args):
        ca = tmp_path / "ca"
        r = hosts[0].run([str(BIN / "ringmaster"), "--coordinator", f"{service}:50051",
                          "--tls-ca", str(ca / "ca.crt"), "--tls-cert", str(ca / "user" / "tls.crt"),
                          "--tls-key", str(ca / "user" / "tls.key"), *args])
        assert r.returncode == 0, r.stderr
        return r.stdout

    listed = json.loads(cli("workers", "--json"))["workers"]
    # Each daemon named by its node (the downward API's spec.nodeName), on its pod's address.
    assert sorted((w["host"], w["address"], w["state"]) for w in listed) == [
        (h.name, h.address, "WORKER_STATE_IDLE") for h in hosts.hosts]

    # The example Job's pod, on node-1.
    job_docs = render(K8S / "example")
    spec = find(job_docs, "Job", "ringmaster-collectives-check")["spec"]["template"]["spec"]
    launcher = Pod(job_docs, spec, spec["containers"][0], hosts[1], tmp_path, "launcher").start()
    rc = launcher.proc.wait(180)
    out = launcher.log.read_text()
    assert rc == 0, out
    job = re.search(r"^submitted (job-\d+)$", out, re.M).group(1)
    assert "SUCCEEDED" in out, out
    done = json.loads(cli("status", job, "--json"))
    assert len({r["host"] for r in done["ranks"]}) == 2, done  # --processes-per-host 1
    logs = cli("logs", job)
    assert_collectives_passed(logs, 2)

    # The Indexed Job whose pods attach to their node's daemon: its pods start first (on node-2
    # with index 0, node-1 with index 1: the rank follows the index, not the node), then the
    # launcher submits the attached job on node-0.
    launcher_spec = find(job_docs, "Job", "ringmaster-indexed-launcher")["spec"]["template"]["spec"]
    indexed = find(job_docs, "Job", "ringmaster-indexed-training")["spec"]
    assert (indexed["completionMode"], indexed["completions"], indexed["parallelism"]) == (
        "Indexed", 2, 2)
    training = indexed["template"]["spec"]
    assert training["securityContext"]["runAsUser"] == 10001
    pods = [Pod(job_docs, training, training["containers"][0], hosts[2 - index], tmp_path,
                f"train-{index}", extra_env={"JOB_COMPLETION_INDEX": str(index)}).start()
            for index in range(2)]
    launcher = Pod(job_docs, launcher_spec, launcher_spec["containers"][0], hosts[0], tmp_path,
                   "indexed-launcher").start()
    rc = launcher.proc.wait(180)
    out = launcher.log.read_text()
    assert rc == 0, out + "".join(p.log.read_text() for p in pods)
    job = re.search(r"^submitted (job-\d+)$", out, re.M).group(1)
    assert re.search(r"SUCCEEDED +all 2 ranks exited 0$", out, re.M), out
    done = json.loads(cli("status", job, "--json"))
    assert done["spec"]["attached"] is True and "command" not in done["spec"], done
    assert [(r.get("rank", 0), r["host"]) for r in done["ranks"]] == [(0, "node-2"),
                                                                      (1, "node-1")], done
    for index, pod in enumerate(pods):
        assert pod.proc.wait(30) == 0, pod.log.read_text()
        assert re.search(rf"^collectives_check: rank {index}: \d+ checks passed, 0 failed$",
                         pod.log.read_text(), re.M), pod.log.read_text()
