"""Edges of gradsync.torch's collectives: which reductions autograd records (and with which
gradient), groups mixing bool and other dtypes, and groups or tensors on more than one device or
on a device the runtime cannot read.

Every refusal here is raised on every rank before anything is enqueued, so no rank waits for a
collective another rank never started. A "meta" tensor stands for any device that is neither the
host nor CUDA: it is the one such device every PyTorch build has.
"""

import math

import pytest
import torch

import gradsync.torch as hvd

needs_cuda = pytest.mark.skipif(not (hvd.cuda_built() and torch.cuda.is_available()),
                                reason="needs a CUDA build of gradsync and a GPU")

# op -> what it makes of every rank's value
REDUCTIONS = {hvd.Min: min, hvd.Max: max, hvd.Product: math.prod}
MIN_MAX_PRODUCT = pytest.mark.parametrize("op", [hvd.Min, hvd.Max, hvd.Product],
                                          ids=["Min", "Max", "Product"])


def ranks_values(size):
    return [float(r + 1) for r in range(size)]


@MIN_MAX_PRODUCT
def test_a_parameter_reduces_with_any_op_under_no_grad(op, rank, size):
    # A Parameter still requires a gradient under torch.no_grad(), where nothing is recorded.
    parameter = torch.nn.Parameter(torch.full((3,), float(rank + 1)))
    want = torch.full((3,), REDUCTIONS[op](ranks_values(size)))
    with torch.no_grad():
        assert torch.equal(hvd.allreduce(parameter, op=op), want)
        reduced = hvd.grouped_allreduce([parameter, parameter * 1], op=op)
    assert all(torch.equal(r, want) for r in reduced)
    with torch.inference_mode():
        assert torch.equal(hvd.allreduce(parameter, op=op), want)


def test_the_largest_loss_over_the_ranks_is_a_metric_under_no_grad(rank, size):
    weight = torch.nn.Parameter(torch.tensor([2.0]))
    loss = (weight * float(rank + 1)).sum()
    with torch.no_grad():
        largest = hvd.allreduce(loss, op=hvd.Max)
    assert largest.item() == 2.0 * size and not largest.requires_grad


def test_adasum_of_a_parameter_under_no_grad(rank, size):
    if size & (size - 1):
        pytest.skip("Adasum needs a power-of-two number of ranks")
    # Equal vectors on every rank: Adasum leaves them as they are.
    parameter = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))
    with torch.no_grad():
        assert torch.allclose(hvd.allreduce(parameter, op=hvd.Adasum), parameter)
        reduced = hvd.grouped_allreduce([parameter], op=hvd.Adasum)
    assert torch.allclose(reduced[0], parameter)


def test_adasum_is_refused_where_autograd_would_record_it():
    tensor = torch.ones(3, requires_grad=True)
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.allreduce(tensor, op=hvd.Adasum)
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.grouped_allreduce([torch.ones(2), tensor], op=hvd.Adasum)
    with torch.no_grad(), torch.enable_grad():  # the innermost mode is the one that counts
        with pytest.raises(NotImplementedError, match="torch.no_grad"):
            hvd.allreduce(tensor, op=hvd.Adasum)


@MIN_MAX_PRODUCT
def test_min_max_product_gradient_is_the_output_gradient_reduced_alike(op, rank, size):
    # Horovod's gradient: the output's gradient reduced with the forward's op and scale factors.
    prescale, postscale = 2.0, 3.0
    scaled = [prescale * v for v in ranks_values(size)]
    tensor = torch.full((4,), float(rank + 1), requires_grad=True)
    reduced = hvd.allreduce(tensor, op=op, prescale_factor=prescale, postscale_factor=postscale)
    want = torch.full((4,), REDUCTIONS[op](scaled) * postscale)
    assert torch.equal(reduced.detach(), want)
    reduced.backward(torch.full((4,), float(rank + 1)))
    assert torch.equal(tensor.grad, want)


@MIN_MAX_PRODUCT
def test_grouped_min_max_product_gradient_is_the_output_gradient_reduced_alike(op, rank, size):
    tensors = [torch.full((n,), float(rank + 1), requires_grad=True) for n in (1, 5)]
    reduced = hvd.grouped_allreduce(tensors, op=op)
    sum(r.sum() for r in reduced).backward()
    for t, r in zip(tensors, reduced):
        assert torch.equal(r.detach(), torch.full(t.shape, REDUCTIONS[op](ranks_values(size))))
        assert torch.equal(t.grad, torch.full(t.shape, REDUCTIONS[op]([1.0] * size)))


def bool_and_float(rank, bool_first):
    """A bool and a float32 member: the bool true on even ranks, the float rank + 1."""
    members = [torch.tensor([rank % 2 == 0]), torch.tensor([float(rank + 1)])]
    return members if bool_first else members[::-1]


GROUPED_REDUCTIONS = pytest.mark.parametrize(
    "collective", [hvd.grouped_allreduce, hvd.grouped_allreduce_, hvd.grouped_allreduce_async,
                   hvd.grouped_reducescatter, hvd.grouped_reducescatter_async],
    ids=lambda collective: collective.__name__)


@GROUPED_REDUCTIONS
@pytest.mark.parametrize("bool_first", [True, False], ids=["bool_first", "float_first"])
@pytest.mark.parametrize("op", [hvd.Sum, hvd.Product], ids=["Sum", "Product"])
def test_a_group_mixing_bool_and_float_refuses_sum_and_product(op, bool_first, collective, rank):
    # Sum and Product are a logical or and a logical and on bool members, Max and Min: one group
    # reduces all its members with one op, so either the float member or the bool one is wrong.
    with pytest.raises(ValueError, match="bool tensors in a group of their own"):
        collective(bool_and_float(rank, bool_first), op=op)


@pytest.mark.parametrize("bool_first", [True, False], ids=["bool_first", "float_first"])
@pytest.mark.parametrize("op", [hvd.Max, hvd.Min], ids=["Max", "Min"])
def test_a_group_mixing_bool_and_float_reduces_with_max_and_min(op, bool_first, rank, size):
    flags = [r % 2 == 0 for r in range(size)]
    want = {torch.bool: any(flags) if op == hvd.Max else all(flags),
            torch.float32: float(size) if op == hvd.Max else 1.0}
    for result in hvd.grouped_allreduce(bool_and_float(rank, bool_first), op=op):
        assert result.item() == want[result.dtype]


@pytest.mark.parametrize("op", [hvd.Sum, hvd.Product], ids=["Sum", "Product"])
def test_a_group_of_bool_tensors_keeps_sum_and_product_as_or_and_and(op, rank, size):
    flags = [r % 2 == 0 for r in range(size)]
    want = any(flags) if op == hvd.Sum else all(flags)
    members = [torch.tensor([rank % 2 == 0]), torch.full((size,), rank % 2 == 0)]
    assert [r.all().item() for r in hvd.grouped_allreduce(members, op=op)] == [want, want]
    shares = hvd.grouped_reducescatter([torch.full((size, 2), rank % 2 == 0)], op=op)
    assert shares[0].dtype == torch.bool and shares[0].shape == (1, 2)
    assert bool(shares[0].all()) == want


@pytest.mark.parametrize("bool_first", [True, False], ids=["bool_first", "float_first"])
def test_a_reducescatter_group_mixing_bool_and_float_reduces_with_max(bool_first, rank, size):
    members = [torch.full((size, 2), rank % 2 == 0), torch.full((size, 3), float(rank + 1))]
    if not bool_first:
        members.reverse()
    for share in hvd.grouped_reducescatter(members, op=hvd.Max):
        assert share.shape[0] == 1
        assert share.all() if share.dtype == torch.bool else torch.equal(
            share, torch.full(share.shape, float(size)))


@pytest.mark.parametrize(
    "collective", [hvd.allreduce, hvd.allreduce_, hvd.allreduce_async, hvd.allreduce_async_],
    ids=lambda collective: collective.__name__)
@pytest.mark.parametrize("op", [None, hvd.Sum, hvd.Max], ids=["default", "Sum", "Max"])
def test_a_tensor_on_another_device_is_refused_by_every_allreduce(op, collective):
    # Each form's short path takes a host tensor (or a CUDA one) only.
    with pytest.raises(ValueError, match="tensors on meta are not supported"):
        collective(torch.ones(3, device="meta"), op=op)


GROUPED_COLLECTIVES = pytest.mark.parametrize(
    "collective", [hvd.grouped_allreduce, hvd.grouped_allreduce_, hvd.grouped_allreduce_async,
                   hvd.grouped_allgather, hvd.grouped_allgather_async, hvd.grouped_reducescatter,
                   hvd.grouped_reducescatter_async],
    ids=lambda collective: collective.__name__)


@GROUPED_COLLECTIVES
@pytest.mark.parametrize("host_first", [True, False], ids=["host_first", "host_last"])
def test_a_group_on_the_host_and_another_device_is_refused(host_first, collective):
    members = [torch.ones(2), torch.ones(2, device="meta")]
    if not host_first:
        members.reverse()
    with pytest.raises(ValueError, match="one device"):
        collective(members)


@needs_cuda
@GROUPED_COLLECTIVES
@pytest.mark.parametrize("host_first", [True, False], ids=["host_first", "host_last"])
def test_a_group_on_the_host_and_a_gpu_is_refused(host_first, collective):
    members = [torch.ones(2), torch.ones(2, device=torch.device("cuda", hvd.gpu_device()))]
    if not host_first:
        members.reverse()
    with pytest.raises(ValueError, match="one device"):
        collective(members)
