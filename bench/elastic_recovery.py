"""How fast an elastic job goes on after it loses a worker: a coordinator and 3 worker daemons on
loopback, examples/pytorch_elastic.py (min 2, max 3) training; one daemon (not rank 0's) is killed
with SIGKILL, and the time from the kill to rank 0's first committed step of the new epoch (2
ranks) is measured. Trials are repeated; the median and the spread are printed, with the
heartbeat settings (coordinator --lease-seconds 3, --heartbeat-interval-seconds 0.5, the default
2 s reconnect grace and 300 ms failure settle).

    /usr/bin/python3 bench/elastic_recovery.py [--trials 5]

Uses the test suite's process helpers (tests/cli/test_first_hour.py) and the build in
$RINGMASTER_BIN_DIR (default build/bin).
"""
import argparse
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "cli"))
from test_first_hour import Cluster, submit, wait_for  # noqa: E402

SCRIPT = str(REPO / "examples" / "pytorch_elastic.py")


def trial(tmp):
    cluster = Cluster(tmp)
    try:
        c = cluster.coordinator()
        daemons = [cluster.worker(c, host=f"h{i}") for i in range(3)]
        wait_for(lambda: len(cluster.idle_workers(c)) == 3, 30, "the workers")
        job = submit(cluster, c, "--min-np", "2", "--max-np", "3", "--", "/usr/bin/python3",
                     SCRIPT, "--steps", "100000", "--sleep", "0.02", "--print-time")

        def logs():
            r = cluster.cli(c, "logs", job)
            return r.stdout

        wait_for(lambda: "commit 30 3 " in logs(), 60, "training to run")
        killed = time.time()
        daemons[2].stop(signal.SIGKILL)
        first = wait_for(lambda: re.search(r"^\[0\] commit \d+ 2 ([\d.]+)$", logs(), re.M), 60,
                         "the first step of the new epoch")
        cluster.cli(c, "cancel", job)
        return float(first.group(1)) - killed
    finally:
        cluster.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    seconds = []
    for i in range(args.trials):
        with tempfile.TemporaryDirectory() as tmp:
            seconds.append(trial(Path(tmp)))
        print(f"trial {i + 1}: {seconds[-1]:.2f} s from the kill to the new epoch's first step",
              flush=True)
    print(f"median {statistics.median(seconds):.2f} s, min {min(seconds):.2f} s, "
          f"max {max(seconds):.2f} s over {len(seconds)} trials (target <= 5 s)")


if __name__ == "__main__":
    main()
