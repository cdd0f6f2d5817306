"""Run as every rank of a `ringmaster local --np 2 --timeline timeline.json` job, in the MXNet
environment: trains a deep stack of Dense layers (compute-heavy backward, small gradients) for two
steps through DistributedTrainer, and prints, on rank 0, how long one backward takes alone, so that
test_mxnet_api.py can read in the job's timeline whether the allreduces ran while backward still
computed (as Horovod's do inside MXNet's engine) rather than after it.

    overlap_checks: rank 0: backward alone S seconds, layers N
"""
import time

import mxnet as mx
import numpy as np

import ringmaster.mxnet as hvd

LAYERS = 8
WIDTH = 512
BATCH = 2048


def main():
    hvd.init()
    mx.random.seed(1)
    net = mx.gluon.nn.HybridSequential()
    for _ in range(LAYERS):
        net.add(mx.gluon.nn.Dense(WIDTH, activation="relu", in_units=WIDTH))
    net.initialize(mx.init.Xavier())
    x = mx.nd.array(np.random.RandomState(hvd.rank()).rand(BATCH, WIDTH).astype(np.float32))

    def backward():
        with mx.autograd.record():
            loss = net(x).square().mean()
        loss.backward()
        return loss

    # Backward alone (no collective), warm.
    for _ in range(2):
        backward()
        mx.nd.waitall()
    started = time.perf_counter()
    backward()
    mx.nd.waitall()
    alone = time.perf_counter() - started
    hvd.broadcast_parameters(net.collect_params(), root_rank=0, prefix="overlap.")
    trainer = hvd.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 1e-6},
                                     prefix="overlap.")
    for _ in range(2):  # the first step moves the gradients into the arena
        backward()
        trainer.step(BATCH)
        mx.nd.waitall()
    if hvd.rank() == 0:
        print(f"overlap_checks: rank 0: backward alone {alone:.4f} seconds, layers {LAYERS}",
              flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
