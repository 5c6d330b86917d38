"""Where gradsync.torch once differed from horovod.torch 0.28.1: alltoall_async's result, object
pickling, is_homogeneous() and synchronizing a handle twice."""

import importlib.util
import pickle
import threading

import pytest
import torch

import gradsync.torch as hvd
from gradsync.torch import basics, functions

HAVE_CLOUDPICKLE = importlib.util.find_spec("cloudpickle") is not None


def test_alltoall_async_gives_received_splits_also_without_splits(rank, size):
    # Each rank sends two rows to every rank: rows of value 100 * rank + destination.
    sent = torch.tensor([100.0 * rank + r for r in range(size) for _ in range(2)])
    result = hvd.synchronize(hvd.alltoall_async(sent, name="parity.a2a.even"))
    assert isinstance(result, tuple) and len(result) == 2
    output, received = result
    assert received.dtype == torch.int32 and received.tolist() == [2] * size
    assert output.tolist() == [100.0 * r + rank for r in range(size) for _ in range(2)]
    # With splits the handle gives the same pair; alltoall itself drops the splits without any.
    output, received = hvd.synchronize(hvd.alltoall_async(sent, splits=[2] * size,
                                                          name="parity.a2a.splits"))
    assert received.tolist() == [2] * size
    plain = hvd.alltoall(sent, name="parity.a2a.plain")
    assert torch.is_tensor(plain) and torch.equal(plain, output)


def test_broadcast_object_gives_the_root_its_own_object(rank):
    sent = {"rank": rank, "rows": [1, 2]}
    got = hvd.broadcast_object(sent, root_rank=0, name="parity.bo.same")
    if rank == 0:
        assert got is sent
    else:
        assert got == {"rank": 0, "rows": [1, 2]}


@pytest.mark.skipif(not HAVE_CLOUDPICKLE, reason="lambdas and closures pickle with cloudpickle")
def test_lambdas_and_closures_travel_with_cloudpickle(rank, size):
    offset = 10 * rank

    def shifted(x):
        return x + offset

    sent = (lambda x: x * 2) if rank == 0 else None
    got = hvd.broadcast_object(sent, root_rank=0, name="parity.bo.lambda")
    assert got(3) == 6
    functions_of_ranks = hvd.allgather_object(shifted, name="parity.ago.closure")
    assert [f(1) for f in functions_of_ranks] == [10 * r + 1 for r in range(size)]


def test_objects_pickle_with_cloudpickle_when_installed():
    assert functions._pickler.__name__ == ("cloudpickle" if HAVE_CLOUDPICKLE else "pickle")


def test_an_unpicklable_root_object_raises_on_every_rank(rank):
    # A lock pickles with neither pickle nor cloudpickle.
    sent = threading.Lock() if rank == 0 else None
    expected = TypeError if rank == 0 else pickle.PicklingError
    with pytest.raises(expected):
        hvd.broadcast_object(sent, root_rank=0, name="parity.bo.unpicklable")
    # Nothing was left half sent: the same name broadcasts again.
    assert hvd.broadcast_object(rank, root_rank=0, name="parity.bo.unpicklable") == 0


def test_an_unpicklable_object_of_one_rank_fails_every_allgather(rank, size):
    last = size - 1
    sent = threading.Lock() if rank == last else rank
    with pytest.raises(TypeError if rank == last else pickle.PicklingError,
                       match=None if rank == last else r"ranks \[%d\]" % last):
        hvd.allgather_object(sent, name="parity.ago.unpicklable")
    assert hvd.allgather_object(rank, name="parity.ago.unpicklable") == list(range(size))


@pytest.mark.parametrize("local_sizes, homogeneous", [
    ([2, 2, 2, 2], True),
    ([1], True),
    ([3, 3, 3, 2, 2, 1], False),  # nodes of 3, 2 and 1 ranks, seen alike from every rank
    ([1, 2, 2], False),
])
def test_homogeneity_is_decided_from_every_ranks_local_size(local_sizes, homogeneous):
    assert basics._same_ranks_per_node(local_sizes) is homogeneous


def test_is_homogeneous_is_the_jobs_answer_on_every_rank(monkeypatch, size):
    local_sizes = hvd.allgather(torch.tensor([hvd.local_size()]), name="parity.local_sizes")
    answer = hvd.is_homogeneous()
    assert answer == (len(set(local_sizes.tolist())) == 1)
    assert hvd.allgather_object(answer, name="parity.homogeneous") == [answer] * size
    # A rank's own cross size does not decide it: on nodes of 3, 2 and 1 ranks a node's local
    # rank 1 sees 3 * 2 = 6 ranks, and its local rank 0 3 * 3.
    monkeypatch.setattr(basics, "cross_size", lambda: size + 1)
    assert hvd.is_homogeneous() == answer


def test_synchronizing_a_handle_again_gives_none(size):
    from gradsync import _core
    handle = hvd.allreduce_async(torch.ones(2), op=hvd.Sum, name="parity.sync.twice")
    assert torch.equal(hvd.synchronize(handle), torch.full((2,), float(size)))
    before = _core.pending_handles()
    for integer in (handle, -1, 2**70):
        assert hvd.synchronize(integer) is None
        with pytest.raises(ValueError, match="unknown handle"):
            hvd.poll(integer)
    for not_a_handle in ("7", None, 1.0):
        with pytest.raises(ValueError, match="unknown handle"):
            hvd.synchronize(not_a_handle)
    assert _core.pending_handles() == before


def test_objects_of_other_types_on_other_ranks_need_no_name(rank, size):
    """Ranks that only receive pass None; ranks may gather objects of different types."""
    got = hvd.broadcast_object({"lr": 0.1} if rank == 0 else None, root_rank=0)
    assert got == {"lr": 0.1}
    gathered = hvd.allgather_object(rank if rank % 2 == 0 else str(rank))
    assert gathered == [r if r % 2 == 0 else str(r) for r in range(size)]
