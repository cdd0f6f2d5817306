"""Data-parallel training of a small Gluon CNN with ringmaster.mxnet, the way Horovod's MXNet users
write it (only the import differs from `import horovod.mxnet as hvd`):

    ringmaster local --np 2 -- $(scripts/mxnet-venv.sh) examples/mxnet_gluon_cnn.py --epochs 3

The data is generated (4 classes of 12x12 images, each with a bright patch at its own place under
noise) and sharded by rank as with mx.gluon.data's num_parts/part_index. Every rank prints its loss;
rank 0 its accuracy on held-out data, and every rank the checksum of its parameters at the end
(equal on every rank).
"""
import argparse
import time

import mxnet as mx
import numpy as np

import ringmaster.mxnet as hvd


def generate(n, seed):
    rng = np.random.RandomState(seed)
    labels = rng.randint(0, 4, n)
    images = rng.normal(0, 1.0, (n, 1, 12, 12)).astype(np.float32)
    for i, label in enumerate(labels):
        row, col = divmod(int(label), 2)
        images[i, 0, row * 6 + 1:row * 6 + 5, col * 6 + 1:col * 6 + 5] += 1.0
    return images, labels.astype(np.float32)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    hvd.init()
    context = mx.cpu()  # on GPUs: mx.gpu(hvd.local_rank())

    images, labels = generate(2048, seed=1)
    # Each rank trains on its own part of the data.
    train = mx.gluon.data.ArrayDataset(images[hvd.rank()::hvd.size()],
                                       labels[hvd.rank()::hvd.size()])
    loader = mx.gluon.data.DataLoader(train, batch_size=args.batch_size, shuffle=True,
                                      last_batch="discard")
    test_images, test_labels = generate(512, seed=2)

    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(8, kernel_size=3, activation="relu"),
            mx.gluon.nn.MaxPool2D(pool_size=2),
            mx.gluon.nn.Flatten(),
            mx.gluon.nn.Dense(32, activation="relu"),
            mx.gluon.nn.Dense(4))
    net.initialize(mx.init.Xavier(), ctx=context)  # deferred: shapes come at the first forward
    net.hybridize()

    params = net.collect_params()
    if params is not None:
        hvd.broadcast_parameters(params, root_rank=0)
    # Horovod scales the learning rate by the number of ranks.
    trainer = hvd.DistributedTrainer(params, "sgd", {"learning_rate": args.lr * hvd.size(),
                                                     "momentum": 0.9})
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()

    for epoch in range(args.epochs):
        started = time.time()
        total, batches = 0.0, 0
        for data, label in loader:
            data, label = data.as_in_context(context), label.as_in_context(context)
            with mx.autograd.record():
                loss = loss_fn(net(data), label)
            loss.backward()
            trainer.step(args.batch_size)
            total += loss.mean().asscalar()
            batches += 1
        line = f"epoch {epoch} loss {total / batches:.4f} time {time.time() - started:.2f}s"
        if hvd.rank() == 0:
            predicted = net(mx.nd.array(test_images, ctx=context)).argmax(axis=1).asnumpy()
            line += f" accuracy {np.mean(predicted == test_labels):.3f}"
        print(line, flush=True)

    checksum = sum(float(p.data().asnumpy().astype(np.float64).sum())
                   for p in params.values())
    print(f"parameters checksum {checksum:.10e}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
