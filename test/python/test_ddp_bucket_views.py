"""DistributedDataParallel(gradient_as_bucket_view=True): gradients live in DDP's buckets, stay
there across steps, come back after zero_grad(set_to_none=True), and a model whose buckets cannot
be flat falls back with a warning. test_ddp.py runs the wrapper's other cases with views too."""

import warnings

import pytest
import torch

import gradsync.torch as hvd
from test_ddp import (TOLERANCE, batch, flat, loss_of, make_model, perturbed_model,
                      reference)


def bucket_of(grad):
    """The flat tensor a gradient is a view of."""
    assert grad._base is not None, "the gradient is not a view"
    return grad._base


@pytest.mark.parametrize("set_to_none", [False, True])
def test_gradients_are_views_into_the_buckets(set_to_none, rank, size):
    model = hvd.DistributedDataParallel(perturbed_model(rank), gradient_as_bucket_view=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    params = list(model.parameters())
    steps = 3
    previous = None
    for step in range(steps):
        optimizer.zero_grad(set_to_none=set_to_none)
        loss_of(model, *batch(step, rank)).backward()
        grads = [p.grad for p in params]
        # The model's 4 parameters fit one 1 MiB bucket, in backward's order.
        bases = {bucket_of(g).data_ptr() for g in grads}
        assert len(bases) == 1
        assert bucket_of(grads[-1]).data_ptr() == grads[-1].data_ptr()
        if previous is not None and not set_to_none:
            # Zeroed in place: backward accumulated into the views themselves.
            assert all(g is p for g, p in zip(grads, previous))
        previous = grads
        optimizer.step()
    want = reference(size, steps, lambda s: range(size), lambda s, n: size)
    assert torch.allclose(flat(params), want, atol=TOLERANCE, rtol=0)


def test_a_synchronized_forward_makes_none_gradients_their_zeroed_views(rank, size):
    """After zero_grad(set_to_none=True) a synchronized forward gives every gradient its view,
    zeroed, so that backward accumulates into the bucket and the hooks copy nothing; the
    gradients then are those objects, averaged. A forward under no_sync() leaves them None."""
    model = hvd.DistributedDataParallel(perturbed_model(rank), gradient_as_bucket_view=True)
    params = list(model.parameters())
    loss_of(model, *batch(0, rank)).backward()
    views = [p.grad for p in params]
    model.zero_grad(set_to_none=True)
    with model.no_sync():
        model(batch(1, rank)[0])
    assert all(p.grad is None for p in params)
    loss = loss_of(model, *batch(1, rank))
    assert all(p.grad is v for p, v in zip(params, views))
    assert all(torch.count_nonzero(p.grad) == 0 for p in params)
    loss.backward()
    assert all(p.grad is v for p, v in zip(params, views))
    want = make_model()
    sum(loss_of(want, *batch(1, r)) for r in range(size)).div(size).backward()
    assert torch.allclose(flat(p.grad for p in params), flat(p.grad for p in want.parameters()),
                          atol=TOLERANCE, rtol=0)


def test_a_bucket_with_one_none_gradient_zeroes_that_view_alone(rank, size):
    """The gradients a user left in place keep accumulating; the one set to None starts from
    zero."""
    model = hvd.DistributedDataParallel(make_model(), gradient_as_bucket_view=True)
    params = list(model.parameters())
    loss_of(model, *batch(0, rank)).backward()
    first = [p.grad.clone() for p in params]
    params[0].grad = None
    loss_of(model, *batch(1, rank)).backward()
    want = make_model()
    sum(loss_of(want, *batch(1, r)) for r in range(size)).div(size).backward()
    second = [p.grad for p in want.parameters()]
    assert torch.allclose(params[0].grad, second[0], atol=TOLERANCE, rtol=0)
    for p, old, new in zip(params[1:], first[1:], second[1:]):
        assert torch.allclose(p.grad, old + new, atol=TOLERANCE, rtol=0)


class MixedDtypes(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.first = torch.nn.Linear(8, 4).double()
        self.second = torch.nn.Linear(4, 4).float()

    def forward(self, x):
        return self.second(self.first(x).float()).double()


def test_a_model_of_mixed_dtypes_gets_a_bucket_for_each(rank, size):
    """As PyTorch DDP's, a bucket holds one dtype: the parameters of each dtype are views into
    buckets of their own, without the fallback's warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = hvd.DistributedDataParallel(MixedDtypes(), gradient_as_bucket_view=True)
    assert len(model._buckets) == 2
    x, y = batch(0, rank)
    loss_of(model, x, y).backward()
    for name, p in model.module.named_parameters():
        assert p.grad._base is not None
        gathered = hvd.allgather(p.grad.unsqueeze(0), name="views.mixed." + name)
        assert torch.equal(gathered[0], gathered[-1])


def test_compression_falls_back_with_a_warning(rank, size):
    with pytest.warns(UserWarning, match="gradient_as_bucket_view"):
        model = hvd.DistributedDataParallel(perturbed_model(rank), gradient_as_bucket_view=True,
                                            compression=hvd.Compression.fp16)
    loss_of(model, *batch(0, rank)).backward()
    assert all(p.grad._base is None for p in model.parameters())


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph")
def test_a_gradient_with_a_graph_of_its_own(rank, size):
    """Under create_graph=True the gradient comes with a graph; its value still goes into the
    bucket and is averaged."""
    model = hvd.DistributedDataParallel(perturbed_model(rank), gradient_as_bucket_view=True)
    loss_of(model, *batch(0, rank)).backward(create_graph=True)
    grads = flat(p.grad for p in model.parameters())
    want = make_model()
    sum(loss_of(want, *batch(0, r)) for r in range(size)).div(size).backward()
    assert torch.allclose(grads, flat(p.grad for p in want.parameters()), atol=TOLERANCE, rtol=0)


def test_consecutive_buckets_are_adjacent_slices_of_one_allocation(rank, size):
    """Each bucket's flat tensor follows the one before in memory and is a whole number of 16
    bytes long, its tail zeros: the runtime, fusing consecutive buckets into one of its own on a
    GPU, then reduces them where they lie. Parameters of odd sizes in float32 leave tails to pad,
    one bucket each; the gradients come out as averaged as without views."""
    def odd_model():
        torch.manual_seed(99)
        return torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))

    model = hvd.DistributedDataParallel(odd_model(), gradient_as_bucket_view=True,
                                        bucket_cap_mb=1e-6)
    flats = model._views._flats
    assert len(flats) == 4
    for before, after in zip(flats, flats[1:]):
        assert before.numel() * before.element_size() % 16 == 0
        assert after.data_ptr() == before.data_ptr() + before.numel() * before.element_size()
    gen = torch.Generator().manual_seed(rank)
    x, y = torch.randn(4, 3, generator=gen), torch.randn(4, 3, generator=gen)
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), y).backward()
    want = odd_model()
    total = 0
    for r in range(size):
        gen = torch.Generator().manual_seed(r)
        xr, yr = torch.randn(4, 3, generator=gen), torch.randn(4, 3, generator=gen)
        total = total + torch.nn.functional.mse_loss(want(xr), yr)
    (total / size).backward()
    assert torch.allclose(flat(p.grad for p in model.parameters()),
                          flat(p.grad for p in want.parameters()), atol=1e-6, rtol=0)
    for bucket_flat in flats:
        used = sum(p.numel() for p in model.parameters() if p.grad._base is not None
                   and bucket_flat.data_ptr() <= p.grad.data_ptr()
                   < bucket_flat.data_ptr() + bucket_flat.numel() * 4)
        assert torch.count_nonzero(bucket_flat[used:]) == 0, "a tail holds something"
