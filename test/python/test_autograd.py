"""The differentiable collectives' gradients, as Horovod 0.28.1 defines them, against values
worked out by hand: alone and grouped, in the global set and in a process set."""

import pytest
import torch

import gradsync.torch as hvd


def _mean_weight(members):
    """Each rank r weighs its loss by r + 1; the mean of those weights over `members`."""
    return sum(r + 1 for r in members) / len(members)


def test_allreduce_gradient_is_the_reduced_gradient(rank, size):
    x = torch.full((3,), float(rank + 1), requires_grad=True)
    y = hvd.allreduce(x, op=hvd.Sum, name="grad.ar")
    (y * (rank + 1)).sum().backward()
    # d(sum over ranks of (r+1) * sum_j y_j)/dx = sum over ranks of (r+1).
    assert torch.equal(x.grad, torch.full((3,), float(sum(range(1, size + 1)))))


def test_allgather_gradient_is_the_averaged_gradient_of_this_ranks_rows(rank, size):
    x = torch.full((rank + 1, 2), 1.0, requires_grad=True)
    y = hvd.allgather(x, name="grad.ag")
    weights = torch.arange(y.shape[0], dtype=torch.float32).unsqueeze(1)
    (y * weights * (rank + 1)).sum().backward()
    start = sum(r + 1 for r in range(rank))
    want = torch.arange(start, start + rank + 1, dtype=torch.float32).unsqueeze(1)
    assert torch.equal(x.grad, (want * _mean_weight(range(size))).expand(rank + 1, 2))


def test_grouped_allgather_is_differentiable_as_allgather(rank, size):
    a = torch.full((rank + 1, 2), 1.0, requires_grad=True)
    b = torch.full((2,), 1.0, requires_grad=True)
    ya, yb = hvd.grouped_allgather([a, b], name="grad.gag")
    assert ya.grad_fn is not None and yb.grad_fn is not None
    ((ya.sum() + (yb * torch.arange(2 * size)).sum()) * (rank + 1)).backward()
    assert torch.equal(a.grad, torch.full((rank + 1, 2), _mean_weight(range(size))))
    assert torch.equal(b.grad, torch.arange(2 * rank, 2 * rank + 2, dtype=torch.float32)
                       * _mean_weight(range(size)))


def test_broadcast_gradient_is_the_averaged_gradient_on_the_root(rank, size):
    x = torch.ones(2, requires_grad=True)
    (hvd.broadcast(x, 0, name="grad.bc") * (rank + 1)).sum().backward()
    want = _mean_weight(range(size)) if rank == 0 else 0.0
    assert torch.equal(x.grad, torch.full((2,), want))


@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average])
def test_reducescatter_gradient_gathers_the_shares(op, rank, size):
    x = torch.ones(size * 2, 3, requires_grad=True)
    y = hvd.reducescatter(x, op=op, name="grad.rs.%s" % op, prescale_factor=2.0)
    (y * (rank + 1)).sum().backward()
    # Rank r's share (rows 2r, 2r + 1) carries its weight r + 1; a sum multiplies by the size,
    # and the scale factors apply as in the forward pass.
    weights = torch.tensor([r + 1 for r in range(size) for _ in range(2)], dtype=torch.float32)
    factor = 2.0 * (size if op == hvd.Sum else 1)
    assert torch.equal(x.grad, (weights * factor).unsqueeze(1).expand(size * 2, 3))


def test_grouped_reducescatter_is_differentiable_as_reducescatter(rank, size):
    a = torch.ones(size, requires_grad=True)
    b = torch.ones(size * 3, 2, requires_grad=True)
    ya, yb = hvd.grouped_reducescatter([a, b], op=hvd.Sum, name="grad.grs")
    assert ya.grad_fn is not None
    (ya.sum() + yb.sum()).backward()
    assert torch.equal(a.grad, torch.full((size,), float(size)))
    assert torch.equal(b.grad, torch.full((size * 3, 2), float(size)))


def test_gradients_in_a_process_set(rank, size):
    """Averages are over the set's members only; the broadcast's root is the set's first member,
    named by its global rank."""
    if size < 2:
        pytest.skip("needs a set smaller than the world")
    members = [r for r in range(size) if r % 2 == 0]
    others = [r for r in range(size) if r % 2 == 1]
    evens = hvd.add_process_set(members)
    odds = hvd.add_process_set(others) if len(others) > 1 else None
    try:
        mine = evens if rank in members else odds
        if mine is None:
            return  # the lone odd rank of 2 ranks: its set would be the global one's size 1
        group = members if rank in members else others
        x = torch.ones(2, 1, requires_grad=True)
        y = hvd.allgather(x, name="grad.set.ag", process_set=mine)
        (y * (rank + 1)).sum().backward()
        assert torch.equal(x.grad, torch.full((2, 1), _mean_weight(group)))
        z = torch.ones(3, requires_grad=True)
        root = group[0]  # a global rank, as Horovod takes roots
        (hvd.broadcast(z, root, name="grad.set.bc", process_set=mine) * (rank + 1)).sum() \
            .backward()
        want = _mean_weight(group) if rank == group[0] else 0.0
        assert torch.equal(z.grad, torch.full((3,), want))
    finally:
        if odds is not None:
            hvd.remove_process_set(odds)
        hvd.remove_process_set(evens)


def test_alltoall_gradient_returns_rows_home(rank, size):
    x = torch.full((size, 2), float(rank), requires_grad=True)
    y = hvd.alltoall(x, name="grad.a2a")
    (y * (rank + 1)).sum().backward()
    # Row r of x went to rank r, whose loss weighs it by r + 1.
    assert torch.equal(x.grad, torch.arange(1, size + 1, dtype=torch.float32)
                       .unsqueeze(1).expand(size, 2))
