"""Observability end to end, with the real tools: a 2-rank job under `ringmaster local
--metrics-port-base`, its three /metrics endpoints checked by `promtool check metrics`, scraped by a
real Prometheus server, and every PromQL expression of the Grafana dashboard
(deploy/grafana/ringmaster.json) run through Prometheus's HTTP API and required to return data. The
scrape configurations in deploy/prometheus/ are checked too: the local one by promtool, the
Kubernetes one's relabelling by a real Prometheus (its pod discovery replaced by a file of targets
that carry the same __meta_kubernetes_* labels, because Debian builds Prometheus without Kubernetes
discovery).

Run by ctest (label `observability`) as:
    /usr/bin/python3 -m pytest -q tests/observability/test_prometheus.py
with RINGMASTER_BIN_DIR pointing at build/bin. Needs Debian's `prometheus` package (skipped with the
reason otherwise). Standard library and pytest only. Every wait has a deadline; the fixtures stop
what they started (SIGINT to `ringmaster local`, which cancels the job and stops its coordinator and
daemons) and check that none of those processes is left.
"""
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("RINGMASTER_BIN_DIR", os.path.join(REPO, "build", "bin"))
DASHBOARD = os.path.join(REPO, "deploy", "grafana", "ringmaster.json")
PROM_LOCAL = os.path.join(REPO, "deploy", "prometheus", "prometheus-local.yml")
PROM_K8S = os.path.join(REPO, "deploy", "prometheus", "prometheus-kubernetes.yml")
METRICS_DOC = os.path.join(REPO, "docs", "metrics.md")
STEPS = 2000  # train_loop allreduces 1 MiB every 20 ms: about 45 s, longer than this module needs
QUERY_DEADLINE = 40.0  # seconds for all the dashboard's expressions together


def tool(name):
    for candidate in (f"/usr/bin/{name}", shutil.which(name)):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


PROMETHEUS = tool("prometheus")
PROMTOOL = tool("promtool")
needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None or PROMTOOL is None,
    reason="needs Prometheus and promtool (/usr/bin/prometheus, /usr/bin/promtool: Debian's "
           "`prometheus` package; scripts/install-deps.sh installs it)")


# ---------------------------------------------------------------------------------------------------
# Helpers


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except (OSError, urllib.error.URLError, ValueError) as e:  # not up yet
            value, last = None, e
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}"
                         + (f" (last error: {last})" if last else ""))


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def port_free(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_ports(count):
    """A base such that base .. base+count-1 are free (below the ephemeral range, so that ports the
    processes pick with port 0 do not collide with them)."""
    for _ in range(200):
        base = random.randrange(20000, 32000 - count)
        if all(port_free(base + i) for i in range(count)):
            return base
    raise AssertionError("no free range of ports")


def proc_start_time(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except OSError:
        return None


def descendants(root):
    """{pid: start time} of the live processes below `root`."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = {}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            start = proc_start_time(child)
            if start is not None:
                out[child] = start
                todo.append(child)
    return out


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def still_alive(procs):
    """The processes of `procs` ({pid: start time}) that still run (same pid and start time) and are
    not zombies."""
    alive = {}
    for pid, start in procs.items():
        if proc_start_time(pid) != start:
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive[pid] = cmdline(pid)
    return alive


def metric_names(expr):
    """The ringmaster_* metric names an expression refers to."""
    return set(re.findall(r"\bringmaster_[a-zA-Z0-9_]+", expr))


def registered_metrics():
    """Families registered in the C++ code: name -> type (counter, gauge, histogram)."""
    out = {}
    for d in ("coordinator", "worker", "common", "cli"):
        root = os.path.join(REPO, d)
        for dirpath, _, files in os.walk(root):
            for name in files:
                if not name.endswith((".cc", ".h")):
                    continue
                with open(os.path.join(dirpath, name)) as f:
                    text = f.read()
                for kind, metric in re.findall(r"Get(Counter|Gauge|Histogram)\(\s*\"(ringmaster_\w+)\"",
                                               text):
                    out[metric] = kind.lower()
    return out


def series_names(families):
    """The series names a set of families ({name: type}) exposes."""
    names = set()
    for name, kind in families.items():
        names.add(name)
        if kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return names


def exposed_families(text):
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))


# ---------------------------------------------------------------------------------------------------
# The dashboard


def load_dashboard():
    with open(DASHBOARD) as f:
        return json.load(f)


def all_panels(dashboard):
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])  # collapsed rows hold their panels


def dashboard_targets(dashboard):
    """(panel title, refId, expr) for every query of every panel."""
    return [(p["title"], t["refId"], t["expr"])
            for p in all_panels(dashboard) for t in p.get("targets", []) if t.get("expr")]


def substitute(expr, job):
    """What Grafana would send with `job` selected, every rank, a 1 m rate interval."""
    for name, value in (("__rate_interval", "1m"), ("__interval", "5s"), ("job", job),
                        ("rank", ".*")):
        expr = expr.replace("${%s}" % name, value).replace("$" + name, value)
    assert "$" not in expr, f"a template variable left unsubstituted in {expr}"
    return expr


# ---------------------------------------------------------------------------------------------------
# Processes: the job and Prometheus


class LocalJob:
    """`ringmaster local --np 2 --processes-per-host 1 --metrics-port-base BASE -- train_loop`."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.proc = None
        self.procs = {}  # {pid: start time} of ringmaster local and everything below it
        last_error = None
        for attempt in range(3):  # a port taken between the check and the bind: another base
            self.base = free_ports(3)
            try:
                self.start(attempt)
                return
            except AssertionError as e:
                last_error = e
                self.stop()
        raise last_error

    @property
    def endpoints(self):
        return [f"127.0.0.1:{self.base + i}" for i in range(3)]

    def start(self, attempt):
        self.out_path = os.path.join(self.tmp, f"local{attempt}.out")
        self.err_path = os.path.join(self.tmp, f"local{attempt}.err")
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(
                [f"{BIN}/ringmaster", "local", "--np", "2", "--processes-per-host", "1",
                 "--metrics-port-base", str(self.base), "--", f"{BIN}/train_loop", str(STEPS)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True)
        self.procs = {self.proc.pid: proc_start_time(self.proc.pid)}

        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"ringmaster local exited ({self.proc.returncode}): "
                                     f"{self.output()}")
            texts = [http_get(f"http://{e}/metrics", timeout=2) for e in self.endpoints]
            m = re.search(r'^ringmaster_negotiation_cycles_total\{job="([^"]+)"\} [1-9]', texts[0],
                          re.M)
            workers_busy = all(re.search(r'^ringmaster_collective_bytes_total\{.*op="allreduce"\} '
                                         r'[1-9]', t, re.M) for t in texts[1:])
            return m and workers_busy and m.group(1)

        self.job_id = wait_for(ready, 30, f"the job's metrics on {self.endpoints}")
        self.procs.update(descendants(self.proc.pid))

    def output(self):
        text = ""
        for path in (self.out_path, self.err_path):
            with open(path) as f:
                text += f.read()[-3000:]
        return text

    def stop(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.procs.update(descendants(self.proc.pid))
            self.proc.send_signal(signal.SIGINT)  # cancels the job, stops its coordinator and daemons
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
                raise AssertionError(f"ringmaster local ignored SIGINT for 20 s: {self.output()}")
        left = {}
        try:
            wait_for(lambda: not still_alive(self.procs), 10, "the job's processes to exit")
        except AssertionError:
            left = still_alive(self.procs)
            for pid in left:  # ours, by pid and start time
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        self.proc = None
        assert not left, f"processes left behind after ringmaster local exited: {left}"


class Prometheus:
    def __init__(self, tmp, name, config_text, extra_files=()):
        self.dir = os.path.join(tmp, name)
        os.makedirs(self.dir)
        for filename, content in extra_files:
            with open(os.path.join(self.dir, filename), "w") as f:
                f.write(content)
        self.config = os.path.join(self.dir, "prometheus.yml")
        with open(self.config, "w") as f:
            f.write(config_text)
        check = subprocess.run([PROMTOOL, "check", "config", self.config], capture_output=True,
                               text=True, timeout=30)
        assert check.returncode == 0, check.stdout + check.stderr
        last = None
        for _ in range(3):
            self.port = free_ports(1)
            self.url = f"http://127.0.0.1:{self.port}"
            self.log_path = os.path.join(self.dir, f"prometheus-{self.port}.log")
            with open(self.log_path, "w") as log:
                self.proc = subprocess.Popen(
                    [PROMETHEUS, f"--config.file={self.config}",
                     f"--storage.tsdb.path={os.path.join(self.dir, 'data')}",
                     f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True)
            self.start_time = proc_start_time(self.proc.pid)
            try:
                wait_for(lambda: self.alive() and http_get(f"{self.url}/-/ready", timeout=2), 30,
                         "Prometheus to be ready")
                return
            except AssertionError as e:
                last = e
                self.stop()
        raise last

    def alive(self):
        if self.proc.poll() is not None:
            with open(self.log_path) as f:
                raise AssertionError(f"prometheus exited ({self.proc.returncode}): {f.read()[-3000:]}")
        return True

    def api(self, path, **params):
        query = urllib.parse.urlencode(params, doseq=True)
        try:
            body = http_get(f"{self.url}/api/v1/{path}?{query}", timeout=10)
        except urllib.error.HTTPError as e:  # 400 bad_data, 422 execution error: the body says why
            body = e.read().decode()
        return json.loads(body)

    def targets(self):
        return self.api("targets")["data"]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        left = still_alive({self.proc.pid: self.start_time})
        assert not left, f"prometheus left behind: {left}"


def scrape_config(endpoints):
    targets = ", ".join(f'"{e}"' for e in endpoints)
    return f"""global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: ringmaster
    honor_labels: true
    static_configs:
      - targets: [{targets}]
"""


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return str(tmp_path_factory.mktemp("observability"))


@pytest.fixture(scope="module")
def job(tmp):
    if PROMETHEUS is None or PROMTOOL is None:
        pytest.skip("needs /usr/bin/prometheus and /usr/bin/promtool (Debian's `prometheus`)")
    for name in ("ringmaster", "ringmaster-coordinator", "ringmaster-worker", "train_loop"):
        assert os.access(os.path.join(BIN, name), os.X_OK), \
            f"{BIN}/{name} is not built (set RINGMASTER_BIN_DIR to the build's bin/)"
    j = LocalJob(tmp)
    yield j
    j.stop()


@pytest.fixture(scope="module")
def prometheus(tmp, job):
    p = Prometheus(tmp, "prometheus", scrape_config(job.endpoints))
    yield p
    p.stop()


# ---------------------------------------------------------------------------------------------------
# Without processes: the files themselves


def test_dashboard_is_an_importable_grafana_dashboard():
    d = load_dashboard()
    assert d["title"] and d["uid"] and 36 <= d["schemaVersion"] <= 39
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("job", "rank"):
        v = variables[name]
        assert v["type"] == "query" and v["includeAll"] and v["allValue"] == ".*", name
        assert v["definition"].startswith("label_values(") and v["query"]["query"] == v["definition"]
    ids = [p["id"] for p in all_panels(d)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    occupied = set()
    for p in all_panels(d):
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & occupied, f"panel '{p['title']}' overlaps another"
        occupied |= cells
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], f"panel '{p['title']}' has no query"
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["datasource"] == p["datasource"], p["title"]
            # $job and $rank are multi-value with an "All" of .*: they need regex matchers.
            assert not re.search(r'(job|rank)\s*(=|!=)\s*"\$', t["expr"]), t["expr"]
    exprs = " ".join(e for _, _, e in dashboard_targets(d))
    for needed in ("ringmaster_collective_bytes_total", "ringmaster_bus_bandwidth_bytes_per_second",
                   "ringmaster_negotiation_cycles_total",
                   "ringmaster_negotiation_latency_seconds_bucket",
                   "ringmaster_fusion_buffer_fill_ratio", "ringmaster_collective_latency_seconds_bucket",
                   "ringmaster_stalled_tensors", "ringmaster_errors_total", "ringmaster_workers",
                   "ringmaster_jobs", "ringmaster_queue_depth", "ringmaster_rank_lateness_seconds",
                   "ringmaster_straggler_rank", "ringmaster_rank_link_send_bytes_per_second",
                   "ringmaster_rank_collective_time_ratio", "ringmaster_rank_network_time_ratio"):
        assert needed in exprs, f"no panel queries {needed}"


def test_dashboard_refers_only_to_metrics_the_code_registers():
    # An expression written `... or vector(0)` returns data even if its metric is misspelt: check
    # every name against the registrations in the C++ code.
    known = series_names(registered_metrics())
    assert "ringmaster_errors_total" in known and "ringmaster_jobs" in known, known
    d = load_dashboard()
    queries = [e for _, _, e in dashboard_targets(d)]
    queries += [v["definition"] for v in d["templating"]["list"] if v["type"] == "query"]
    unknown = {n for q in queries for n in metric_names(q)} - known
    assert not unknown, f"the dashboard queries metrics the code does not register: {unknown}"


def test_metrics_doc_covers_every_metric():
    with open(METRICS_DOC) as f:
        doc = f.read()
    missing = [m for m in registered_metrics() if f"`{m}`" not in doc]
    assert not missing, f"docs/metrics.md does not describe {missing}"


@needs_prometheus
def test_alert_rules_pass_promtool_and_their_unit_tests():
    rules = os.path.join(REPO, "deploy", "prometheus", "ringmaster-alerts.yml")
    r = subprocess.run([PROMTOOL, "check", "rules", rules], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 2 rules found" in r.stdout + r.stderr, r.stdout + r.stderr
    # A slow rank for 5 minutes alerts (and 3 minutes does not), with the job and rank named.
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([PROMTOOL, "test", "rules", "ringmaster-alerts.test.yml"], cwd=here,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


@needs_prometheus
def test_scrape_configs_pass_promtool(tmp_path):
    r = subprocess.run([PROMTOOL, "check", "config", PROM_LOCAL], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    with open(PROM_LOCAL) as f:
        local = f.read()
    assert "honor_labels: true" in local and "scrape_interval: 5s" in local
    for port in (19400, 19401, 19402):
        assert f"127.0.0.1:{port}" in local
    # Debian's promtool is built without Kubernetes discovery: check everything else.
    with open(PROM_K8S) as f:
        k8s = f.read()
    assert "honor_labels: true" in k8s
    path = tmp_path / "k8s.yml"
    path.write_text(kubernetes_as_file_sd(k8s, str(tmp_path / "pods.json")))
    (tmp_path / "pods.json").write_text("[]")
    r = subprocess.run([PROMTOOL, "check", "config", str(path)], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr


def kubernetes_as_file_sd(config, targets_file):
    """The Kubernetes configuration with its pod discovery replaced by a file of targets."""
    new, n = re.subn(r"kubernetes_sd_configs:\n(\s+)- role: pod\n",
                     lambda m: f"file_sd_configs:\n{m.group(1)}- files: [\"{targets_file}\"]\n"
                               f"{m.group(1)}  refresh_interval: 1s\n", config)
    assert n == 1, "expected one `kubernetes_sd_configs: - role: pod` block"
    new = re.sub(r"scrape_interval: \S+", "scrape_interval: 1s", new)
    return new


# ---------------------------------------------------------------------------------------------------
# With a running job


@needs_prometheus
def test_endpoints_pass_promtool_check_metrics(job):
    with open(job.err_path) as f:
        err = f.read()
    assert f"coordinator metrics at http://127.0.0.1:{job.base}/metrics" in err, err
    for i in range(2):
        assert f"worker {i} metrics at http://127.0.0.1:{job.base + 1 + i}/metrics" in err, err
    for endpoint in job.endpoints:
        text = http_get(f"http://{endpoint}/metrics")
        r = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True,
                           text=True, timeout=30)
        assert r.returncode == 0, f"{endpoint}: {r.stdout}{r.stderr}\n{text[:2000]}"
        families = exposed_families(text)
        assert families, f"{endpoint} exposes no metric"
        registered = registered_metrics()
        for name, kind in families.items():
            assert registered.get(name) == kind, f"{endpoint}: {name} ({kind}) not as registered"


@needs_prometheus
def test_kubernetes_config_relabels_annotated_pods(tmp, job):
    """The pod discovery's labels as Kubernetes would give them, in a file: only the running pod
    annotated prometheus.io/scrape=true is scraped, on its prometheus.io/port, with honor_labels."""
    with open(PROM_K8S) as f:
        config = kubernetes_as_file_sd(f.read(), os.path.join(tmp, "k8s", "pods.json"))
    coordinator_port = job.base

    def pod(name, address, phase, annotations):
        labels = {"__meta_kubernetes_namespace": "ringmaster", "__meta_kubernetes_pod_name": name,
                  "__meta_kubernetes_pod_node_name": "node-1", "__meta_kubernetes_pod_phase": phase,
                  "__meta_kubernetes_pod_label_app_kubernetes_io_component": "coordinator"}
        for k, v in annotations.items():
            labels[f"__meta_kubernetes_pod_annotation_prometheus_io_{k}"] = v
        return {"targets": [address], "labels": labels}

    pods = [
        # Discovered on a container port; the annotation names the metrics port.
        pod("coordinator-0", "127.0.0.1:50051", "Running",
            {"scrape": "true", "port": str(coordinator_port), "path": "/metrics"}),
        pod("not-annotated", "127.0.0.1:1", "Running", {"port": "2"}),
        pod("opted-out", "127.0.0.1:3", "Running", {"scrape": "false", "port": "4"}),
        pod("finished", "127.0.0.1:5", "Succeeded", {"scrape": "true", "port": "6"}),
    ]
    p = Prometheus(tmp, "k8s", config, extra_files=[("pods.json", json.dumps(pods))])
    try:
        def scraped():
            t = p.targets()
            active = t["activeTargets"]
            return active and all(x["health"] == "up" for x in active) and t

        t = wait_for(scraped, 20, "the annotated pod to be scraped")
        active = t["activeTargets"]
        assert len(active) == 1, active
        assert active[0]["scrapeUrl"] == f"http://127.0.0.1:{coordinator_port}/metrics"
        assert active[0]["labels"]["pod"] == "coordinator-0"
        assert active[0]["labels"]["namespace"] == "ringmaster"
        assert len(t["droppedTargets"]) == 3, t["droppedTargets"]
        r = wait_for(lambda: (q := p.api("query", query="ringmaster_negotiation_cycles_total"))
                     ["data"]["result"] and q, 15, "a sample")
        # honor_labels: Ringmaster's job label, not the scrape config's job_name.
        assert {s["metric"]["job"] for s in r["data"]["result"]} == {job.job_id}
    finally:
        p.stop()


@needs_prometheus
def test_every_dashboard_query_returns_data(job, prometheus):
    wait_for(lambda: (t := prometheus.targets()["activeTargets"]) and len(t) == 3
             and all(x["health"] == "up" for x in t), 20, "the three targets to be up")
    d = load_dashboard()
    # Both as a user with this job selected, and with "All".
    pending = [(title, ref, substitute(expr, sel)) for title, ref, expr in dashboard_targets(d)
               for sel in (job.job_id, ".*")]
    # The template variables: label_values(selector, label).
    variables = []
    for v in d["templating"]["list"]:
        if v["type"] == "query":
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", v["definition"])
            assert m, v["definition"]
            variables.append((v["name"], substitute(m.group(1), ".*"), m.group(2)))
    deadline = time.monotonic() + QUERY_DEADLINE
    empty = {}
    while pending and time.monotonic() < deadline:
        still = []
        for title, ref, expr in pending:
            prometheus.alive()
            r = prometheus.api("query", query=expr)
            assert r["status"] == "success", f"panel '{title}' {ref}: {expr}: {r.get('error')}"
            if r["data"]["result"]:
                empty.pop((title, ref, expr), None)
            else:
                still.append((title, ref, expr))
                empty[(title, ref, expr)] = r["data"]
        pending = still
        if pending:
            time.sleep(0.5)
    assert not pending, "dashboard queries with no data while the job runs:\n" + "\n".join(
        f"  '{t}' {ref}: {e}" for t, ref, e in pending)
    for name, selector, label in variables:
        series = prometheus.api("series", **{"match[]": selector})
        assert series["status"] == "success", series
        values = {s[label] for s in series["data"] if label in s}
        assert values, f"template variable ${name}: label_values({selector}, {label}) is empty"
        if name == "job":
            assert values == {job.job_id}, values
        if name == "rank":
            assert values == {"0", "1"}, values
    # honor_labels: the coordinator's job-less series keep the scrape job's name.
    r = prometheus.api("query", query="ringmaster_workers")
    assert {s["metric"]["job"] for s in r["data"]["result"]} == {"ringmaster"}
