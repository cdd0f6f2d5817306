"""Hosts made of Linux network namespaces, for the multi-host tests (ctest label `multihost`).

Each `Hosts` is a private network: a "switch" namespace holding a bridge, and N host namespaces,
each with an `eth0` (one end of a veth pair; the other end is a port of the bridge) carrying an
address of SUBNET. Processes run in a host with `ip netns exec`, so they see only that host's
interfaces: loopback and eth0. Everything is removed on close(), on interpreter exit and, for what
an interrupted run (a ctest timeout's SIGKILL) left behind, by the next run's sweep.

Names: rmt<PID>-sw, rmt<PID>-h<i> (PID: the test process), so the sweep knows which are stale.
"""
import ipaddress
import os
import re
import shutil
import signal
import subprocess
import time

# The one place the test network's addresses come from. Each Hosts is its own isolated network
# (its own switch namespace), so concurrent runs may use the same subnet.
SUBNET = ipaddress.ip_network("10.213.0.0/24")
PREFIX = "rmt"


def _ip(*args, check=True):
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


def _namespaces():
    r = _ip("netns", "list", check=False)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def _kill_namespace(name):
    """Kills every process in namespace `name`, then deletes it (its veth ends go with it)."""
    r = _ip("netns", "pids", name, check=False)
    for pid in r.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    _ip("netns", "del", name, check=False)
    shutil.rmtree(f"/etc/netns/{name}", ignore_errors=True)  # set_hosts_file's


def sweep_stale():
    """Removes what runs that were killed left behind (their process is gone)."""
    for name in _namespaces():
        m = re.fullmatch(rf"{PREFIX}(\d+)-\w+", name)
        if not m:
            continue
        pid = int(m.group(1))
        try:
            os.kill(pid, 0)
            continue  # its run is still going
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        _kill_namespace(name)


def unavailable_reason():
    """Why namespaces cannot be made here (None when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (run the multihost tests as root)"
    probe = f"{PREFIX}{os.getpid()}-probe"
    r = _ip("netns", "add", probe, check=False)
    if r.returncode != 0:
        return f"network namespaces cannot be created here: ip netns add: {r.stderr.strip()}"
    try:
        r = _ip("-n", probe, "link", "add", "br0", "type", "bridge", check=False)
        if r.returncode != 0:
            return f"a bridge cannot be created in a network namespace here: {r.stderr.strip()}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


class Host:
    def __init__(self, hosts, index, name):
        self.hosts = hosts
        self.index = index
        self.name = name  # its host name (gethostname() of what runs there)
        self.netns = f"{hosts.tag}-h{index}"
        self.address = str(SUBNET.network_address + 1 + index)
        self.port = f"p{index}"  # its port on the switch

    def _inside(self, argv):
        # Its own network namespace, and its own UTS namespace carrying its host name.
        return ["ip", "netns", "exec", self.netns, "unshare", "--uts", "--", "/bin/sh", "-c",
                'hostname "$0" && exec "$@"', self.name, *argv]

    def popen(self, argv, log_path, env=None, cwd=None):
        """Starts `argv` in this host, stdout and stderr to `log_path`; killed at close()."""
        log = open(log_path, "wb")
        p = subprocess.Popen(self._inside(argv), stdout=log, stderr=subprocess.STDOUT, env=env,
                             cwd=cwd, start_new_session=True)
        log.close()
        self.hosts.procs.append(p)
        return p

    def run(self, argv, timeout=30, env=None):
        return subprocess.run(self._inside(argv), capture_output=True, text=True, timeout=timeout,
                              env=env)

    def set_hosts_file(self, names):
        """/etc/hosts as this host sees it (`ip netns exec` binds /etc/netns/NETNS/hosts over it):
        `names` maps a name to an address, e.g. a Kubernetes Service's DNS name."""
        d = f"/etc/netns/{self.netns}"
        os.makedirs(d, exist_ok=True)
        with open(f"{d}/hosts", "w") as f:
            f.write("127.0.0.1 localhost\n")
            for name, address in names.items():
                f.write(f"{address} {name}\n")

    def unplug(self):
        """Takes this host's link down at the switch (a cable pulled, a top-of-rack port dead)."""
        _ip("-n", self.hosts.switch, "link", "set", self.port, "down")

    def plug(self):
        _ip("-n", self.hosts.switch, "link", "set", self.port, "up")

    def limit_rate(self, rate, burst="1mb", latency="100ms"):
        """Shapes what this host sends to `rate` (tc's notation: "1gbit", "500mbit"), as a network
        slower than the host's memory is: a token bucket on its eth0, gone with the namespace.
        `latency`: the longest a packet waits in its queue (a short one is a slow NIC's ring; a
        long one, a deep switch buffer, delays the ACKs this host sends for what it receives)."""
        r = subprocess.run(["ip", "netns", "exec", self.netns, "tc", "qdisc", "replace", "dev",
                            "eth0", "root", "tbf", "rate", rate, "burst", burst, "latency",
                            latency], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"tc cannot shape {self.name}'s eth0 to {rate}: {r.stderr.strip()}")


class Hosts:
    """N hosts on one switch. Use as a context manager, or call close()."""

    def __init__(self, n, names=None):
        sweep_stale()
        self.names = names or [f"node{i}" for i in range(n)]
        self.tag = f"{PREFIX}{os.getpid()}"
        self.switch = f"{self.tag}-sw"
        self.procs = []
        self.made = []
        try:
            self._make(n)
        except BaseException:
            self.close()
            raise

    def _make(self, n):
        for name in [self.switch] + [f"{self.tag}-h{i}" for i in range(n)]:
            if name in _namespaces():
                _kill_namespace(name)  # left by an earlier Hosts of this process
        _ip("netns", "add", self.switch)
        self.made.append(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        self.hosts = []
        for i in range(n):
            h = Host(self, i, self.names[i])
            _ip("netns", "add", h.netns)
            self.made.append(h.netns)
            _ip("-n", h.netns, "link", "set", "lo", "up")
            _ip("-n", h.netns, "link", "add", "eth0", "type", "veth", "peer", "name", h.port,
                "netns", self.switch)
            _ip("-n", self.switch, "link", "set", h.port, "master", "br0")
            _ip("-n", self.switch, "link", "set", h.port, "up")
            _ip("-n", h.netns, "addr", "add", f"{h.address}/{SUBNET.prefixlen}", "dev", "eth0")
            _ip("-n", h.netns, "link", "set", "eth0", "up")
            self.hosts.append(h)

    def __getitem__(self, i):
        return self.hosts[i]

    def __len__(self):
        return len(self.hosts)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 5
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(5)
        for name in reversed(self.made):
            _kill_namespace(name)
        self.made = []
        try:
            os.rmdir("/etc/netns")  # set_hosts_file's, when no other run uses it
        except OSError:
            pass


def wait_for(predicate, timeout, what):
    """predicate()'s first true value, polled for at most `timeout` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def hosts_or_skip(n, names=None):
    """A pytest fixture body: Hosts(n), or the test skipped saying why namespaces cannot be made."""
    import pytest
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    with Hosts(n, names) as h:
        yield h
    left = [name for name in _namespaces() if name.startswith(h.tag)]
    assert not left, f"namespaces left behind: {left}"


def assert_collectives_passed(logs, np_):
    """Every rank's closing line of collectives_check says 0 checks failed."""
    for rank in range(np_):
        assert re.search(rf"^\[{rank}\] collectives_check: rank {rank}: \d+ checks passed, 0 failed$",
                         logs, re.M), logs
