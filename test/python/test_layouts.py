"""Tensors that are not contiguous (a channels_last model, a transposed view, a strided buffer)
go through in-place collectives, the whole-model helpers, DistributedOptimizer and
DistributedDataParallel, as PyTorch DDP takes them; a plain list of tensors is accepted by
broadcast_parameters, as Horovod accepts it."""

import pytest
import torch

import gradsync.torch as hvd

LEARNING_RATE = 0.5


def channels_last_conv(rank=0):
    """The same Conv2d on every rank, in channels_last, moved away from rank 0's weights on the
    other ranks (whose weights a broadcast must replace)."""
    torch.manual_seed(1234)
    model = torch.nn.Conv2d(3, 8, 3).to(memory_format=torch.channels_last)
    assert not model.weight.is_contiguous()  # else nothing here tests a strided tensor
    with torch.no_grad():
        for p in model.parameters():
            p.add_(float(rank))
    return model


def images_of(rank):
    gen = torch.Generator().manual_seed(100 + rank)
    return torch.randn(2, 3, 6, 6, generator=gen).to(memory_format=torch.channels_last)


def loss_of(model, images):
    return model(images).square().mean()


def after_one_averaged_step(size):
    """Rank 0's parameters after one SGD step on every rank's gradient averaged: one process."""
    model = channels_last_conv()
    params = list(model.parameters())
    per_rank = [torch.autograd.grad(loss_of(model, images_of(r)), params) for r in range(size)]
    return [p.detach() - LEARNING_RATE * sum(grads) / size
            for p, grads in zip(params, zip(*per_rank))]


def assert_replicas_equal(tensors):
    flat = torch.cat([t.detach().reshape(-1) for t in tensors])
    gathered = hvd.allgather(flat.unsqueeze(0), name="layouts.replicas")
    for row in gathered:
        assert torch.equal(row, gathered[0])


def assert_rank_0s(model):
    """``model`` holds rank 0's weights, still in channels_last."""
    for p, want in zip(model.parameters(), channels_last_conv().parameters()):
        assert torch.equal(p, want)
    assert model.weight.is_contiguous(memory_format=torch.channels_last)


def test_in_place_collectives_write_into_a_strided_tensor(rank, size):
    def strided():
        # Each rank's 0..11 plus its rank, seen transposed: its storage is not in row order.
        return (torch.arange(12, dtype=torch.float32) + rank).reshape(3, 4).t()

    want_sum = sum((torch.arange(12, dtype=torch.float32) + r).reshape(3, 4).t()
                   for r in range(size))
    tensor = strided()
    storage = tensor.data_ptr()
    assert hvd.allreduce_(tensor, op=hvd.Sum, name="layouts.allreduce_") is tensor
    assert torch.equal(tensor, want_sum) and tensor.data_ptr() == storage

    tensor = strided()
    hvd.synchronize(hvd.allreduce_async_(tensor, op=hvd.Max, name="layouts.allreduce_async_"))
    assert torch.equal(tensor, strided() - rank + size - 1)

    group = [strided(), strided().to(torch.int16)]
    hvd.grouped_allreduce_(group, op=hvd.Sum, name="layouts.grouped")
    assert torch.equal(group[0], want_sum)
    assert torch.equal(group[1], want_sum.to(torch.int16))

    flags = strided() > 5 + rank
    hvd.allreduce_(flags, op=hvd.Sum, name="layouts.bool")
    assert torch.equal(flags, strided() - rank > 5)  # a bool sum is a logical or

    tensor = strided()
    storage = tensor.data_ptr()
    assert hvd.broadcast_(tensor, root_rank=0, name="layouts.broadcast_") is tensor
    assert torch.equal(tensor, strided() - rank) and tensor.data_ptr() == storage


def test_in_place_collectives_refuse_a_tensor_whose_elements_share_memory():
    expanded = torch.zeros(3).expand(2, 3)  # no result could be written back into it
    for in_place in (lambda: hvd.allreduce_(expanded, name="layouts.expanded"),
                     lambda: hvd.grouped_allreduce_([expanded], name="layouts.expanded.group"),
                     lambda: hvd.broadcast_(expanded, 0, name="layouts.expanded.broadcast")):
        with pytest.raises(ValueError, match="share memory"):
            in_place()


def test_broadcast_parameters_of_a_channels_last_state_dict(rank):
    model = channels_last_conv(rank)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    assert_rank_0s(model)


def test_broadcast_parameters_of_a_plain_list_of_tensors(rank):
    model = channels_last_conv(rank)
    hvd.broadcast_parameters(list(model.parameters()), root_rank=0)
    assert_rank_0s(model)


def test_broadcast_optimizer_state_of_a_channels_last_model(rank):
    model = channels_last_conv()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for p in model.parameters():
        p.grad = torch.full_like(p, rank + 1.0)  # in the parameter's layout, as backward makes it
    optimizer.step()  # the momentum is the first gradient: rank + 1
    assert not optimizer.state[model.weight]["momentum_buffer"].is_contiguous()
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    for p in model.parameters():
        assert torch.equal(optimizer.state[p]["momentum_buffer"], torch.ones_like(p))


@pytest.mark.parametrize("compression,groups", [(hvd.Compression.fp16, None),
                                                (hvd.Compression.none, 1)])
def test_distributed_optimizer_steps_a_channels_last_model(compression, groups, rank, size):
    model = channels_last_conv()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LEARNING_RATE),
                                         named_parameters=model.named_parameters(),
                                         compression=compression, groups=groups)
    loss_of(model, images_of(rank)).backward()
    optimizer.step()
    # fp16 carries about three decimal digits of each gradient.
    tolerance = 1e-3 if compression is hvd.Compression.fp16 else 1e-6
    for p, want in zip(model.parameters(), after_one_averaged_step(size)):
        assert torch.allclose(p, want, rtol=0, atol=tolerance)
    assert_replicas_equal(model.parameters())


def test_ddp_wraps_and_trains_a_channels_last_model(rank, size):
    model = hvd.DistributedDataParallel(channels_last_conv(rank))
    assert_rank_0s(model.module)
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    loss_of(model, images_of(rank)).backward()
    optimizer.step()
    for p, want in zip(model.parameters(), after_one_averaged_step(size)):
        assert torch.allclose(p, want, rtol=0, atol=1e-6)
    assert_replicas_equal(model.parameters())


class _StridedBuffer(torch.nn.Module):
    """A module whose only float32 buffer is a transposed view, so that DDP broadcasts it alone
    in its dtype's group."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 2)
        self.register_buffer("scale", torch.zeros(3, 4).t())

    def forward(self, x):
        return self.linear(x @ self.scale)


@pytest.mark.parametrize("joined", [False, True])
def test_ddp_hands_rank_0s_strided_buffer_to_every_rank(joined, rank):
    model = hvd.DistributedDataParallel(_StridedBuffer())
    buffer = model.module.scale
    def values_of(r):
        return torch.randn(3, 4, generator=torch.Generator().manual_seed(r)).t()

    # Each rank's own values after construction, as a forward that updates a buffer leaves them.
    with torch.no_grad():
        buffer.copy_(values_of(rank))
    with model.join(enable=joined):
        model(torch.ones(5, 4))
    assert model.module.scale is buffer and not buffer.is_contiguous()
    assert torch.equal(buffer, values_of(0))
