"""Trains a small CNN on a synthetic dataset with Ringmaster's Horovod API; needs no download.

    ringmaster local --np 2 -- python3 examples/pytorch_train_cnn.py

Rank 0 saves the trained model as model.pt in --model-dir, which defaults to the directory whose
files come back as the job's artifacts (RINGMASTER_OUTPUT_DIR, or SageMaker's SM_MODEL_DIR).

Each image is noise plus a bright square in one of four quadrants, and its label is that quadrant,
so the task is learnable and the loss falls within a few epochs. It is written as a Horovod script
would be: the only Ringmaster-specific line is the import.
"""
import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.data
import torch.utils.data.distributed

import ringmaster.torch as hvd


def synthetic_dataset(samples, size=28, seed=0):
    """(images [samples, 1, size, size], labels [samples]): the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(samples, 1, size, size, generator=g)
    labels = torch.randint(0, 4, (samples,), generator=g)
    half = size // 2
    for i in range(samples):
        q = int(labels[i])
        top, left = (q // 2) * half, (q % 2) * half
        dy, dx = torch.randint(0, half - 6, (2,), generator=g).tolist()
        images[i, 0, top + dy:top + dy + 6, left + dx:left + dx + 6] += 0.6
    return torch.utils.data.TensorDataset(images, labels)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, kernel_size=3, padding=1)
        self.fc1 = nn.Linear(16 * 7 * 7, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def metric_average(value, name):
    return hvd.allreduce(torch.tensor(value), name=name).item()


def main():
    parser = argparse.ArgumentParser(description="Ringmaster PyTorch synthetic CNN example")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--lr", type=float, default=0.005, help="per rank (scaled by size)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--model-dir",
                        default=os.environ.get("SM_MODEL_DIR") or os.environ.get(
                            "RINGMASTER_OUTPUT_DIR"),
                        help="where rank 0 saves model.pt (default: the job's output directory; "
                             "none outside a job)")
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(args.seed)
    # Ranks on one host share its cores.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))

    dataset = synthetic_dataset(args.samples)
    sampler = torch.utils.data.distributed.DistributedSampler(
        dataset, num_replicas=hvd.size(), rank=hvd.rank(), seed=args.seed)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    for epoch in range(1, args.epochs + 1):
        model.train()
        sampler.set_epoch(epoch)
        total_loss, correct, seen = 0.0, 0, 0
        for data, target in loader:
            optimizer.zero_grad()
            output = model(data)
            loss = F.cross_entropy(output, target)
            loss.backward()
            optimizer.step()
            total_loss += loss.item() * len(data)
            correct += (output.argmax(1) == target).sum().item()
            seen += len(data)
        loss = metric_average(total_loss / seen, "avg_loss")
        accuracy = metric_average(correct / seen, "avg_accuracy")
        if hvd.rank() == 0:
            print(f"epoch {epoch}: loss {loss:.4f} accuracy {accuracy:.3f}", flush=True)
    if hvd.rank() == 0 and args.model_dir:
        os.makedirs(args.model_dir, exist_ok=True)
        torch.save(model.state_dict(), os.path.join(args.model_dir, "model.pt"))
        print(f"saved {os.path.join(args.model_dir, 'model.pt')}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
