"""DistributedDataParallel across backward passes as PyTorch DDP's: a gradient accumulated under
no_sync() is averaged by the next synchronized backward even where that one does not reach it,
and torch.autograd.grad through the output (a gradient penalty) leaves the step to the
backward() that follows."""

import contextlib
import warnings

import pytest
import torch

import gradsync.torch as hvd
from test_ddp import TOLERANCE, Branchy, batch, loss_of

# Where the gradients go: the runtime's batch, DDP's buckets as views, or DDP's buckets (which
# join() uses).
CARRIERS = ["batch", "views", "buckets"]


def wrap(module, carrier, find_unused=False):
    return hvd.DistributedDataParallel(module, find_unused_parameters=find_unused,
                                       gradient_as_bucket_view=carrier == "views")


def carried_by(model, carrier):
    return model.join() if carrier == "buckets" else contextlib.nullcontext()


def mean_over_ranks(tensor, name):
    return hvd.allgather(tensor.detach().unsqueeze(0), name=name).mean(0)


@pytest.mark.parametrize("carrier", CARRIERS)
@pytest.mark.parametrize("find_unused", [False, True])
def test_a_gradient_accumulated_under_no_sync_is_averaged_where_backward_skips_it(
        find_unused, carrier, rank, size):
    inner = Branchy(lambda r: True)
    model = wrap(inner, carrier, find_unused)
    x, y = batch(0, rank)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the parameters no backward reaches
        with carried_by(model, carrier):
            with model.no_sync():
                loss_of(model, x, y).backward()
            accumulated = inner.side.weight.grad.clone()
            assert torch.count_nonzero(accumulated) > 0
            want = mean_over_ranks(accumulated, "accumulated.side")
            inner.used_on = lambda r: False
            loss_of(model, x, y).backward()
    assert torch.allclose(inner.side.weight.grad, want, atol=TOLERANCE, rtol=0)
    if find_unused:
        assert inner.never.weight.grad is None  # no rank ever used it: left as it was
    else:
        assert torch.count_nonzero(inner.never.weight.grad) == 0


def expect_one_process_gradients(carrier, rank, size, seed, step):
    """Runs ``step(model, rank)`` through the wrapper on every rank and checks its gradients are
    the mean of one process running ``step`` for every rank on a plain copy."""
    def make():
        torch.manual_seed(seed)
        return torch.nn.Linear(4, 1).double()

    model = wrap(make(), carrier)
    with carried_by(model, carrier):
        step(model, rank)
    want = make()
    for r in range(size):
        step(want, r)
    for got, expected in zip(model.parameters(), want.parameters()):
        assert torch.allclose(got.grad, expected.grad / size, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("carrier", CARRIERS)
def test_a_gradient_penalty_through_the_output_leaves_the_step_to_backward(carrier, rank, size):
    def step(model, r):
        gen = torch.Generator().manual_seed(r)
        real = torch.randn(3, 4, generator=gen, dtype=torch.float64)
        mixed = torch.randn(3, 4, generator=gen, dtype=torch.float64).requires_grad_()
        score = model(real)
        penalty_of, = torch.autograd.grad(model(mixed).sum(), mixed, create_graph=True)
        (score.sum() + penalty_of.pow(2).sum()).backward()

    expect_one_process_gradients(carrier, rank, size, 5, step)


@pytest.mark.parametrize("carrier", CARRIERS)
def test_a_penalty_on_the_parameters_gradients_leaves_the_step_to_backward(carrier, rank, size):
    """torch.autograd.grad with respect to the parameters themselves (a gradient-norm penalty)."""
    def step(model, r):
        gen = torch.Generator().manual_seed(r)
        x = torch.randn(3, 4, generator=gen, dtype=torch.float64)
        loss = model(x).pow(2).sum()
        grads = torch.autograd.grad(loss, list(model.parameters()), create_graph=True)
        (loss + sum(g.pow(2).sum() for g in grads)).backward()

    expect_one_process_gradients(carrier, rank, size, 6, step)


def test_a_wrapper_made_under_no_grad(rank, size):
    with torch.no_grad():
        model = wrap(Branchy(lambda r: True), "batch")
    x, y = batch(0, rank)
    loss_of(model, x, y).backward()
    assert model.module.trunk.weight.grad is not None


@pytest.mark.parametrize("carrier", CARRIERS)
@pytest.mark.parametrize("middle", ["no_grad", "no_sync"])
def test_a_forward_that_does_not_synchronize_leaves_the_pending_backward_synchronized(
        middle, carrier, rank, size):
    # A target network's forward (BYOL, SimSiam) between a forward and its backward: PyTorch DDP
    # still averages that backward, which the first forward prepared.
    linear = torch.nn.Linear(4, 1, bias=False).double()
    model = wrap(linear, carrier)
    x = torch.full((2, 4), float(rank + 1), dtype=torch.float64)
    with carried_by(model, carrier):
        out = model(x)
        with torch.no_grad() if middle == "no_grad" else model.no_sync():
            model(x)
        out.sum().backward()
    # This rank's gradient is 2 (rank + 1) everywhere; their mean is size + 1.
    assert torch.allclose(linear.weight.grad, torch.full_like(linear.weight.grad, size + 1.0))
