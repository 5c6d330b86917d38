"""Data-parallel training of a small classifier on synthetic data with Horovod's PyTorch API.

Every rank builds the same synthetic data set (random points in linearly separable classes),
trains on its own shard of it and averages gradients with the other ranks. Run it from the build
directory with the interpreter that has PyTorch and the package (examples/pytorch/README.md):

    PYTHONPATH=python mpirun -np 2 /usr/bin/python3 ../examples/pytorch/pytorch_synthetic_train.py
"""

import argparse
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.data
import torch.utils.data.distributed

import gradsync.torch as hvd

parser = argparse.ArgumentParser(description="PyTorch synthetic classification example",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--epochs", type=int, default=5, help="number of epochs to train")
parser.add_argument("--batch-size", type=int, default=32, help="training batch size per rank")
parser.add_argument("--test-batch-size", type=int, default=256, help="test batch size per rank")
parser.add_argument("--lr", type=float, default=0.01, help="learning rate of a single rank")
parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
parser.add_argument("--num-samples", type=int, default=4096, help="training set size")
parser.add_argument("--num-features", type=int, default=16, help="input features per sample")
parser.add_argument("--num-classes", type=int, default=4, help="number of classes")
parser.add_argument("--seed", type=int, default=42, help="random seed")
parser.add_argument("--fp16-allreduce", action="store_true", default=False,
                    help="compress gradients to float16 for the allreduce")
parser.add_argument("--check-accuracy", type=float, default=None, metavar="X",
                    help="exit with an error unless the final test accuracy is at least X")
parser.add_argument("--check-replicas", action="store_true", default=False,
                    help="exit with an error unless every rank ends with the same weights")


def make_dataset(weights, num_samples, generator):
    """Random points in linearly separable classes, which the untrained model does not separate.

    A point's class is the row of ``weights`` that has the largest dot product with it.
    """
    points = torch.randn(num_samples, weights.shape[1], generator=generator)
    labels = (points @ weights.t()).argmax(dim=1)
    return torch.utils.data.TensorDataset(points, labels)


class Net(nn.Module):
    def __init__(self, num_features, num_classes, hidden=64):
        super().__init__()
        self.fc1 = nn.Linear(num_features, hidden)
        # Batch statistics over every rank's batch, as one large batch would have them.
        self.bn1 = hvd.SyncBatchNorm(hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x):
        return self.fc2(F.relu(self.bn1(self.fc1(x))))


def metric_average(value, name):
    """The mean of a per-rank number over all ranks."""
    return hvd.allreduce(torch.tensor(value), name=name).item()


def replicas_identical():
    """Whether every rank holds the same parameters and buffers, bit for bit."""
    state = torch.cat([t.detach().double().flatten() for t in model.state_dict().values()])
    every_rank = hvd.allgather(state.unsqueeze(0), name="replica_check")
    return bool((every_rank == every_rank[0]).all().item())


def train(epoch):
    model.train()
    # A new shuffle every epoch, the same split into shards on every rank.
    train_sampler.set_epoch(epoch)
    total_loss = 0.0
    for data, target in train_loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
        total_loss += loss.item()
    return metric_average(total_loss / len(train_loader), "train_loss")


def evaluate():
    model.eval()
    total_loss, correct = 0.0, 0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            total_loss += F.cross_entropy(output, target, reduction="sum").item()
            correct += (output.argmax(dim=1) == target).sum().item()
    # Every shard has the same size (the sampler pads), so the mean of the ranks' means is the
    # mean over the whole test set.
    test_loss = metric_average(total_loss / len(test_sampler), "test_loss")
    accuracy = metric_average(correct / len(test_sampler), "test_accuracy")
    return test_loss, accuracy


if __name__ == "__main__":
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(args.seed)
    # Ranks share the machine's cores; one thread each keeps them from competing.
    torch.set_num_threads(1)

    # The same data on every rank; the samplers give each rank a disjoint shard of it.
    generator = torch.Generator().manual_seed(args.seed)
    weights = torch.randn(args.num_classes, args.num_features, generator=generator)
    train_dataset = make_dataset(weights, args.num_samples, generator)
    test_dataset = make_dataset(weights, args.num_samples // 4, generator)
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    test_sampler = torch.utils.data.distributed.DistributedSampler(
        test_dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size,
                                               sampler=train_sampler)
    test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=args.test_batch_size,
                                              sampler=test_sampler)

    model = Net(args.num_features, args.num_classes)
    # The global batch grows with the number of ranks, and the learning rate with it.
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(),
                                momentum=args.momentum)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)

    # Start every rank from rank 0's weights and optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    test_loss, accuracy = evaluate()
    if hvd.rank() == 0:
        print("ranks: %d, before training: test loss %.4f, test accuracy %.1f%%"
              % (hvd.size(), test_loss, 100 * accuracy))
    start = time.time()
    for epoch in range(1, args.epochs + 1):
        train_loss = train(epoch)
        test_loss, accuracy = evaluate()
        if hvd.rank() == 0:
            print("epoch %d: train loss %.4f, test loss %.4f, test accuracy %.1f%%"
                  % (epoch, train_loss, test_loss, 100 * accuracy))
    if hvd.rank() == 0:
        print("trained %d epochs in %.1f s" % (args.epochs, time.time() - start))

    # Every rank holds the same averaged accuracy, so every rank passes or fails together.
    if args.check_accuracy is not None and accuracy < args.check_accuracy:
        if hvd.rank() == 0:
            print("final test accuracy %.3f is below %.3f" % (accuracy, args.check_accuracy))
        sys.exit(1)
    # Ranks that trained apart on their shards could each pass the accuracy check: averaged
    # gradients from the same start leave every rank with the same weights.
    if args.check_replicas:
        identical = replicas_identical()
        if hvd.rank() == 0:
            print("replicas identical: %s" % ("yes" if identical else "NO"))
        if not identical:
            sys.exit(1)
