"""ResNet-50 v1's gradient exchange through ringmaster.mxnet against MXNet's own parameter server
(kvstore dist_sync), side by side in one run, 2 workers on this machine.

    bench/mxnet_exchange.py [--np 2] [--steps 20] [--servers 1 2]

Each step exchanges the gradients of gluon's model zoo resnet50_v1 (161 arrays, 102 MB of float32)
in backward order (the last layer's first, priority -i as Horovod's trainer gives them), then waits
for all of them: through ringmaster.mxnet, allreduce_ of each (Average) under `ringmaster local`;
through dist_sync, push then pull of each, with its scheduler, servers and workers launched with
DMLC_ROLE / DMLC_PS_ROOT_URI / DMLC_PS_ROOT_PORT / DMLC_NUM_SERVER / DMLC_NUM_WORKER as MXNet's
launcher (tools/launch.py --launcher local) sets them; and Ringmaster's C++ path on the same bytes
(ringmaster-bench with the ResNet-50 profile). Prints each configuration's median step time
(over --steps after 3 warmup steps, median of the workers) and the ratios; the figures go to
docs/benchmarks.md.

Runs with the MXNet environment's python (scripts/mxnet-venv.sh); `--worker` modes are what the
driver starts.
"""
import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WARMUP = 3


def gradients():
    """ResNet-50 v1's gradient arrays (shapes from a forward pass), in backward order."""
    import mxnet as mx
    net = mx.gluon.model_zoo.vision.resnet50_v1()
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros((1, 3, 224, 224)))
    grads = [mx.nd.ones(p.shape) for p in net.collect_params().values() if p.grad_req != "null"]
    return list(reversed(grads))


def report(times, label):
    median = statistics.median(times[WARMUP:])
    print(f"RESULT {label} step_ms {median * 1000:.2f}", flush=True)


def ringmaster_worker(steps):
    import mxnet as mx
    import ringmaster.mxnet as hvd
    hvd.init()
    grads = gradients()
    times = []
    for _ in range(WARMUP + steps):
        started = time.perf_counter()
        for i, g in enumerate(grads):
            hvd.allreduce_(g, name=str(i), priority=-i)
        mx.nd.waitall()
        times.append(time.perf_counter() - started)
    report(times, f"ringmaster rank {hvd.rank()}")
    hvd.shutdown()


def kvstore_worker(steps):
    import mxnet as mx
    kv = mx.kv.create("dist_sync")
    grads = gradients()
    for i, g in enumerate(grads):
        kv.init(i, g)
    kv._barrier()
    times = []
    for _ in range(WARMUP + steps):
        started = time.perf_counter()
        for i, g in enumerate(grads):
            kv.push(i, g, priority=-i)
            kv.pull(i, out=g, priority=-i)
        mx.nd.waitall()
        times.append(time.perf_counter() - started)
    report(times, f"dist_sync rank {kv.rank}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def medians(output, label):
    values = [float(v) for v in re.findall(rf"RESULT {label} rank \d+ step_ms ([0-9.]+)", output)]
    if not values:
        sys.exit(f"no result for {label}:\n{output[-3000:]}")
    return statistics.median(values)


def run_ringmaster(np_, steps):
    r = subprocess.run([os.path.join(ROOT, "build", "bin", "ringmaster"), "local", "--np",
                        str(np_), "--", sys.executable, __file__, "--worker", "ringmaster",
                        "--steps", str(steps)], capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        sys.exit(f"ringmaster run failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return medians(r.stdout, "ringmaster")


def run_cpp(np_, steps):
    """Ringmaster's C++ path on the same bytes (ringmaster-bench, the ResNet-50 profile, tensors in
    the shared arena): what the Python and engine layers add to."""
    r = subprocess.run([os.path.join(ROOT, "build", "bin", "ringmaster"), "local", "--np",
                        str(np_), "--", os.path.join(ROOT, "build", "bin", "ringmaster-bench"),
                        "--profile", os.path.join(HERE, "profiles", "resnet50.json"), "--steps",
                        str(steps), "--warmup", str(WARMUP), "--json"],
                       capture_output=True, text=True, timeout=900)
    m = re.search(r'"system":"ringmaster".*"step_time_s_median":([0-9.]+)', r.stdout)
    if r.returncode != 0 or m is None:
        sys.exit(f"ringmaster-bench failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return float(m[1]) * 1000


def run_kvstore(np_, servers, steps):
    env = dict(os.environ, DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(free_port()),
               DMLC_NUM_SERVER=str(servers), DMLC_NUM_WORKER=str(np_))
    command = [sys.executable, __file__, "--worker", "kvstore", "--steps", str(steps)]
    procs = [subprocess.Popen(command, env=dict(env, DMLC_ROLE="scheduler"),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    procs += [subprocess.Popen(command, env=dict(env, DMLC_ROLE="server"),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
              for _ in range(servers)]
    workers = [subprocess.Popen(command, env=dict(env, DMLC_ROLE="worker"), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
               for _ in range(np_)]
    output = ""
    try:
        for w in workers:
            output += w.communicate(timeout=900)[0]
        for p in procs:
            p.wait(timeout=60)
    finally:
        for p in procs + workers:
            if p.poll() is None:
                p.kill()
    return medians(output, "dist_sync")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--servers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--worker", choices=["ringmaster", "kvstore"])
    args = parser.parse_args()
    if args.worker == "ringmaster":
        return ringmaster_worker(args.steps)
    if args.worker == "kvstore":
        # The scheduler and servers run MXNet's server loop inside mx.kv.create's import.
        if os.environ.get("DMLC_ROLE") in ("scheduler", "server"):
            import mxnet  # noqa: F401 - the server and scheduler run at import
            return None
        return kvstore_worker(args.steps)
    rows = [("ringmaster.mxnet (allreduce_, engine)", run_ringmaster(args.np, args.steps)),
            ("Ringmaster's C++ path (ringmaster-bench)", run_cpp(args.np, args.steps))]
    for servers in args.servers:
        rows.append((f"kvstore dist_sync, {servers} server(s)",
                     run_kvstore(args.np, servers, args.steps)))
    ours = rows[0][1]
    print(f"ResNet-50 v1 gradient exchange, np {args.np}, median step over {args.steps} steps")
    for label, ms in rows:
        print(f"  {label:40s} {ms:8.2f} ms   ringmaster / this = {ours / ms:.3f}")


if __name__ == "__main__":
    main()
