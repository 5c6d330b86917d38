"""The differentiable collectives' gradients, against what each rank's loss implies."""

import torch

import gradsync.torch as hvd


def test_allreduce_gradient_is_the_reduced_gradient(rank, size):
    x = torch.full((3,), float(rank + 1), requires_grad=True)
    y = hvd.allreduce(x, op=hvd.Sum, name="grad.ar")
    (y * (rank + 1)).sum().backward()
    # d(sum over ranks of (r+1) * sum_j y_j)/dx = sum over ranks of (r+1).
    assert torch.equal(x.grad, torch.full((3,), float(sum(range(1, size + 1)))))


def test_allgather_gradient_takes_this_ranks_rows(rank, size):
    x = torch.full((rank + 1, 2), 1.0, requires_grad=True)
    y = hvd.allgather(x, name="grad.ag")
    weights = torch.arange(y.shape[0], dtype=torch.float32).unsqueeze(1)
    (y * weights).sum().backward()
    start = sum(r + 1 for r in range(rank))
    want = torch.arange(start, start + rank + 1, dtype=torch.float32).unsqueeze(1) * size
    assert torch.equal(x.grad, want.expand(rank + 1, 2))


def test_broadcast_gradient_reaches_the_root_only(rank, size):
    x = torch.ones(2, requires_grad=True)
    hvd.broadcast(x, 0, name="grad.bc").sum().backward()
    assert torch.equal(x.grad, torch.full((2,), float(size) if rank == 0 else 0.0))


def test_reducescatter_gradient(rank, size):
    x = torch.ones(size * 2, 3, requires_grad=True)
    y = hvd.reducescatter(x, op=hvd.Sum, name="grad.rs")
    y.sum().backward()
    assert torch.equal(x.grad, torch.ones(size * 2, 3))


def test_alltoall_gradient_returns_rows_home(rank, size):
    x = torch.full((size, 2), float(rank), requires_grad=True)
    y = hvd.alltoall(x, name="grad.a2a")
    (y * (rank + 1)).sum().backward()
    # Row r of x went to rank r, whose loss weighs it by r + 1.
    assert torch.equal(x.grad, torch.arange(1, size + 1, dtype=torch.float32)
                       .unsqueeze(1).expand(size, 2))
