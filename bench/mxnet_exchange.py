"""ResNet-50 v1's gradient exchange (and whole training steps) through ringmaster.mxnet against
MXNet's own parameter server (kvstore dist_sync) and Horovod 0.28.1 with MXNet, side by side in one
run, 2 workers on this machine.

    bench/mxnet_exchange.py [--np 2] [--steps 20] [--servers 1 2] [--repeats 3]
    bench/mxnet_exchange.py --whole-step [--batch 4] ...

Each step exchanges the gradients of gluon's model zoo resnet50_v1 (161 arrays, 102 MB of float32)
in backward order (priority -i, as Horovod's trainer gives them), then waits for all of them:
  - ringmaster.mxnet under `ringmaster local`: DistributedTrainer.allreduce_grads() of the model's
    own gradients (Average; in the shared arena from the first step on), and allreduce_ of plain
    NDArrays (reduced where they are, in MXNet's memory);
  - Ringmaster's C++ path on the same bytes (ringmaster-bench, the ResNet-50 profile): what the
    Python and engine layers add to;
  - Horovod 0.28.1's DistributedTrainer.allreduce_grads() over Gloo, launched by horovodrun, when
    its environment exists (bench/horovod-mxnet.sh makes it);
  - kvstore dist_sync, push then pull of each, its scheduler, servers and workers launched with
    DMLC_ROLE / DMLC_PS_ROOT_URI / DMLC_PS_ROOT_PORT / DMLC_NUM_SERVER / DMLC_NUM_WORKER as MXNet's
    launcher (tools/launch.py --launcher local) sets them, with 1 and 2 servers.
With --whole-step each configuration runs whole training steps instead (forward and backward of
--batch random 224x224 images per rank, the exchange, SGD's update): the two DistributedTrainers
and gluon.Trainer over dist_sync. The configurations alternate --repeats times; each prints its
median step time (over --steps after 3 warmup steps, median of the workers), and the table gives
the median over the repeats and the ratios. The figures go to docs/benchmarks.md.

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


def resnet50():
    """gluon's resnet50_v1, initialised, with its shapes known (one forward)."""
    import mxnet as mx
    net = mx.gluon.model_zoo.vision.resnet50_v1()
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros((1, 3, 224, 224)))
    return net


def timed_steps(steps, step):
    import mxnet as mx
    times = []
    for _ in range(WARMUP + steps):
        started = time.perf_counter()
        step()
        mx.nd.waitall()
        times.append(time.perf_counter() - started)
    return times


def training_step(net, trainer, batch):
    """One whole step: forward and backward of `batch` random images, then trainer.step()."""
    import mxnet as mx
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    x = mx.nd.random.uniform(shape=(batch, 3, 224, 224))
    y = mx.nd.array([i % 1000 for i in range(batch)])

    def step():
        with mx.autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(batch)
    return step


def framework_worker(system, steps, mode, batch):
    """system "ringmaster" (ringmaster.mxnet) or "horovod" (horovod.mxnet, the yardstick). mode
    "trainer": DistributedTrainer.allreduce_grads() over the model's own gradients (for
    Ringmaster, in the shared arena from the first step on, as in training); "arrays": allreduce_
    of plain NDArrays; "step": whole training steps."""
    import mxnet as mx
    if system == "horovod":
        import horovod.mxnet as hvd
    else:
        import ringmaster.mxnet as hvd
    hvd.init()
    if mode == "arrays":
        grads = gradients()

        def step():
            for i, g in enumerate(grads):
                hvd.allreduce_(g, name=str(i), priority=-i)
    else:
        net = resnet50()
        params = net.collect_params()
        trainer = hvd.DistributedTrainer(params, "sgd", {"learning_rate": 0.01})
        if mode == "step":
            step = training_step(net, trainer, batch)
        else:
            for p in params.values():
                if p.grad_req != "null":
                    p.grad()[:] = 1

            def step():
                trainer.allreduce_grads()
    report(timed_steps(steps, step), f"{system}-{mode} rank {hvd.rank()}")
    hvd.shutdown()


def kvstore_worker(steps, mode, batch):
    import mxnet as mx
    kv = mx.kv.create("dist_sync")
    if mode == "step":
        # The servers aggregate the gradients (push, then pull of the sum), the workers update, as
        # the DistributedTrainers do: gluon.Trainer with update_on_kvstore=False, whose own kvstore
        # use MXNet 1.9.1's servers abort on ("init 4 first"), written out.
        net = resnet50()
        params = [p for p in net.collect_params().values() if p.grad_req != "null"]
        for i, p in enumerate(params):
            kv.init(i, p.grad())
        kv._barrier()

        class Aggregating(mx.gluon.Trainer):
            def _allreduce_grads(self):
                for i, p in enumerate(params):
                    kv.push(i, p.grad(), priority=-i)
                    kv.pull(i, out=p.grad(), priority=-i)
        trainer = Aggregating(net.collect_params(), "sgd",
                              {"learning_rate": 0.01, "rescale_grad": 1.0 / kv.num_workers},
                              kvstore=None)
        step = training_step(net, trainer, batch)
    else:
        grads = gradients()
        for i, g in enumerate(grads):
            kv.init(i, g)
        kv._barrier()

        def step():
            for i, g in enumerate(grads):
                kv.push(i, g, priority=-i)
                kv.pull(i, out=g, priority=-i)
    report(timed_steps(steps, step), f"dist_sync-{mode} rank {kv.rank}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def medians(output, label):
    values = [float(v) for v in re.findall(rf"RESULT {label} rank \d+ step_ms ([0-9.]+)", output)]
    if not values:
        sys.exit(f"no result for {label}:\n{output[-3000:]}")
    return statistics.median(values)


def run_ringmaster(np_, steps, mode, batch):
    r = subprocess.run([os.path.join(ROOT, "build", "bin", "ringmaster"), "local", "--np",
                        str(np_), "--", sys.executable, __file__, "--worker", "ringmaster",
                        "--mode", mode, "--steps", str(steps), "--batch", str(batch)],
                       capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        sys.exit(f"ringmaster run failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return medians(r.stdout, f"ringmaster-{mode}")


def run_horovod(python, np_, steps, mode, batch):
    """Horovod 0.28.1 with MXNet over Gloo (bench/horovod-mxnet.sh), launched by horovodrun on this
    host."""
    horovodrun = os.path.join(os.path.dirname(python), "horovodrun")
    r = subprocess.run([horovodrun, "-np", str(np_), "-H", f"localhost:{np_}", "--gloo", python,
                        __file__, "--worker", "horovod", "--mode", mode, "--steps", str(steps),
                        "--batch", str(batch)], capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        sys.exit(f"horovod run failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return medians(r.stdout, f"horovod-{mode}")


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


def run_kvstore(np_, servers, steps, mode, batch):
    env = dict(os.environ, DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(free_port()),
               DMLC_NUM_SERVER=str(servers), DMLC_NUM_WORKER=str(np_))
    command = [sys.executable, __file__, "--worker", "kvstore", "--mode", mode, "--steps",
               str(steps), "--batch", str(batch)]
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
            output += w.communicate(timeout=1800)[0]
        for p in procs:
            p.wait(timeout=60)
    finally:
        for p in procs + workers:
            if p.poll() is None:
                p.kill()
    return medians(output, f"dist_sync-{mode}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--servers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--whole-step", action="store_true",
                        help="time whole training steps (forward, backward, exchange, update) "
                             "instead of the exchange alone")
    parser.add_argument("--batch", type=int, default=4, help="images per rank (--whole-step)")
    parser.add_argument("--horovod", default=os.path.join(ROOT, "build", "horovod-mxnet-venv",
                                                          "bin", "python"),
                        help="python of the Horovod yardstick (bench/horovod-mxnet.sh); skipped "
                             "when absent")
    parser.add_argument("--worker", choices=["ringmaster", "horovod", "kvstore"])
    parser.add_argument("--mode", choices=["trainer", "arrays", "step"], default="trainer")
    args = parser.parse_args()
    if args.worker in ("ringmaster", "horovod"):
        return framework_worker(args.worker, args.steps, args.mode, args.batch)
    if args.worker == "kvstore":
        # The scheduler and servers run MXNet's server loop inside mx.kv.create's import.
        if os.environ.get("DMLC_ROLE") in ("scheduler", "server"):
            import mxnet  # noqa: F401 - the server and scheduler run at import
            return None
        return kvstore_worker(args.steps, args.mode, args.batch)
    np_, steps, batch = args.np, args.steps, args.batch
    if args.whole_step:
        configurations = [
            ("ringmaster.mxnet DistributedTrainer", lambda: run_ringmaster(np_, steps, "step",
                                                                           batch))]
        if os.path.exists(args.horovod):
            configurations.append(("Horovod 0.28.1 DistributedTrainer (Gloo)",
                                   lambda: run_horovod(args.horovod, np_, steps, "step", batch)))
        for servers in args.servers:
            configurations.append((f"gluon.Trainer, kvstore dist_sync, {servers} server(s)",
                                   lambda servers=servers: run_kvstore(np_, servers, steps, "step",
                                                                       batch)))
    else:
        configurations = [
            ("ringmaster.mxnet DistributedTrainer", lambda: run_ringmaster(np_, steps, "trainer",
                                                                           batch)),
            ("ringmaster.mxnet allreduce_ (arrays)", lambda: run_ringmaster(np_, steps, "arrays",
                                                                            batch)),
            ("Ringmaster's C++ path (ringmaster-bench)", lambda: run_cpp(np_, steps))]
        if os.path.exists(args.horovod):
            configurations.append(("Horovod 0.28.1 DistributedTrainer (Gloo)",
                                   lambda: run_horovod(args.horovod, np_, steps, "trainer",
                                                       batch)))
        for servers in args.servers:
            configurations.append((f"kvstore dist_sync, {servers} server(s)",
                                   lambda servers=servers: run_kvstore(np_, servers, steps,
                                                                       "arrays", batch)))
    # Alternating, so that a slow spell of the machine falls on every configuration alike.
    runs = {label: [] for label, _ in configurations}
    for repeat in range(args.repeats):
        for label, run in configurations:
            runs[label].append(run())
        print(f"repeat {repeat + 1}: " + ", ".join(f"{label} {runs[label][-1]:.2f} ms"
                                                   for label, _ in configurations), flush=True)
    rows = [(label, statistics.median(runs[label])) for label, _ in configurations]
    ours = rows[0][1]
    what = (f"whole training steps ({batch} images per rank)" if args.whole_step
            else "gradient exchange")
    print(f"ResNet-50 v1 {what}, np {np_}, median step over {steps} steps, median of "
          f"{args.repeats} runs")
    for label, ms in rows:
        print(f"  {label:48s} {ms:9.2f} ms   ringmaster / this = {ours / ms:.3f}")


if __name__ == "__main__":
    main()
