"""Who is slow (issue 40), with real processes and real slowness: a coordinator, four worker daemons
on two hosts, and tests/worker/train_loop ranks, one of which computes longer each step (a sleep
before it submits, RINGMASTER_TEST_SLOW_RANK/RINGMASTER_TEST_SLOW_MS). Within 10 steps `ringmaster
status` names that rank, its host and worker, late to submit; the coordinator's metrics say so;
the timeline marks it last in its steps; and no other rank is named. With no slow rank, nobody is.

Run by ctest (labels observability;multiprocess) with RINGMASTER_BIN_DIR pointing at build/bin.
"""
import json
import os
import re
import sys
import time
import urllib.request

import pytest


sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "cli"))
from test_first_hour import (  # noqa: E402,F401 - cluster: the fixture, used by name
    BIN, cluster, free_port, log_tail, submit, wait_for)


def start(cluster, metrics_port):
    c = cluster.coordinator("--metrics-listen", f"127.0.0.1:{metrics_port}")
    for i in range(4):
        cluster.worker(c, host=f"h{i // 2}")
    wait_for(lambda: len(cluster.idle_workers(c)) == 4, 20, "four workers")
    return c


def metrics(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    values = {}
    for line in text.splitlines():
        if line.startswith(("ringmaster_rank_lateness_seconds{", "ringmaster_straggler_rank{")):
            series, value = line.rsplit(" ", 1)
            values[series] = float(value)
    return values


def test_a_rank_that_computes_longer_is_named_within_ten_steps_and_no_other_is(cluster, tmp_path):
    port = free_port()
    c = start(cluster, port)
    job = submit(cluster, c, "--np", "4", "--timeline", "timeline.json",
                 "--env", "RINGMASTER_TEST_SLOW_RANK=2", "--env", "RINGMASTER_TEST_SLOW_MS=150",
                 "--", str(BIN / "train_loop"), "40")

    def named():
        j = cluster.job(c, job)
        assert j["state"] in ("JOB_STATE_PENDING", "JOB_STATE_RUNNING"), j
        s = j.get("stragglers")
        return j if s and s.get("straggler_rank", -1) == 2 else None

    first = wait_for(named, 60, "rank 2 to be named")
    print(f"named {first['stragglers']['last_step']} steps after the job began: "
          f"{json.dumps(first['stragglers']['slowest'])}")
    # The window is not full yet: rank 2 was named within the first 10 steps.
    assert 1 <= first["stragglers"]["steps"] < 10, first["stragglers"]
    # With a few steps in the window (the first step, as ranks start, is not like the others):
    first = wait_for(lambda: (lambda j: j if j["stragglers"]["steps"] >= 5 else None)(named()), 60,
                     "five steps")
    s = first["stragglers"]
    assert s["straggler_rank"] == 2, s
    ranks = {r.get("rank", 0): r for r in first["ranks"]}  # JSON leaves out zeros
    worst = s["slowest"][0]
    assert worst.get("rank", 0) == 2, s
    assert worst["host"] == "h1" and worst["worker_id"] == ranks[2]["worker_id"], (worst, ranks)
    assert worst["verdict"] == "late to submit", worst
    assert 0.12 <= worst["behind_median_seconds"] <= 0.5, worst
    assert [r for r in s["slowest"] if r.get("verdict")] == [worst], s  # no other rank named

    # A few steps on: the same in the metrics, where every rank has its series.
    time.sleep(1.5)
    m = metrics(port)
    assert m[f'ringmaster_straggler_rank{{job="{job}"}}'] == 2, m
    lateness = {r: m[f'ringmaster_rank_lateness_seconds{{job="{job}",rank="{r}"}}'] for r in range(4)}
    assert 0.12 <= lateness[2] <= 0.5, lateness
    assert all(lateness[r] < 0.03 for r in (0, 1, 3)), lateness

    status = cluster.cli(c, "status", job).stdout
    assert "rank 2 holds the job back" in status, status
    assert "late to submit" in status, status

    done = cluster.wait_state(c, job, {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"}, 120)
    assert done["state"] == "JOB_STATE_SUCCEEDED", done.get("reason", "") + log_tail(c)
    # An ended job's per-rank series are gone from the coordinator.
    assert not any(job in series for series in metrics(port)), metrics(port)

    # The timeline marks each step's last rank: rank 2, by about its 150 ms.
    out = tmp_path / "artifacts"
    r = cluster.cli(c, "artifacts", job, "--output", str(out))
    assert r.returncode == 0, r.stderr
    events = json.loads((out / "timeline.json").read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    steps = [e for e in events if e.get("ph") == "i" and e["name"].startswith("STEP ")]
    assert len(steps) >= 30, len(steps)  # 40 steps: one mark at each step's end but the last
    assert [e["args"]["step"] for e in steps] == list(range(1, len(steps) + 1))
    last_two = [e for e in steps if e["args"]["last_rank"] == 2]
    assert len(last_two) >= len(steps) - 2, [e["name"] for e in steps]
    assert all(e["name"] == f"STEP {e['args']['step']} LAST: RANK 2" for e in last_two)
    assert sorted(e["args"]["behind_first_ms"] for e in last_two)[len(last_two) // 2] >= 120


def test_with_no_slow_rank_no_rank_is_named(cluster):
    port = free_port()
    c = start(cluster, port)
    job = submit(cluster, c, "--np", "4", "--", str(BIN / "train_loop"), "60")
    seen = []

    def observe():
        j = cluster.job(c, job)
        if j["state"] != "JOB_STATE_RUNNING":
            return j
        if j.get("stragglers"):
            seen.append(j["stragglers"])
        time.sleep(0.2)
        return None

    done = wait_for(observe, 120, "the job to end")
    assert done["state"] == "JOB_STATE_SUCCEEDED", done
    assert len(seen) >= 3, seen  # it was watched while it ran
    assert all(s.get("straggler_rank", 0) == -1 for s in seen), seen
    assert all(not r.get("verdict") for s in seen for r in s["slowest"]), seen


def test_the_straggler_action_warns_in_an_event_or_fails_the_job_naming_the_rank(cluster):
    c = start(cluster, free_port())
    slow = ("--env", "RINGMASTER_TEST_SLOW_RANK=3", "--env", "RINGMASTER_TEST_SLOW_MS=120")
    warned = submit(cluster, c, "--np", "4", "--straggler-action", "warn", *slow, "--",
                    str(BIN / "train_loop"), "20")
    # `status --watch` follows the job until it ends: one object per refresh with --json.
    r = cluster.cli(c, "status", warned, "--watch", "--interval", "0.3", "--json", timeout=120)
    assert r.returncode == 0, r.stderr
    seen = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(seen) >= 3, r.stdout
    assert seen[-1]["state"] == "JOB_STATE_SUCCEEDED", seen[-1]
    assert all(j["state"] != "JOB_STATE_SUCCEEDED" for j in seen[:-1]), [j["state"] for j in seen]
    assert any(j.get("stragglers", {}).get("straggler_rank", -1) == 3 for j in seen), seen
    done = seen[-1]
    worker = done["ranks"][3]["worker_id"]
    notes = [e["message"] for e in done["events"] if "holds the job back" in e["message"]]
    assert len(notes) == 1, done["events"]  # once: the same rank stays named
    assert notes[0].startswith(f"rank 3 on host h1 ({worker}) holds the job back: "), notes
    assert notes[0].endswith("(late to submit: its compute or input is slow)"), notes
    m = re.search(r"holds the job back: ([\d.]+)ms behind the median rank per step over the last "
                  r"(\d+) steps", notes[0])
    assert m and 100 <= float(m.group(1)) <= 400 and 3 <= int(m.group(2)) <= 10, notes

    wait_for(lambda: len(cluster.idle_workers(c)) == 4, 20, "the workers back")
    failed = submit(cluster, c, "--np", "4", "--straggler-action", "fail", *slow, "--",
                    str(BIN / "train_loop"), "200")
    done = cluster.wait_state(c, failed, {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"}, 120)
    assert done["state"] == "JOB_STATE_FAILED", done
    worker = done["ranks"][3]["worker_id"]
    assert done["reason"].startswith(f"rank 3 on host h1 ({worker}) holds the job back: "), \
        done["reason"]
    assert done["reason"].endswith("(--straggler-action fail)"), done["reason"]

    r = cluster.cli(c, "submit", "--np", "4", "--straggler-action", "evict", "--",
                    str(BIN / "train_loop"), "1")
    assert r.returncode != 0
    assert ("knobs.straggler_action = 'evict' needs an elastic job (spec.min_np or spec.max_np): "
            "a job of a fixed size cannot drop a rank (use warn or fail)") in r.stderr, r.stderr
    r = cluster.cli(c, "submit", "--np", "4", "--straggler-action", "drop", "--",
                    str(BIN / "train_loop"), "1")
    assert r.returncode != 0
    assert "knobs.straggler_action = 'drop' is not none, warn, fail or evict" in r.stderr, r.stderr


def limit_cpu(pid, fraction, name):
    """Puts process `pid` (all its threads) in a new cgroup `name` allowed `fraction` of one CPU
    (cgroup v2's cpu.max, or v1's CFS quota). Returns the cgroup's directory, or skips saying why
    it cannot be made here."""
    period = 100_000
    quota = int(period * fraction)
    v2 = "/sys/fs/cgroup/cgroup.controllers"
    try:
        if os.path.exists(v2):
            if "cpu" not in open(v2).read().split():
                pytest.skip("cgroup v2 here has no cpu controller")
            control = "/sys/fs/cgroup/cgroup.subtree_control"
            if "cpu" not in open(control).read().split():  # enabled for child groups only if not
                with open(control, "w") as f:
                    f.write("+cpu")
            d = f"/sys/fs/cgroup/{name}"
            os.makedirs(d, exist_ok=True)
            with open(f"{d}/cpu.max", "w") as f:
                f.write(f"{quota} {period}")
        elif os.path.isdir("/sys/fs/cgroup/cpu"):
            d = f"/sys/fs/cgroup/cpu/{name}"
            os.makedirs(d, exist_ok=True)
            with open(f"{d}/cpu.cfs_period_us", "w") as f:
                f.write(str(period))
            with open(f"{d}/cpu.cfs_quota_us", "w") as f:
                f.write(str(quota))
        else:
            pytest.skip("no cgroup cpu controller is mounted here")
        with open(f"{d}/cgroup.procs", "w") as f:
            f.write(str(pid))
    except OSError as e:
        pytest.skip(f"a CPU-limited cgroup cannot be made here (run as root with cgroups "
                    f"writable): {e}")
    return d


def remove_cgroup(d):
    for _ in range(50):  # its process is gone once the job ended
        try:
            os.rmdir(d)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)


def test_a_rank_whose_cpu_is_limited_is_named_late_to_submit_within_ten_steps(cluster):
    # Every rank computes 20 ms of CPU a step; rank 1's process may use a tenth of a CPU once it
    # runs, so its 20 ms take about 200 ms.
    c = start(cluster, free_port())
    job = submit(cluster, c, "--np", "4", "--env", "RINGMASTER_TEST_COMPUTE_MS=20", "--",
                 str(BIN / "train_loop"), "300")

    def pid_of_rank_1():
        m = re.search(r"^\[1\] rank 1 pid (\d+) ready$", cluster.cli(c, "logs", job).stdout, re.M)
        return int(m.group(1)) if m else None

    pid = wait_for(pid_of_rank_1, 30, "rank 1's process")
    wait_for(lambda: cluster.job(c, job).get("stragglers", {}).get("steps", 0) >= 5, 30,
             "five steps")
    calm = cluster.job(c, job)["stragglers"]
    assert calm.get("straggler_rank", 0) == -1, calm  # before the limit: nobody (JSON leaves out 0)
    step = int(calm["last_step"])
    group = limit_cpu(pid, 0.1, f"rmt{os.getpid()}-rank1")
    try:
        limited = time.monotonic()

        def named():
            s = cluster.job(c, job).get("stragglers", {})
            return s if s.get("straggler_rank", -1) == 1 else None

        s = wait_for(named, 60, "rank 1 to be named")
        took = time.monotonic() - limited
        print(f"named {took:.1f} s and {int(s['last_step']) - step} steps after the CPU limit: "
              f"{json.dumps(s['slowest'])}")
        assert int(s["last_step"]) - step <= 10, s
        worst = s["slowest"][0]
        assert worst.get("rank", 0) == 1 and worst["verdict"] == "late to submit", s
        assert worst["host"] == "h0", worst
        assert [r for r in s["slowest"] if r.get("verdict")] == [worst], s  # no other rank named
        # Once the window holds only limited steps: its 20 ms of CPU take about 200 ms.
        time.sleep(4)
        s = cluster.job(c, job)["stragglers"]
        worst = s["slowest"][0]
        assert s["straggler_rank"] == 1 and worst.get("rank", 0) == 1, s
        assert 0.1 <= worst["behind_median_seconds"] <= 0.4, worst
        assert [r for r in s["slowest"] if r.get("verdict")] == [worst], s
        # Its worker measured it too: its collectives take no longer than the others'.
        assert all(r.get("measured") for r in s["slowest"]), s
    finally:
        cluster.cli(c, "cancel", job)
        cluster.wait_state(c, job, {"JOB_STATE_CANCELLED", "JOB_STATE_SUCCEEDED",
                                    "JOB_STATE_FAILED"}, 30)
        remove_cgroup(group)
