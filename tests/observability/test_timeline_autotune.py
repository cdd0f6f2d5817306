"""The timeline and autotune end to end, as a user runs them: `ringmaster local` jobs of real worker
daemons running tests/worker/fused_loop (a grouped allreduce of two gradients that lie apart in the
arena, and a broadcast, every step).

- Timeline: fetched with `ringmaster artifacts` several times while the job runs (each fetch must
  parse as JSON), then saved by `ringmaster local` when the job ends; the final trace is checked for
  Horovod's names, one row per tensor, begin/end nesting, the negotiation of every step with one tick
  per rank, and the order negotiation -> queue -> pack -> allreduce -> unpack.
- Autotune: `ringmaster status --json` reports the tuner while it runs; the CSV log has Horovod's
  columns, a row per sample and the best setting last; a knob given on the command line stays fixed.

Run by ctest (label `observability`) with RINGMASTER_BIN_DIR pointing at build/bin. Standard library
and pytest only; every wait has a deadline.
"""
import csv
import json
import os
import socket
import subprocess
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("RINGMASTER_BIN_DIR", os.path.join(REPO, "build", "bin"))
RINGMASTER = os.path.join(BIN, "ringmaster")
FUSED_LOOP = os.path.join(BIN, "fused_loop")
JOB = "job-000001"  # the first job of a fresh coordinator
STEPS = 150
NP = 2

pytestmark = pytest.mark.skipif(
    not (os.access(RINGMASTER, os.X_OK) and os.access(FUSED_LOOP, os.X_OK)),
    reason=f"build first: {RINGMASTER} and {FUSED_LOOP}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_local(tmp_path, port, knobs, steps):
    log = open(tmp_path / "local.log", "w")
    return subprocess.Popen(
        [RINGMASTER, "local", "--np", str(NP), "--coordinator-port", str(port),
         "--artifacts-output", str(tmp_path / "saved"), *knobs, "--", FUSED_LOOP, str(steps)],
        cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)


def cli(port, *args, timeout=15):
    return subprocess.run([RINGMASTER, "--coordinator", f"127.0.0.1:{port}", *args],
                          capture_output=True, text=True, timeout=timeout)


def finish(proc, tmp_path, timeout=120):
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    output = (tmp_path / "local.log").read_text()
    assert proc.returncode == 0, output
    return output


def test_timeline_parses_while_the_job_runs_and_nests_properly(tmp_path):
    port = free_port()
    proc = start_local(tmp_path, port, ["--timeline", "timeline.json", "--timeline-mark-cycles"],
                       STEPS)
    snapshots = []
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        out = tmp_path / f"fetch{len(snapshots)}"
        r = cli(port, "artifacts", JOB, "--output", str(out))
        if r.returncode == 0 and (out / "timeline.json").exists():
            text = (out / "timeline.json").read_text()
            snapshots.append(json.loads(text))  # must parse: valid JSON at any moment
        time.sleep(0.25)
        if len(snapshots) == 1:
            # An unknown job: one line naming it, exit 1.
            bad = cli(port, "artifacts", "job-999999", "--output", str(tmp_path / "bad"))
            assert bad.returncode == 1
            assert bad.stderr.startswith("ringmaster: NOT_FOUND: ") and "job-999999" in bad.stderr
    output = finish(proc, tmp_path)
    assert len(snapshots) >= 2, output
    assert len(snapshots[-1]) >= len(snapshots[0])
    assert f"timeline.json written to {tmp_path / 'saved' / 'timeline.json'}" in output

    trace = json.loads((tmp_path / "saved" / "timeline.json").read_text())
    rows = {e["pid"]: e["args"]["name"] for e in trace
            if e["ph"] == "M" and e["name"] == "process_name" and e["pid"] > 0}
    pid = {name: p for p, name in rows.items()}
    assert {"grad.a", "grad.b", "weights"} <= set(pid), sorted(pid)

    # Nesting: per (row, thread), every E closes the innermost open B; times never go back; nothing
    # is left open once the job has ended.
    spans = {}  # (pid, tid) -> list of (name, begin, end, depth) in file order of their begin
    for key in {(e["pid"], e.get("tid", 0)) for e in trace if e["ph"] in "BE"}:
        stack, last_ts, out = [], None, []
        for e in (e for e in trace if (e.get("pid"), e.get("tid", 0)) == key and e["ph"] != "M"):
            if last_ts is not None:
                assert e["ts"] >= last_ts, (rows.get(key[0]), e)
            last_ts = e["ts"]
            if e["ph"] == "B":
                stack.append(len(out))
                out.append([e["name"], e["ts"], None, len(stack) - 1])
            elif e["ph"] == "E":
                assert stack, (rows.get(key[0]), "E without B", e)
                out[stack.pop()][2] = e["ts"]
        assert not stack, (rows.get(key[0]), "left open", [out[i] for i in stack])
        spans[key] = out

    for tensor, op, collective, packed in [("grad.a", "ALLREDUCE", "SHM_ALLREDUCE", False),
                                           ("grad.b", "ALLREDUCE", "SHM_ALLREDUCE", False),
                                           ("weights", "BROADCAST", "GLOO_BCAST", False)]:
        p = pid[tensor]
        negotiations = [s for s in spans[(p, 0)] if s[3] == 0]
        assert [s[0] for s in negotiations] == [f"NEGOTIATE_{op}"] * STEPS
        # One tick per rank inside each negotiation, named by the rank.
        ticks = [e for e in trace if e.get("pid") == p and e.get("tid") == 0 and e["ph"] == "X"]
        assert len(ticks) == NP * STEPS
        assert sorted({t["name"] for t in ticks}) == [str(r) for r in range(NP)]
        for t in ticks:
            assert any(n[1] <= t["ts"] <= n[2] for n in negotiations), t
        # Rank 0's execution (thread 1): the op, with its activities in order, inside it.
        execution = spans[(p, 1)]
        tops = [i for i, s in enumerate(execution) if s[3] == 0]
        assert len(tops) == STEPS
        expected = (["QUEUE", "MEMCPY_IN_FUSION_BUFFER", collective, "MEMCPY_OUT_FUSION_BUFFER"]
                    if packed else ["QUEUE", collective])
        for k, i in enumerate(tops):
            top = execution[i]
            assert top[0] == op
            children = execution[i + 1:i + 1 + len(expected)]
            assert [c[0] for c in children] == expected
            assert all(c[3] == 1 and top[1] <= c[1] <= c[2] <= top[2] for c in children)
            for a, b in zip(children, children[1:]):
                assert a[2] <= b[1]  # one after the other
            # Negotiated (every rank ready) before rank 0 got the response.
            assert negotiations[k][2] <= top[1]
    cycles = [e for e in trace if e.get("name") == "CYCLE_START"]
    assert len(cycles) >= STEPS and all(e["ph"] == "i" for e in cycles)


def test_autotune_reports_its_state_and_logs_every_sample(tmp_path):
    port = free_port()
    # The cycle time is given: it must stay fixed while the rest is tuned.
    proc = start_local(tmp_path, port,
                       ["--autotune", "--autotune-log-file", "autotune.csv",
                        "--autotune-warmup-samples", "1", "--autotune-steps-per-sample", "5",
                        "--autotune-bayes-opt-max-samples", "4", "--cycle-time-ms", "2",
                        "--no-hierarchical-allgather"], 200)
    phases = set()
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        r = cli(port, "--json", "status", JOB)
        if r.returncode == 0:
            job = json.loads(r.stdout)
            autotune = job.get("throughput", {}).get("autotune")
            if autotune:
                phases.add(autotune["phase"])
                assert autotune["maxSamples" if "maxSamples" in autotune else "max_samples"] == 4
            if job["state"] == "JOB_STATE_RUNNING" and "done" in phases:
                text = cli(port, "status", JOB).stdout
                if "State:     RUNNING" not in text:
                    continue  # it ended meanwhile: a finished job has no live section
                assert "Autotune:  done, 4/4 samples; best so far: fusion_threshold=" in text
                assert "cycle_time=2 ms" in text
        time.sleep(0.2)
    finish(proc, tmp_path)
    assert "done" in phases, phases
    rows = list(csv.reader((tmp_path / "saved" / "autotune.csv").read_text().splitlines()))
    assert rows[0] == ["hierarchical_allreduce", "hierarchical_allgather", "cache_enabled",
                       "cycle_time_ms", "tensor_fusion_threshold", "score"]
    assert len(rows) == 1 + 4 + 1  # header, the samples, the best setting
    for row in rows[1:]:
        # The job's hierarchical knobs (--no-hierarchical-allgather; allreduce on by default),
        # which autotune does not tune.
        assert row[:2] == ["1", "0"] and row[2] in ("0", "1")
        assert float(row[3]) == 2.0  # fixed
        assert 0.0625 <= float(row[4]) <= 256 and float(row[5]) > 0
    # The first sample scores the starting setting: the default 128 MiB, cache on.
    assert rows[1][2] == "1" and float(rows[1][4]) == 128


def test_a_timeline_given_as_a_path_lands_there_as_horovod_users_expect(tmp_path):
    # HOROVOD_TIMELINE=/some/dir/timeline.json: the artifact is named timeline.json, and
    # `ringmaster local` writes it to the path asked for when the job ends.
    wanted = tmp_path / "runs" / "t1.json"
    wanted.parent.mkdir()
    env = dict(os.environ, HOROVOD_TIMELINE=str(wanted))
    r = subprocess.run([RINGMASTER, "local", "--np", "2", "--", FUSED_LOOP, "5"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"t1.json written to {wanted}" in r.stderr
    trace = json.loads(wanted.read_text())
    assert any(e.get("name") == "NEGOTIATE_ALLREDUCE" for e in trace)
