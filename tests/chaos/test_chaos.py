"""The chaos suite (ctest label `chaos`): faults injected at random moments into real coordinators,
daemons and ranks on loopback, each trial checked with exact values.

- coordinator kill -9 at a random moment of a 4-rank job (placement, rendezvous, training, the
  end), restarted with the same --state-dir and --listen: every job SUCCEEDED, every rank ran
  every step with the exact result (train_loop checks each);
- session resets at random messages (every worker drops the N-th message it sends and cuts its
  session, N drawn per worker and job): every job SUCCEEDED with exact results, none hangs;
- a daemon killed mid-job still fails the job within 10 s, naming its rank and host;
- two coordinator replicas on one etcd (--store etcd://): the leader killed (kill -9) at a random
  moment of a 4-rank job, the follower takes over within the lease TTL plus a few seconds, and every
  job SUCCEEDED with every step exact; the killed replica comes back as a follower.

Trial counts come from RINGMASTER_CHAOS_KILLS (default 20), RINGMASTER_CHAOS_RESET_JOBS (default
4 jobs, and more until 100 resets were injected), RINGMASTER_CHAOS_LEADER_KILLS (default 5) and
RINGMASTER_CHAOS_SEED; bench/chaos.sh runs larger
counts and prints the figures (trials, hangs, time to resume). Each trial is bounded in time.

Run by ctest with /usr/bin/python3 -m pytest; helpers from tests/cli/test_first_hour.py."""
import json
import os
import random
import re
import signal
import sys
import time
import types

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "cli"))
from test_first_hour import BIN, Cluster, PORT_RE, free_port, submit, wait_for  # noqa: E402
from test_coordinator_restart import etcd  # noqa: E402,F401 (a fixture)

import pytest  # noqa: E402

TRAIN = str(BIN / "train_loop")
KILLS = int(os.environ.get("RINGMASTER_CHAOS_KILLS", "20"))
LEADER_KILLS = int(os.environ.get("RINGMASTER_CHAOS_LEADER_KILLS", "5"))
RESET_JOBS = int(os.environ.get("RINGMASTER_CHAOS_RESET_JOBS", "4"))
SEED = int(os.environ.get("RINGMASTER_CHAOS_SEED", str(int(time.time()))))
REPORT = os.environ.get("RINGMASTER_CHAOS_REPORT")  # a JSON lines file for bench/chaos.sh
TERMINAL = {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"}


def report(**figures):
    if REPORT:
        with open(REPORT, "a") as f:
            f.write(json.dumps(figures) + "\n")


def seconds(text):
    """An absl duration as the coordinator prints it ("82ms", "1.5s", "0") in seconds."""
    m = re.fullmatch(r"([\d.]+)(ms|s|us)?", text)
    return float(m.group(1)) * {"ms": 1e-3, "us": 1e-6, "s": 1, None: 1}[m.group(2)]


def median(values):
    return sorted(values)[len(values) // 2] if values else None


def exact(logs, np_, steps):
    """Ranks whose closing line says every one of `steps` steps was exact, and how often."""
    return {rank: len(re.findall(rf"^\[{rank}\] rank {rank}: {steps} steps, every result exact$",
                                 logs, re.M)) for rank in range(np_)}


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    yield c
    c.close()


def test_coordinator_kill_at_random_moments_loses_no_step(cluster, tmp_path):
    rng = random.Random(SEED)
    state, port = tmp_path / "state", free_port()
    c = cluster.coordinator("--state-dir", str(state), port=port)
    for i in range(4):
        cluster.worker(c, host=f"h{i // 2}")
    wait_for(lambda: len(cluster.idle_workers(c)) == 4, 20, "the workers")
    steps = 40
    resumes, first_cycles = [], []
    for trial in range(KILLS):
        job = submit(cluster, c, "--np", "4", "--processes-per-host", "2", "--", TRAIN, str(steps))
        delay = rng.uniform(0, 1.6)  # placement, rendezvous, training or the end
        time.sleep(delay)
        c.stop(signal.SIGKILL)
        restarted = time.monotonic()
        c = cluster.coordinator("--state-dir", str(state), port=port)
        done = cluster.wait_state(c, job, TERMINAL, 60)  # a hang fails here
        logs = cluster.cli(c, "logs", job).stdout
        why = f"seed {SEED} trial {trial} (kill after {delay:.3f} s): {done.get('reason')}\n{logs}"
        assert done["state"] == "JOB_STATE_SUCCEEDED", why
        assert done["reason"] == "all 4 ranks exited 0", why
        # The output before the restart is kept by the workers' re-send (their last 1 MiB), so each
        # rank's closing line is there once: 0 steps lost or repeated.
        assert exact(logs, 4, steps) == {0: 1, 1: 1, 2: 1, 3: 1}, why
        # How long after the new coordinator started every rank was back, and negotiation with it.
        resumed = first = None
        for e in done["events"]:
            m = re.match(r"resumed after the coordinator restart: every rank reattached (\S+) ",
                         e["message"])
            resumed = seconds(m.group(1)) if m else resumed
            m = re.match(r"negotiating again: the first cycle after the restart came (\S+) ",
                         e["message"])
            first = seconds(m.group(1)) if m else first
        if resumed is not None:
            resumes.append(resumed)
        if first is not None:
            first_cycles.append(first)
        report(kind="coordinator_kill", trial=trial, delay_s=round(delay, 3), state=done["state"],
               reattached_s=resumed, first_cycle_s=first,
               restart_to_done_s=round(time.monotonic() - restarted, 3))
        wait_for(lambda: len(cluster.idle_workers(c)) == 4, 20, "the workers to be free")
    report(kind="coordinator_kill_summary", trials=KILLS, hangs=0, resumed=len(resumes),
           reattach_median_s=median(resumes), reattach_max_s=max(resumes, default=None),
           first_cycle_median_s=median(first_cycles),
           first_cycle_max_s=max(first_cycles, default=None))


@pytest.mark.parametrize("relay", [False, True], ids=["direct", "relay"])
def test_session_resets_at_random_messages_lose_nothing(cluster, tmp_path, relay):
    # Through negotiation relays (2 hosts of 2 ranks): a relay's cut session sends its host's other
    # rank back to its own session; half as many jobs and resets.
    rng = random.Random(SEED + (7 if relay else 1))
    jobs, wanted = (RESET_JOBS // 2, 50) if relay else (RESET_JOBS, 100)
    relayed = 0
    c = cluster.coordinator()
    resets = 0
    trial = 0
    # At least `jobs` jobs, and on until `wanted` resets were injected (at most 3 times as many).
    while trial < jobs or (resets < wanted and trial < 3 * jobs):
        # Fresh daemons, each dropping every N-th message it sends (N drawn per daemon).
        everies = [rng.randint(3, 20) for _ in range(4)]
        daemons = []
        base = cluster.env
        for i, every in enumerate(everies):
            cluster.env = {**base, "RINGMASTER_FAULT_DROP_SESSION": str(every)}
            daemons.append(cluster.worker(c, host=f"h{i // 2}", extra=("--log-level", "info")))
        cluster.env = base
        wait_for(lambda: len(cluster.idle_workers(c)) >= 4, 30, "the workers")
        steps = 60
        job = submit(cluster, c, "--np", "4", "--processes-per-host", "2",
                     *(["--negotiation-relay"] if relay else []), "--", TRAIN, str(steps))
        done = cluster.wait_state(c, job, TERMINAL, 90)  # a hang fails here
        logs = cluster.cli(c, "logs", job).stdout
        why = f"seed {SEED} trial {trial} (drop every {everies}): {done.get('reason')}\n{logs}"
        assert done["state"] == "JOB_STATE_SUCCEEDED", why
        assert exact(logs, 4, steps) == {0: 1, 1: 1, 2: 1, 3: 1}, why
        dropped = sum(len(re.findall(r"fault injection: message \d+ to the coordinator dropped",
                                     d.stderr() + d.stdout())) for d in daemons)
        resets += dropped
        relayed += sum(bool(re.search(rf"job {job} rank \d+: relays the negotiation",
                                      d.stderr() + d.stdout())) for d in daemons)
        report(kind="session_resets", trial=trial, every=everies, resets=dropped, state=done["state"],
               relay=relay)
        for d in daemons:
            d.stop(signal.SIGTERM)
        wait_for(lambda: not cluster.idle_workers(c), 30, "the daemons to go")
        trial += 1
    # `wanted` resets or more, at whatever message each one fell on, and every job exact.
    assert resets >= wanted, resets
    assert relayed > 0 if relay else relayed == 0, relayed
    report(kind="session_resets_summary", jobs=trial, resets=resets, hangs=0, relay=relay)


def test_a_daemon_kill_still_fails_the_job_within_10_s_naming_rank_and_host(cluster):
    c = cluster.coordinator()
    daemons = [cluster.worker(c, host=f"h{i}") for i in range(4)]
    wait_for(lambda: len(cluster.idle_workers(c)) == 4, 20, "the workers")
    job = submit(cluster, c, "--np", "4", "--", TRAIN)
    wait_for(lambda: "step 10" in cluster.cli(c, "logs", job).stdout, 30, "training to run")
    victim = cluster.job(c, job)["ranks"][2]
    killed = time.monotonic()
    daemons[int(victim["host"][1:])].stop(signal.SIGKILL)
    failed = cluster.wait_state(c, job, TERMINAL, 10)
    assert time.monotonic() - killed < 10
    assert failed["state"] == "JOB_STATE_FAILED"
    assert re.match(rf"worker {victim['worker_id']} serving rank 2 on host {victim['host']} ",
                    failed["reason"]), failed["reason"]


def leads(replica):
    """Whether a coordinator replica said it serves (not only that it listens as a follower)."""
    return any(PORT_RE.match(line) and "follower" not in line
               for line in replica.stdout().splitlines())


def test_leader_kill_with_etcd_loses_no_step(cluster, tmp_path, etcd):
    rng = random.Random(SEED + 2)
    ttl = 2
    ports = [free_port(), free_port()]

    def replica(i):
        # The jobs are in etcd; the output journal is in a --state-dir the replicas share (a shared
        # volume), so a job that ended just before a takeover still has its logs.
        return cluster.coordinator("--store", etcd, "--leader-ttl", f"{ttl}s", "--state-dir",
                                   str(tmp_path / "state"), port=ports[i])

    replicas = [replica(0), None]
    wait_for(lambda: leads(replicas[0]), 10, "the first replica to lead")
    replicas[1] = replica(1)
    assert not leads(replicas[1]) and "as a follower" in replicas[1].stdout()
    # A follower answers every call UNAVAILABLE, naming the leader.
    r = cluster.cli(replicas[1], "jobs")
    assert r.returncode == 1
    assert r.stderr.startswith(
        "ringmaster: UNAVAILABLE: this ringmaster-coordinator replica is not the leader; the "
        f"leader is at 127.0.0.1:{ports[0]}\n"), r.stderr
    # Daemons and the CLI are given both addresses, and follow the leader.
    both = types.SimpleNamespace(address=f"127.0.0.1:{ports[1]},127.0.0.1:{ports[0]}")
    for i in range(4):
        cluster.worker(both, host=f"h{i // 2}")
    wait_for(lambda: len(cluster.idle_workers(both)) == 4, 20, "the workers")
    leader, steps, takeovers, first_cycles = 0, 40, [], []
    for trial in range(LEADER_KILLS):
        job = submit(cluster, both, "--np", "4", "--processes-per-host", "2", "--", TRAIN,
                     str(steps))
        delay = rng.uniform(0.2, 1.6)
        time.sleep(delay)
        replicas[leader].stop(signal.SIGKILL)
        killed = time.monotonic()
        follower = 1 - leader
        wait_for(lambda: leads(replicas[follower]), ttl + 5, "the follower to take over")
        took = time.monotonic() - killed
        takeovers.append(took)
        done = cluster.wait_state(both, job, TERMINAL, 60)  # a hang fails here
        logs = cluster.cli(both, "logs", job).stdout
        why = (f"seed {SEED} trial {trial} (leader kill after {delay:.3f} s, taken over in "
               f"{took:.3f} s): {done.get('reason')}\n{logs}")
        assert done["state"] == "JOB_STATE_SUCCEEDED", why
        assert done["reason"] == "all 4 ranks exited 0", why
        assert exact(logs, 4, steps) == {0: 1, 1: 1, 2: 1, 3: 1}, why
        assert took < ttl + 3, why
        # From the kill to the job's first negotiated cycle with the new leader (when the job was
        # still negotiating): the takeover, then the new leader's first cycle.
        first = None
        for e in done["events"]:
            m = re.match(r"negotiating again: the first cycle after the restart came (\S+) ",
                         e["message"])
            first = seconds(m.group(1)) if m else first
        if first is not None:
            first_cycles.append(took + first)
        report(kind="leader_kill", trial=trial, delay_s=round(delay, 3), state=done["state"],
               takeover_s=round(took, 3),
               kill_to_first_cycle_s=None if first is None else round(took + first, 3))
        # The killed replica comes back, and follows.
        replicas[leader] = replica(leader)
        assert not leads(replicas[leader]), replicas[leader].stdout()
        leader = follower
        wait_for(lambda: len(cluster.idle_workers(both)) == 4, 20, "the workers to be free")
    report(kind="leader_kill_summary", trials=LEADER_KILLS, hangs=0, ttl_s=ttl,
           takeover_median_s=median(takeovers), takeover_max_s=max(takeovers, default=None),
           resumed=len(first_cycles), first_cycle_median_s=median(first_cycles),
           first_cycle_max_s=max(first_cycles, default=None))
