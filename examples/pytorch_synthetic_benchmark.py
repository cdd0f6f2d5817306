"""Horovod's PyTorch synthetic benchmark on Ringmaster: a model trained on random data with
DistributedOptimizer, printing images per second per rank and in total. Needs no download.

    ringmaster local --np 2 -- python3 examples/pytorch_synthetic_benchmark.py --model resnet50
    ringmaster local --np 2 -- python3 examples/pytorch_synthetic_benchmark.py --model small-cnn

Models come from torchvision (python3-torchvision) when it is installed; without it (or with
--model small-cnn) a small built-in CNN is used.
"""
import argparse
import os
import statistics
import timeit

import torch
import torch.nn as nn
import torch.nn.functional as F

import ringmaster.torch as hvd

try:
    import torchvision.models as models
except ImportError:  # the benchmark still runs, on the built-in CNN
    models = None


class SmallCNN(nn.Module):
    """A few convolutions: enough to exercise many gradients without torchvision."""

    def __init__(self, num_classes=1000):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.BatchNorm2d(128), nn.ReLU(),
            nn.Conv2d(128, 256, 3, stride=2, padding=1), nn.BatchNorm2d(256), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1))
        self.classifier = nn.Linear(256, num_classes)

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))


def make_model(name):
    if name == "small-cnn":
        return SmallCNN(), name
    if models is None:
        return SmallCNN(), "small-cnn (torchvision is not installed)"
    if not hasattr(models, name):
        raise SystemExit(f"unknown model {name!r}: a torchvision.models name or small-cnn")
    return getattr(models, name)(), name


def main():
    parser = argparse.ArgumentParser(description="PyTorch synthetic benchmark on Ringmaster",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--fp16-allreduce", action="store_true", default=False,
                        help="use fp16 compression during allreduce")
    parser.add_argument("--model", type=str, default="resnet50",
                        help="a torchvision.models name, or small-cnn")
    parser.add_argument("--batch-size", type=int, default=32, help="input batch size per rank")
    parser.add_argument("--image-size", type=int, default=224, help="input images' side")
    parser.add_argument("--num-warmup-batches", type=int, default=10,
                        help="number of warm-up batches that don't count towards benchmark")
    parser.add_argument("--num-batches-per-iter", type=int, default=10,
                        help="number of batches per benchmark iteration")
    parser.add_argument("--num-iters", type=int, default=10, help="number of benchmark iterations")
    parser.add_argument("--no-cuda", action="store_true", default=False,
                        help="disables CUDA training")
    args = parser.parse_args()
    args.cuda = not args.no_cuda and torch.cuda.is_available()

    hvd.init()
    if args.cuda:
        torch.cuda.set_device(hvd.local_rank())
    else:
        # Ranks on one host share its cores.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))

    model, model_name = make_model(args.model)
    if args.cuda:
        model.cuda()
    lr_scaler = hvd.size()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * lr_scaler)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression, op=hvd.Average)

    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    target = torch.randint(0, 1000, (args.batch_size,))
    if args.cuda:
        data, target = data.cuda(), target.cuda()

    def benchmark_step():
        optimizer.zero_grad()
        output = model(data)
        loss = F.cross_entropy(output, target)
        loss.backward()
        optimizer.step()

    def log(s):
        if hvd.rank() == 0:
            print(s, flush=True)

    device = "GPU" if args.cuda else "CPU"
    log(f"Model: {model_name}")
    log(f"Batch size: {args.batch_size}")
    log(f"Number of {device}s: {hvd.size()}")

    log("Running warmup...")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)

    log("Running benchmark...")
    img_secs = []
    for x in range(args.num_iters):
        seconds = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / seconds
        log(f"Iter #{x}: {img_sec:.1f} img/sec per {device}")
        img_secs.append(img_sec)

    img_sec_mean = statistics.mean(img_secs)
    img_sec_conf = 1.96 * (statistics.pstdev(img_secs) if len(img_secs) > 1 else 0.0)
    log(f"Img/sec per {device}: {img_sec_mean:.1f} +-{img_sec_conf:.1f}")
    log(f"Total img/sec on {hvd.size()} {device}(s): {hvd.size() * img_sec_mean:.1f} "
        f"+-{hvd.size() * img_sec_conf:.1f}")
    hvd.shutdown()


if __name__ == "__main__":
    main()
