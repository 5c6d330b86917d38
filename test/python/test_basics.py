"""Starting gradsync again in the same process: what the package made for the first start is made
again for the second, not reused with the first start's numbering.

MPI cannot start twice in a process, so gradsync starts again only where the application started
MPI: with GRADSYNC_TEST_APPLICATION_MPI=1 this module starts it through mpi4py when collected,
before the first init (ctest runs it alone so; the package's other tests leave MPI to gradsync)."""

import gc
import os
import time
import weakref

import pytest
import torch

import gradsync.torch as hvd
from gradsync.torch import basics, local_sgd

APPLICATION_MPI = os.environ.get("GRADSYNC_TEST_APPLICATION_MPI") == "1"
if APPLICATION_MPI:
    from mpi4py import MPI  # noqa: F401

pytestmark = pytest.mark.skipif(not APPLICATION_MPI,
                                reason="gradsync starts again only where the application started "
                                       "MPI (GRADSYNC_TEST_APPLICATION_MPI=1)")


def test_a_restart_makes_the_node_set_again(monkeypatch, rank, size):
    """Each rank alone on a node of its own (as reported to the package): the first start adds one
    set per rank; the second start has none until the node's set is added again."""
    monkeypatch.setattr(basics, "cross_rank", lambda: rank)
    before = local_sgd.node_process_set()
    starts = basics.starts()
    hvd.shutdown()
    hvd.init()
    assert basics.starts() == starts + 1
    if size == 1:
        assert before is hvd.global_process_set
        assert local_sgd.node_process_set() is hvd.global_process_set
        return
    assert before.ranks == [rank]
    after = local_sgd.node_process_set()  # the first start's set would name no set now
    assert after is not before
    assert after.ranks == [rank]
    value = torch.tensor([float(rank + 1)])
    assert hvd.allreduce(value, op=hvd.Sum, process_set=after).item() == rank + 1


def test_init_on_a_list_of_ranks(rank, size):
    """As Horovod takes it: init(comm=[ranks of MPI_COMM_WORLD]), called by those ranks only."""
    hvd.shutdown()
    hvd.init(comm=list(reversed(range(size))))  # numbered in the list's order
    assert hvd.size() == size and hvd.rank() == size - 1 - rank
    assert hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item() == size
    hvd.shutdown()
    hvd.init(comm=[])  # no ranks named: the whole world
    assert hvd.size() == size and hvd.rank() == rank
    hvd.shutdown()
    if rank == 0:
        hvd.init(comm=[0])
        assert hvd.size() == 1 and hvd.rank() == 0
        hvd.shutdown()
    else:
        with pytest.raises(ValueError, match="is not among them"):
            hvd.init(comm=[0])
    hvd.init()
    assert hvd.size() == size


def test_handles_held_over_a_restart_stay_valid(rank, size):
    """shutdown() leaves the handles already returned valid: one whose operation completed gives
    its result, converted back (a bool tensor travels as a copy), after a new start too; one whose
    operation never ran raises the shutdown error."""
    flags = torch.tensor([rank == 0, True, False])
    done = hvd.allreduce_async_(flags, op=hvd.Max, name="held.over.restart")
    while not hvd.poll(done):
        time.sleep(0.001)
    pending, kept = None, None
    if rank == 0:
        alone = torch.ones(2)
        kept = weakref.ref(alone)
        pending = hvd.allreduce_async(alone, name="only.on.rank.0")
        del alone
    # Every rank past rank 0's enqueue before any shuts down (a shutdown closes the queue).
    hvd.allreduce(torch.ones(1), name="after.the.enqueue")
    hvd.shutdown()
    if kept is not None and size > 1:
        # The failed operation's handle no longer holds its tensors once gradsync is down.
        gc.collect()
        assert kept() is None
    hvd.init()
    assert hvd.synchronize(done) is flags
    assert flags.tolist() == [True, True, False]
    if pending is None:
        return
    if size == 1:  # nobody else to wait for: it completed
        assert hvd.synchronize(pending).tolist() == [1.0, 1.0]
        return
    with pytest.raises(hvd.HorovodInternalError, match="shut down"):
        hvd.synchronize(pending)
