"""torch.compile (PyTorch 2): a compiled model trains through DistributedOptimizer and the DDP
wrapper as it does eagerly, with the wrapper inside the compiled module or around it.

The gradients' hooks fire from the compiled backward as from an eager one; what could go wrong is
a hook not firing (the step would wait for a gradient that never comes, or reduce zeros), or the
wrapper's own forward (its bucket views' fill, the hook on its output) misbehaving under
TorchDynamo. Skipped where torch.compile does not exist (Debian's PyTorch 1.13, which the build's
tests use); scripts/torch2-check.sh and the GPU check run them under PyTorch 2.
"""

import os
import shutil
import sysconfig

import pytest
import torch

import gradsync.torch as hvd
# float64 training; compiled kernels may sum in another order, within the same tolerance.
from test_ddp import TOLERANCE, assert_replicas_equal, batch, flat, loss_of, make_model, reference

STEPS = 3

pytestmark = pytest.mark.skipif(not hasattr(torch, "compile"), reason="no torch.compile")


def _builds_cpu_kernels():
    """Whether inductor can build CPU kernels here: a C++ compiler and Python's headers."""
    compiler = shutil.which("c++") or shutil.which("g++")
    headers = os.path.join(sysconfig.get_paths()["include"], "Python.h")
    return compiler is not None and os.path.exists(headers)


# aot_eager traces forward and backward as inductor does, without generating code.
BACKENDS = ["aot_eager",
            pytest.param("inductor", marks=pytest.mark.skipif(
                not _builds_cpu_kernels(), reason="inductor needs a C++ compiler and Python.h"))]


def train(model, optimizer, rank):
    for step in range(STEPS):
        optimizer.zero_grad()
        loss_of(model, *batch(step, rank)).backward()
        optimizer.step()


def assert_trained_as_eagerly(inner, size):
    params = flat(inner.parameters())
    assert_replicas_equal(params)
    want = reference(size, STEPS, lambda s: range(size), lambda s, n: size)
    assert torch.allclose(params, want, atol=TOLERANCE, rtol=0)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    # Each test compiles anew: a cache hit from an earlier test would not trace the wrapper again.
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("backend", BACKENDS)
def test_optimizer_with_a_compiled_model(backend, rank, size):
    inner = make_model()
    model = torch.compile(inner, backend=backend)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(inner.parameters(), lr=0.1, momentum=0.9),
        named_parameters=inner.named_parameters())
    hvd.broadcast_parameters(inner.state_dict(), root_rank=0)
    train(model, optimizer, rank)
    assert_trained_as_eagerly(inner, size)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("views", [False, True])
@pytest.mark.parametrize("compiled", ["inside", "around"])
def test_ddp_wrapper_with_compile(compiled, views, backend, rank, size):
    """``inside``: the wrapper holds a compiled module; ``around``: the wrapper is compiled, as
    PyTorch's documentation has users compile its DDP."""
    inner = make_model()
    wrapped = hvd.DistributedDataParallel(
        torch.compile(inner, backend=backend) if compiled == "inside" else inner,
        gradient_as_bucket_view=views)
    model = torch.compile(wrapped, backend=backend) if compiled == "around" else wrapped
    optimizer = torch.optim.SGD(inner.parameters(), lr=0.1, momentum=0.9)
    train(model, optimizer, rank)
    if views:
        assert all(p.grad._base is not None for p in inner.parameters())
    assert_trained_as_eagerly(inner, size)


@pytest.mark.parametrize("views", [False, True])
def test_ddp_wrapper_compiled_around_with_no_sync(views, rank):
    """``no_sync()`` flips what the wrapper's forward does; compiled around it, TorchDynamo must
    follow the flip: each step's accumulated gradients end as they do eagerly."""

    def accumulating_steps(compiled):
        torch._dynamo.reset()
        inner = make_model()
        wrapped = hvd.DistributedDataParallel(inner, gradient_as_bucket_view=views)
        model = torch.compile(wrapped, backend="aot_eager") if compiled else wrapped
        optimizer = torch.optim.SGD(inner.parameters(), lr=0.1, momentum=0.9)
        for step in range(STEPS):
            optimizer.zero_grad()
            x, y = batch(step, rank)
            with wrapped.no_sync():
                loss_of(model, x[:2], y[:2]).backward()
            loss_of(model, x[2:], y[2:]).backward()
            optimizer.step()
        return flat(inner.parameters())

    assert torch.allclose(accumulating_steps(True), accumulating_steps(False), atol=TOLERANCE,
                          rtol=0)
