"""Elastic training with Horovod's API (``hvd.elastic.run``, ``TorchState``, ``ElasticSampler``):
a job that loses a host, or gains one, goes on from its last commit.

Open MPI cannot shrink or grow a running world, so gradsync restarts it: the launcher
(``gradsyncrun --min-np N --max-np M``) ends the world whose hosts changed and starts a new one on
the hosts there are, and ``run`` resumes the new world from the newest durable commit. What a
commit holds survives; everything else (data loader workers, anything in memory outside the
state) starts afresh. docs/elastic.md has the whole design.

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...
            state.commit()

    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, epoch=0, batch=0)
    train(state)
"""

import functools
import sys
import time

from gradsync.torch import functions
from gradsync.torch.basics import is_initialized, rank, shutdown
from gradsync.torch.elastic import notices, store
from gradsync.torch.elastic.sampler import ElasticSampler
from gradsync.torch.elastic.state import HostsUpdatedInterrupt, ObjectState, State, TorchState
from gradsync.torch.mpi_ops import barrier

__all__ = ["ElasticSampler", "HostsUpdatedInterrupt", "ObjectState", "State", "TorchState",
           "run"]


def _resume(state):
    """Makes every rank's state the newest durable commit any rank can read (loaded by the lowest
    such rank and broadcast from it), or rank 0's state when there is none. Records what it did in
    ``state.last_resume``: the commit (-1 for none), the rank it came from, and the seconds spent
    finding, loading and broadcasting it."""
    started = time.perf_counter()
    directory = notices.checkpoint_dir()
    newest = store.latest(directory) if directory else -1
    found = functions.allgather_object(newest, name="elastic.newest_commit")
    best = max(found)
    source = found.index(best) if best >= 0 else 0
    found_at = time.perf_counter()
    if best >= 0 and rank() == source:
        state._load_payload(store.read(directory, best))
    loaded_at = time.perf_counter()
    state.sync(root_rank=source)
    if best >= 0:
        state._commits = best
    state.last_resume = {"commit": best, "source": source,
                         "find_seconds": found_at - started,
                         "load_seconds": loaded_at - found_at,
                         "broadcast_seconds": time.perf_counter() - loaded_at}


def run(func):
    """Runs ``func(state, ...)`` as one world of an elastic job.

    The state starts as the newest commit of the job's earlier worlds (or as rank 0's, in the
    first), and the reset callbacks run in every world after the first. When the launcher
    announces other hosts, ``state.commit()`` raises HostsUpdatedInterrupt on every rank; the ranks
    then wait for their commits to be on disk and leave together with the status that asks the
    launcher to start the next world. Outside an elastic launcher it resumes the same way (from
    GRADSYNC_ELASTIC_CHECKPOINT_DIR when set) and the hosts never change.
    """

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        if not is_initialized():
            raise ValueError("call gradsync.torch.init() before an elastic.run function")
        _resume(state)
        if notices.world() > 0:
            state.on_reset()
        try:
            result = func(state, *args, **kwargs)
        except HostsUpdatedInterrupt:
            state.flush()
            barrier()  # every rank's commit is on disk before any rank leaves
            shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            raise SystemExit(notices.EXIT_RESTART)
        # The last commits on disk before the world reports training finished: the writer's
        # thread would not outlive the process.
        state.flush()
        return result

    return wrapper
