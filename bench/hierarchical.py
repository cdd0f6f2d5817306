#!/usr/bin/python3
"""Hierarchical allreduce across hosts, as recorded in docs/benchmarks.md: 2 hosts x 2 ranks on the
multi-host namespace harness (tests/multihost/netns.py: each host a network namespace on one bridge),
ResNet-50's gradient step in one run, each system --repeats times, interleaved:

  ringmaster hierarchical   within each host through shared memory, then across hosts per slice
                            (the default)
  ringmaster flat           --no-hierarchical-allreduce: fused Gloo allreduce among all 4 ranks
  raw gloo, one buffer      timed inside the hierarchical job (ringmaster-bench's baseline)
  torch bucketed            PyTorch DDP-style 25 MB buckets (bench/torch_anchor.py) on the same hosts

With --allgather-bytes N, the same for an allgather of N bytes from every rank instead: the
hierarchical allgather (across hosts among each local index's ranks, then through each host's
shared memory; the default) against the flat Gloo allgather (--no-hierarchical-allgather), raw
Gloo's allgather timed in the hierarchical job,
and torch.distributed's all_gather on the same hosts.

With --link-rate R (tc's notation, e.g. 1gbit), what each worker host sends is shaped to R (a
token bucket on its eth0): a network slower than the hosts' memory, as between real hosts, where on
the bare harness the "network" is the same memory as within a host.

Prints the medians and the ratios. Needs root (network namespaces) and a build (scripts/build.sh).

    sudo /usr/bin/python3 bench/hierarchical.py [--repeats 3] [--steps 10] [--allgather-bytes N]
                                                [--link-rate R]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "multihost"))

from netns import Hosts, unavailable_reason  # noqa: E402
from test_multihost import BIN, TERMINAL, Cluster  # noqa: E402


def bench_job(cluster, profile, steps, *flags, allgather_bytes=0):
    what = (["--allgather-bytes", str(allgather_bytes)] if allgather_bytes
            else ["--profile", str(profile)])
    job = cluster.submit("--np", "4", "--processes-per-host", "2", *flags, "--",
                         str(BIN / "ringmaster-bench"), *what, "--steps", str(steps), "--warmup",
                         "2", "--json")
    done = cluster.wait_state(job, TERMINAL, 600)
    logs = cluster.cli("logs", job)
    if done["state"] != "JOB_STATE_SUCCEEDED":
        sys.exit(f"{' '.join(flags) or 'hierarchical'} job failed: {done.get('reason')}\n{logs}")
    return {r["system"]: r.get("step_time_s_median", r.get("time_s_median"))
            for r in (json.loads(line.split("] ", 1)[1]) for line in logs.splitlines()
                      if line.startswith("[0] {"))
            if "system" in r}


def torch_ddp(hosts, tmp, profile, steps, port, allgather_bytes=0):
    """torch_anchor.py on both worker hosts at once: 2 ranks each, world of 4."""
    mode = (["--modes", "allgather", "--allgather-bytes", str(allgather_bytes)] if allgather_bytes
            else ["--modes", "bucketed"])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["GLOO_SOCKET_IFNAME"] = "eth0"
    procs = []
    for node in (0, 1):
        h = hosts[1 + node]
        procs.append((h.popen(["/usr/bin/python3", str(REPO / "bench" / "torch_anchor.py"),
                               "--profile", str(profile), "--np", "2", "--nnodes", "2",
                               "--node-rank", str(node), "--master-addr", hosts[1].address,
                               "--port", str(port), "--steps", str(steps), *mode],
                              tmp / f"torch{node}.log", env=env), tmp / f"torch{node}.log"))
    for p, _ in procs:
        p.wait(600)
    out = procs[0][1].read_text()
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    if not rows:
        sys.exit(f"torch on the hosts failed:\n{out}\n{procs[1][1].read_text()}")
    return rows[0].get("step_time_s_median", rows[0].get("time_s_median"))


def shape(hosts, rate):
    """The worker hosts (1 and 2; 0 runs the coordinator) send at most `rate` each."""
    if rate:
        for h in (hosts[1], hosts[2]):
            h.limit_rate(rate)


def rate_note(args):
    return f", each host sending at most {args.link_rate}" if args.link_rate else ""


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--allgather-bytes", type=int, default=0,
                    help="measure an allgather of this many bytes per rank instead")
    ap.add_argument("--link-rate", default="",
                    help="shape what each worker host sends to this rate (tc's notation: 1gbit)")
    args = ap.parse_args()
    if reason := unavailable_reason():
        sys.exit(f"hierarchical.py: {reason}")
    profile = REPO / "bench" / "profiles" / "resnet50.json"
    samples = {"hierarchical": [], "flat": [], "raw gloo": [], "memcpy": [], "torch": []}
    if args.allgather_bytes:
        return allgather(args)
    with tempfile.TemporaryDirectory() as tmp, Hosts(3) as hosts:
        shape(hosts, args.link_rate)
        cluster = Cluster(hosts, Path(tmp))
        for i in range(args.repeats):
            ours = bench_job(cluster, profile, args.steps)
            samples["hierarchical"].append(ours["ringmaster"])
            samples["raw gloo"].append(ours["raw-gloo-one-buffer"])
            samples["memcpy"].append(ours["memcpy-floor"])
            samples["flat"].append(bench_job(cluster, profile, args.steps,
                                             "--no-hierarchical-allreduce")["ringmaster"])
            samples["torch"].append(torch_ddp(hosts, Path(tmp), profile, args.steps, 29600 + i))
    med = {k: statistics.median(v) for k, v in samples.items()}
    print(f"ResNet-50, 2 hosts x 2 ranks{rate_note(args)}, medians of {args.repeats} runs of "
          f"{args.steps} steps:")
    for k in ("hierarchical", "flat", "raw gloo", "torch", "memcpy"):
        print(f"  {k:14} {med[k] * 1e3:8.1f} ms   runs: "
              + " ".join(f"{v * 1e3:.1f}" for v in samples[k]))
    print(f"  hierarchical / flat  {med['hierarchical'] / med['flat']:.3f}")
    print(f"  hierarchical / raw gloo  {med['hierarchical'] / med['raw gloo']:.3f}")
    print(f"  hierarchical / torch bucketed  {med['hierarchical'] / med['torch']:.3f}")
    print(f"  flat / torch bucketed  {med['flat'] / med['torch']:.3f}")


def allgather(args):
    n = args.allgather_bytes
    profile = REPO / "bench" / "profiles" / "resnet50.json"  # torch_anchor.py loads one anyway
    samples = {"hierarchical": [], "flat": [], "raw gloo": [], "torch": []}
    with tempfile.TemporaryDirectory() as tmp, Hosts(3) as hosts:
        shape(hosts, args.link_rate)
        cluster = Cluster(hosts, Path(tmp))
        for i in range(args.repeats):
            ours = bench_job(cluster, None, args.steps, allgather_bytes=n)
            samples["hierarchical"].append(ours["ringmaster-allgather"])
            samples["raw gloo"].append(ours["raw-gloo-allgather"])
            samples["flat"].append(
                bench_job(cluster, None, args.steps, "--no-hierarchical-allgather",
                          allgather_bytes=n)["ringmaster-allgather"])
            samples["torch"].append(torch_ddp(hosts, Path(tmp), profile, args.steps, 29700 + i,
                                              allgather_bytes=n))
    med = {k: statistics.median(v) for k, v in samples.items()}
    print(f"allgather of {n} bytes per rank, 2 hosts x 2 ranks{rate_note(args)}, medians of "
          f"{args.repeats} runs of {args.steps}:")
    for k in ("hierarchical", "flat", "raw gloo", "torch"):
        print(f"  {k:14} {med[k] * 1e3:8.2f} ms   runs: "
              + " ".join(f"{v * 1e3:.2f}" for v in samples[k]))
    print(f"  hierarchical / flat  {med['hierarchical'] / med['flat']:.3f}")
    print(f"  hierarchical / raw gloo  {med['hierarchical'] / med['raw gloo']:.3f}")
    print(f"  hierarchical / torch  {med['hierarchical'] / med['torch']:.3f}")


if __name__ == "__main__":
    main()
