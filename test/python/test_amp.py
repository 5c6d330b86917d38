"""Mixed precision's loss scaling (``torch.amp.GradScaler``) with both gradsync.torch forms.

The scaler reads every gradient (to unscale it and look for infinities) before the optimizer
steps. The DDP wrapper's gradients are reduced when backward returns, so a DDP script's scaler
calls work unchanged. ``DistributedOptimizer`` reduces them in ``step()``: as under Horovod, the
script calls ``optimizer.synchronize()`` before ``scaler.unscale_`` and steps inside
``optimizer.skip_synchronize()``. Either way every rank unscales the same averaged gradients, so
an overflow on one rank skips the step, and lowers the scale, on every rank, and the replicas
stay identical.

On the host the model is float64 without autocast (the scaler's work is the same, and the result
is exact to summation order); on a GPU it is float32 under float16 autocast, as users train.
GradScaler takes the CPU from PyTorch 2.3 on; the host tests skip where it does not (Debian's 1.13,
which the build's tests use), the GPU ones where there is no GPU.
"""

import contextlib

import pytest
import torch

import gradsync.torch as hvd
import test_ddp
from test_ddp import flat

STEPS = 4
OVERFLOW_STEP = 2  # the step at which rank 0's loss overflows in the overflow tests
CLIP = 0.5


def _scaler_takes_the_cpu():
    try:
        torch.amp.GradScaler("cpu")
    except (AttributeError, TypeError, RuntimeError):
        return False
    return True


WHERE = [
    pytest.param("cpu", marks=pytest.mark.skipif(not _scaler_takes_the_cpu(),
                                                 reason="no GradScaler for the CPU")),
    pytest.param("cuda", marks=pytest.mark.skipif(
        not (hvd.cuda_built() and torch.cuda.is_available()
             and hasattr(getattr(torch, "amp", None), "GradScaler")),
        reason="needs a CUDA build of gradsync, a GPU and torch.amp.GradScaler")),
]


def device_of(where):
    if where == "cpu":
        return torch.device("cpu")
    index = hvd.gpu_device()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def tolerance(where):
    # float64 differs only in summation order; float16 products depend on the batch's shape.
    return (0.0, 1e-10) if where == "cpu" else (1e-2, 1e-3)


def autocast(where):
    return (torch.autocast("cuda", dtype=torch.float16) if where == "cuda" else
            contextlib.nullcontext())


def make_model(where):
    model = test_ddp.make_model()
    return model if where == "cpu" else model.float().to(device_of(where))


def make_scaler(where):
    # A short growth interval, so that the scale also grows within the test.
    return torch.amp.GradScaler(where, init_scale=2.0 ** 12, growth_interval=2)


def batch(step, rank, overflow, where):
    """test_ddp's batch, in float32 on the GPU, with an infinity in rank 0's at OVERFLOW_STEP."""
    x, y = test_ddp.batch(step, rank)
    if where == "cuda":
        device = device_of(where)
        x, y = x.float().to(device), y.float().to(device)
    if overflow and step == OVERFLOW_STEP and rank == 0:
        x[0, 0] = float("inf")
    return x, y


def loss_of(model, x, y, where):
    with autocast(where):
        return torch.nn.functional.mse_loss(model(x), y)


def reference(size, overflow, where):
    """One process on the full batch, with the same scaler and clipping: the parameters and the
    scale the ranks must end with."""
    model = make_model(where)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = make_scaler(where)
    for step in range(STEPS):
        optimizer.zero_grad()
        loss = sum(loss_of(model, *batch(step, r, overflow, where), where)
                   for r in range(size)) / size
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        scaler.step(optimizer)
        scaler.update()
    return flat(model.parameters()), scaler.get_scale()


def assert_as_one_process(params, scale, size, overflow, where, name):
    gathered = hvd.allgather(params.unsqueeze(0), name="amp.replicas." + name)
    for row in gathered:
        assert torch.equal(row, gathered[0])
    want_params, want_scale = reference(size, overflow, where)
    assert scale == want_scale
    if overflow:
        # The overflow took effect: the step skipped, the scale lowered.
        assert want_scale < reference(size, False, where)[1]
    rtol, atol = tolerance(where)
    assert torch.allclose(params, want_params, rtol=rtol, atol=atol)


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("overflow", [False, True])
def test_optimizer_with_a_grad_scaler(overflow, where, rank, size):
    """Horovod's recipe: synchronize, unscale and clip, then step without synchronizing again."""
    model = make_model(where)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                         named_parameters=model.named_parameters())
    scaler = make_scaler(where)
    for step in range(STEPS):
        optimizer.zero_grad()
        scaler.scale(loss_of(model, *batch(step, rank, overflow, where), where)).backward()
        optimizer.synchronize()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        with optimizer.skip_synchronize():
            scaler.step(optimizer)
        scaler.update()
    assert_as_one_process(flat(model.parameters()), scaler.get_scale(), size, overflow, where,
                          "optimizer.%s.%s" % (overflow, where))


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("views", [False, True])
@pytest.mark.parametrize("overflow", [False, True])
def test_ddp_wrapper_with_a_grad_scaler(overflow, views, where, rank, size):
    """A DDP script's scaler calls, unchanged."""
    inner = make_model(where)
    model = hvd.DistributedDataParallel(inner, gradient_as_bucket_view=views)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = make_scaler(where)
    for step in range(STEPS):
        optimizer.zero_grad()
        scaler.scale(loss_of(model, *batch(step, rank, overflow, where), where)).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        scaler.step(optimizer)
        scaler.update()
    assert_as_one_process(flat(inner.parameters()), scaler.get_scale(), size, overflow, where,
                          "ddp.%s.%s.%s" % (overflow, views, where))
