"""PowerSGD as a communication hook of gradsync's DistributedDataParallel
(gradsync.torch.powersgd): the same training as PyTorch DDP's own PowerSGD hook on the full batch,
which is what averaging the ranks' compressed gradients amounts to (P and Q are linear in the
summed gradient, and the ranks' errors sum to the full batch's)."""

import math

import numpy
import pytest
import torch

import gradsync.torch as hvd
from gradsync.torch import powersgd
from test_ddp import assert_replicas_equal, flat

PER_RANK = 4
STEPS = 5
_RETIRED_GROUPS = []

dist = pytest.importorskip("torch.distributed")
if not (dist.is_available() and dist.is_gloo_available()):
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_powersgd  # noqa


def make_model():
    """Matrices that compress at rank 1 (24 x 12, 24 x 24 twice, 4 x 24), vectors that do not."""
    torch.manual_seed(4321)
    return torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.Tanh(),
                               torch.nn.Linear(24, 24), torch.nn.Tanh(),
                               torch.nn.Linear(24, 24), torch.nn.Tanh(),
                               torch.nn.Linear(24, 4)).double()


def batch(step, rank):
    gen = torch.Generator().manual_seed(7000 * step + rank)
    return (torch.randn(PER_RANK, 12, generator=gen, dtype=torch.float64),
            torch.randn(PER_RANK, 4, generator=gen, dtype=torch.float64))


def loss_of(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


def train(model, hook, state, rows_of_step):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model.register_comm_hook(state, hook)
    for step in range(STEPS):
        optimizer.zero_grad()
        x, y = zip(*rows_of_step(step))
        loss_of(model, torch.cat(x), torch.cat(y)).backward()
        optimizer.step()
    return flat(model.parameters())


def torch_ddp_on_the_full_batch(size, hook, settings):
    """PyTorch DDP with its PowerSGD hook, alone in a process group of one, on every rank's rows."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = torch.nn.parallel.DistributedDataParallel(make_model())
        state = torch_powersgd.PowerSGDState(process_group=None, **settings)
        params = train(model, hook, state, lambda step: [batch(step, r) for r in range(size)])
        return params, state
    finally:
        # PyTorch's hook chains its steps with callbacks that hold the group and run on gloo's
        # threads; were one of those threads to drop the group's last reference, the group
        # would join its threads from one of them and abort the process. So the group lives on
        # until the process ends.
        _RETIRED_GROUPS.append(dist.distributed_c10d._get_default_group())
        dist.destroy_process_group()


SETTINGS = [
    dict(matrix_approximation_rank=1, start_powerSGD_iter=2),
    dict(matrix_approximation_rank=2, start_powerSGD_iter=2, batch_tensors_with_same_shape=True),
    dict(matrix_approximation_rank=3, start_powerSGD_iter=3, warm_start=False,
         use_error_feedback=False, random_seed=5),
    dict(matrix_approximation_rank=1, start_powerSGD_iter=2, min_compression_rate=8),
]


@pytest.mark.parametrize("settings", SETTINGS)
@pytest.mark.parametrize("theirs,views", [(False, False), (True, False), (False, True)])
def test_powersgd_trains_as_torch_ddp_on_the_full_batch(settings, theirs, views, rank, size):
    """gradsync's hook and state, or PyTorch's registered as they are, over the ranks, the
    buckets copied or the gradients' own (gradient_as_bucket_view): the parameters and the
    state's counts of PyTorch DDP's PowerSGD on everyone's rows."""
    if theirs:
        state = torch_powersgd.PowerSGDState(process_group=None, **settings)
        hook = torch_powersgd.powerSGD_hook
    else:
        state = powersgd.PowerSGDState(**settings)
        hook = powersgd.powerSGD_hook
    model = hvd.DistributedDataParallel(make_model(), gradient_as_bucket_view=views)
    got = train(model, hook, state, lambda step: [batch(step, rank)])
    assert_replicas_equal(got)
    want, their_state = torch_ddp_on_the_full_batch(size, torch_powersgd.powerSGD_hook, settings)
    assert torch.allclose(got, want, atol=1e-9, rtol=0), (got - want).abs().max()
    assert state.iter == their_state.iter == STEPS
    assert state.compression_stats() == their_state.compression_stats()
    assert state.compression_stats()[0] > 1


def test_powersgd_before_its_first_step_averages(rank, size):
    state = powersgd.PowerSGDState(start_powerSGD_iter=10)
    model = hvd.DistributedDataParallel(make_model())
    model.register_comm_hook(state, powersgd.powerSGD_hook)
    loss_of(model, *batch(0, rank)).backward()
    got = flat(p.grad for p in model.parameters())
    plain = make_model()
    x, y = zip(*[batch(0, r) for r in range(size)])
    loss_of(plain, torch.cat(x), torch.cat(y)).backward()
    assert torch.allclose(got, flat(p.grad for p in plain.parameters()), atol=1e-12, rtol=0)
    assert state.iter == 1 and state.compression_stats() == (0, 0, 0)


def test_powersgd_state_refuses_what_gradsync_cannot_honour():
    with pytest.raises(ValueError, match="no process group"):
        powersgd.PowerSGDState(process_group=object())
    with pytest.raises(ValueError, match="start_powerSGD_iter"):
        powersgd.PowerSGDState(start_powerSGD_iter=1)


def _orthonormal(matrix):
    q, _ = torch.linalg.qr(matrix)
    return q * torch.sign(torch.diagonal(q.T @ matrix))  # Gram-Schmidt's signs


def test_batched_powersgd_is_the_projection_of_the_average(rank, size):
    """The whole bucket as one square matrix M (padded): its first compressed step gives
    P P^T M for P the orthonormal M Q, Q the seeded random start (and M itself at full rank)."""
    for approximation_rank in (1, 3):  # Linear(3, 2)'s 8 gradients: a 3 x 3 square
        torch.manual_seed(99)
        model = hvd.DistributedDataParallel(torch.nn.Linear(3, 2).double())
        state = powersgd.PowerSGDState(matrix_approximation_rank=approximation_rank,
                                       start_powerSGD_iter=2, warm_start=False,
                                       use_error_feedback=False, random_seed=11)
        state.iter = 2
        model.register_comm_hook(state, powersgd.batched_powerSGD_hook)
        gen = torch.Generator().manual_seed(rank)
        model(torch.randn(5, 3, generator=gen, dtype=torch.float64)).sum().backward()
        got = torch.cat([p.grad.reshape(-1) for p in reversed(list(model.parameters()))])
        assert_replicas_equal(got)

        # The same step by hand: the average of every rank's gradient, in the bucket's order.
        average = torch.zeros(8, dtype=torch.float64)
        for r in range(size):
            x = torch.randn(5, 3, generator=torch.Generator().manual_seed(r), dtype=torch.float64)
            average += torch.cat([torch.ones(5, dtype=torch.float64) @ torch.ones(5, 2)
                                  .double(), (torch.ones(2, 5).double() @ x).reshape(-1)])
        average /= size
        side = math.ceil(math.sqrt(8))
        m = torch.cat([average, torch.zeros(side * side - 8, dtype=torch.float64)]).view(side, side)
        torch.manual_seed(numpy.random.RandomState(11).randint(1_000_000_000))
        q = _orthonormal(torch.randn(side, approximation_rank, dtype=torch.float64))
        p = _orthonormal(m @ q)
        want = (p @ p.T @ m).reshape(-1)[:8]
        assert torch.allclose(got, want, atol=1e-9, rtol=0), (got, want)
        if approximation_rank == side:
            assert torch.allclose(got, average, atol=1e-9, rtol=0)


def test_powersgd_inside_ddps_compress_wrapper(rank, size):
    """DDP's bf16_compress_wrapper around PowerSGD: around gradsync's hook it runs as it is (it
    needs only the bucket's buffer, set_buffer and the future), and around PyTorch's hook it runs
    as the wrapper around gradsync's: PowerSGD on bfloat16 buckets, the gradients written back in
    their own dtype, every replica the same, both registrations alike. (PyTorch's CPU matrix
    products do not take float16, so bfloat16 here.)"""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_wrapper
    results = []
    for inner in (powersgd.powerSGD_hook, torch_powersgd.powerSGD_hook):
        state = powersgd.PowerSGDState(start_powerSGD_iter=2)
        model = hvd.DistributedDataParallel(make_model().float())
        got = train(model, bf16_compress_wrapper(inner), state,
                    lambda step: [tuple(t.float() for t in batch(step, rank))])
        assert got.dtype == torch.float32 and torch.isfinite(got).all()
        assert_replicas_equal(got)
        assert state.iter == STEPS and state.compression_stats()[0] > 1
        results.append(got)
    assert torch.equal(results[0], results[1])


@pytest.mark.parametrize("compress", [False, True])
def test_powersgd_with_a_bucket_per_parameter(compress, rank, size):
    """Buckets of one matrix or one vector each. Where nothing is worth compressing PowerSGD is
    the plain average (error feedback then keeps only rounding); otherwise every replica ends
    the same."""
    state = powersgd.PowerSGDState(start_powerSGD_iter=2,
                                   min_compression_rate=2 if compress else 1e9)
    model = hvd.DistributedDataParallel(make_model(), bucket_cap_mb=1e-6)
    got = train(model, powersgd.powerSGD_hook, state, lambda step: [batch(step, rank)])
    assert len(model._buckets) == len(list(model.parameters()))
    assert_replicas_equal(got)
    assert state.iter == STEPS
    if not compress:
        plain = make_model()
        optimizer = torch.optim.SGD(plain.parameters(), lr=0.05, momentum=0.9)
        for step in range(STEPS):
            optimizer.zero_grad()
            x, y = zip(*[batch(step, r) for r in range(size)])
            loss_of(plain, torch.cat(x), torch.cat(y)).backward()
            optimizer.step()
        assert torch.allclose(got, flat(plain.parameters()), atol=1e-9, rtol=0)
