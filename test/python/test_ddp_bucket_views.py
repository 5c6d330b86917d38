"""DistributedDataParallel(gradient_as_bucket_view=True): gradients live in DDP's buckets, stay
there across steps, come back after zero_grad(set_to_none=True), and a model whose buckets cannot
be flat falls back with a warning. test_ddp.py runs the wrapper's other cases with views too."""

import pytest
import torch

import gradsync.torch as hvd
from test_ddp import TOLERANCE, batch, flat, loss_of, perturbed_model, reference


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


class MixedDtypes(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.first = torch.nn.Linear(8, 4).double()
        self.second = torch.nn.Linear(4, 4).float()

    def forward(self, x):
        return self.second(self.first(x).float()).double()


def test_a_bucket_of_mixed_dtypes_falls_back_with_a_warning(rank, size):
    with pytest.warns(UserWarning, match="gradient_as_bucket_view"):
        model = hvd.DistributedDataParallel(MixedDtypes(), gradient_as_bucket_view=True)
    x, y = batch(0, rank)
    loss_of(model, x, y).backward()
    for name, p in model.module.named_parameters():
        assert p.grad._base is None
        gathered = hvd.allgather(p.grad.unsqueeze(0), name="views.mixed." + name)
        assert torch.equal(gathered[0], gathered[-1])
