"""SyncBatchNorm: each rank holds a slice of one batch; results match torch's BatchNorm on it all.

Slices differ in size across ranks, and one layout leaves a rank with no rows. Tolerances: float64
agrees to 1e-9 (only summation order differs); float32 to 1e-4 relative and 1e-5 absolute, since
the reference accumulates its statistics in float32 and SyncBatchNorm in float64.
"""

import pytest
import torch

import gradsync.torch as hvd
import gradsync.torch.sync_batch_norm as sync_batch_norm_module

CHANNELS = 3
SPATIAL = {2: (), 3: (5,), 4: (4, 3)}
TOLERANCES = {torch.float64: dict(rtol=1e-9, atol=1e-9),
              torch.float32: dict(rtol=1e-4, atol=1e-5)}
REFERENCE_CLASSES = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d}


def row_counts(layout, size):
    """How many rows of the full batch each rank holds."""
    if layout == "uneven":
        return [2 * r + 3 for r in range(size)]
    if size == 1:
        pytest.skip("a rank without rows needs another rank that has some")
    return [0 if r == 1 else 3 for r in range(size)]


def my_rows(counts, rank):
    start = sum(counts[:rank])
    return slice(start, start + counts[rank])


def full_batch(seed, rows, dims, dtype):
    """Inputs with a mean and scale far from 0 and 1, and the upstream gradient to feed back."""
    gen = torch.Generator().manual_seed(seed)
    shape = (rows, CHANNELS) + SPATIAL[dims]
    x = 3.0 + 2.0 * torch.randn(shape, generator=gen, dtype=torch.float64)
    dy = torch.randn(shape, generator=gen, dtype=torch.float64)
    return x.to(dtype), dy.to(dtype)


def make_pair(dims, dtype, **kwargs):
    """A SyncBatchNorm and the torch BatchNorm it must match, with the same affine parameters."""
    sync_bn = hvd.SyncBatchNorm(CHANNELS, **kwargs).to(dtype)
    reference = REFERENCE_CLASSES[dims](CHANNELS, **kwargs).to(dtype)
    if sync_bn.affine:
        with torch.no_grad():
            for module in (sync_bn, reference):
                module.weight.copy_(torch.linspace(0.5, 1.5, CHANNELS))
                module.bias.copy_(torch.linspace(-0.2, 0.3, CHANNELS))
    return sync_bn, reference


def run_step(module, x, dy):
    """Forward and backward of sum(y * dy); returns y and the input's gradient."""
    x = x.clone().requires_grad_()
    y = module(x)
    (y * dy).sum().backward()
    return y.detach(), x.grad


def assert_close(actual, expected, dtype):
    torch.testing.assert_close(actual, expected, **TOLERANCES[dtype])


def assert_summed_grads_close(sync_bn, reference, dtype):
    # Each rank's weight and bias gradients cover its own rows; over all ranks they add up to the
    # full batch's.
    for name in ("weight", "bias"):
        local = getattr(sync_bn, name).grad
        total = hvd.allreduce(local, op=hvd.Sum, name="sync_bn_test." + name)
        assert_close(total, getattr(reference, name).grad, dtype)


@pytest.mark.parametrize("layout", ["uneven", "empty_rank"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("dims", [2, 3, 4])
def test_training_step_matches_full_batch(dims, dtype, layout, rank, size):
    counts = row_counts(layout, size)
    rows = my_rows(counts, rank)
    x, dy = full_batch(7, sum(counts), dims, dtype)
    sync_bn, reference = make_pair(dims, dtype)

    y, grad_x = run_step(sync_bn, x[rows], dy[rows])
    y_ref, grad_x_ref = run_step(reference, x, dy)

    assert y.shape == x[rows].shape
    assert_close(y, y_ref[rows], dtype)
    assert_close(grad_x, grad_x_ref[rows], dtype)
    assert_summed_grads_close(sync_bn, reference, dtype)
    assert_close(sync_bn.running_mean, reference.running_mean, dtype)
    assert_close(sync_bn.running_var, reference.running_var, dtype)


@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("dims", [2, 4])
def test_running_stats_and_eval_match_after_steps(dims, dtype, momentum, rank, size,
                                                  monkeypatch):
    counts = row_counts("uneven", size)
    rows = my_rows(counts, rank)
    sync_bn, reference = make_pair(dims, dtype, momentum=momentum)
    for step in range(4):
        x, dy = full_batch(100 + step, sum(counts), dims, dtype)
        run_step(sync_bn, x[rows], dy[rows])
        run_step(reference, x, dy)
    assert_close(sync_bn.running_mean, reference.running_mean, dtype)
    assert_close(sync_bn.running_var, reference.running_var, dtype)
    assert int(sync_bn.num_batches_tracked) == int(reference.num_batches_tracked) == 4

    # Eval mode normalizes with the running statistics alone: nothing may be communicated.
    def no_collectives(*args, **kwargs):
        raise AssertionError("SyncBatchNorm communicated in eval mode")

    monkeypatch.setattr(sync_batch_norm_module, "allreduce_", no_collectives)
    sync_bn.eval()
    reference.eval()
    x, dy = full_batch(200, sum(counts), dims, dtype)
    y, grad_x = run_step(sync_bn, x[rows], dy[rows])
    y_ref, grad_x_ref = run_step(reference, x, dy)
    assert_close(y, y_ref[rows], dtype)
    assert_close(grad_x, grad_x_ref[rows], dtype)


def test_without_affine_or_running_stats(rank, size):
    counts = row_counts("uneven", size)
    rows = my_rows(counts, rank)
    x, dy = full_batch(11, sum(counts), 4, torch.float64)
    sync_bn, reference = make_pair(4, torch.float64, affine=False, track_running_stats=False)
    y, grad_x = run_step(sync_bn, x[rows], dy[rows])
    y_ref, grad_x_ref = run_step(reference, x, dy)
    assert sync_bn.weight is None and sync_bn.running_mean is None
    assert_close(y, y_ref[rows], torch.float64)
    assert_close(grad_x, grad_x_ref[rows], torch.float64)


def test_one_allreduce_forward_and_one_backward(rank, size, monkeypatch):
    calls = []
    real_allreduce_ = sync_batch_norm_module.allreduce_

    def counting_allreduce_(tensor, *args, **kwargs):
        calls.append(kwargs["name"])
        return real_allreduce_(tensor, *args, **kwargs)

    monkeypatch.setattr(sync_batch_norm_module, "allreduce_", counting_allreduce_)
    counts = row_counts("uneven", size)
    x, dy = full_batch(5, sum(counts), 4, torch.float32)
    sync_bn = hvd.SyncBatchNorm(CHANNELS)
    y = sync_bn(x[my_rows(counts, rank)].requires_grad_())
    assert len(calls) == 1
    (y * dy[my_rows(counts, rank)]).sum().backward()
    assert len(calls) == 2 and calls[0] != calls[1]

    # Without an input gradient only the local weight and bias gradients are needed.
    y = sync_bn(x[my_rows(counts, rank)])
    y.sum().backward()
    assert len(calls) == 3
    assert calls[2] == calls[0], "a layer's collective name must recur every step"


def test_single_value_per_channel_raises_on_every_rank(rank):
    # One row over all ranks, held by rank 0: every rank learns the global count and raises.
    rows = 1 if rank == 0 else 0
    sync_bn = hvd.SyncBatchNorm(CHANNELS)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        sync_bn(torch.ones(rows, CHANNELS))


def test_bad_input_raises_without_communicating():
    sync_bn = hvd.SyncBatchNorm(CHANNELS)
    with pytest.raises(ValueError, match="at least 2D"):
        sync_bn(torch.ones(CHANNELS))
    with pytest.raises(ValueError, match="channels"):
        sync_bn(torch.ones(4, CHANNELS + 1))


def make_mlp():
    torch.manual_seed(99)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh(),
                               torch.nn.Linear(8, 2)).double()


@pytest.mark.parametrize("layout", ["uneven", "empty_rank"])
def test_converted_model_trains_like_full_batch(layout, rank, size):
    counts = row_counts(layout, size)
    rows = my_rows(counts, rank)
    total = sum(counts)
    reference = make_mlp()
    reference_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)

    model = hvd.SyncBatchNorm.convert_sync_batchnorm(make_mlp())
    assert isinstance(model[1], hvd.SyncBatchNorm)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1,
                                                         momentum=0.9),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    for step in range(4):
        gen = torch.Generator().manual_seed(300 + step)
        x = torch.randn(total, 6, generator=gen, dtype=torch.float64)
        target = torch.randn(total, 2, generator=gen, dtype=torch.float64)
        reference_opt.zero_grad()
        torch.nn.functional.mse_loss(reference(x), target).backward()
        reference_opt.step()
        # Averaging over ranks divides by size: scale each rank's share of the full-batch mean.
        optimizer.zero_grad()
        local = (model(x[rows]) - target[rows]).pow(2).sum() * size / target.numel()
        local.backward()
        optimizer.step()

    for p, p_ref in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.detach(), p_ref.detach(), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(model[1].running_var, reference[1].running_var, rtol=1e-9,
                               atol=1e-9)
