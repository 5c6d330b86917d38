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
import threading
import time

import torch

from gradsync.torch import functions
from gradsync.torch.allreduce import allreduce
from gradsync.torch.basics import is_initialized, rank, shutdown
from gradsync.torch.elastic import notices, store
from gradsync.torch.elastic.sampler import ElasticSampler
from gradsync.torch.elastic.state import HostsUpdatedInterrupt, ObjectState, State, TorchState
from gradsync.torch.wire import Min

__all__ = ["ElasticSampler", "HostsUpdatedInterrupt", "ObjectState", "State", "TorchState",
           "run"]


# How long each rank waits on its own part between the rounds of _until_every_rank.
_ROUND_SECONDS = 1.0


def _until_every_rank(done_within, name):
    """Returns once ``done_within(seconds)`` (this rank's wait for its own part, True once it is
    done) has said True on every rank. The ranks agree in rounds, an allreduce each
    ``_ROUND_SECONDS``, so that a rank with nothing to wait for waits in collectives that each
    complete, never in one the stall inspector ends while another rank writes or reads a large
    commit for longer than GRADSYNC_STALL_SHUTDOWN_SECONDS."""
    while True:
        done = torch.tensor([int(bool(done_within(_ROUND_SECONDS)))], dtype=torch.int32)
        if allreduce(done, op=Min, name=name).item() == 1:
            return


def _read_in_rounds(directory, number):
    """``store.read(directory, number)`` on a thread of its own, while this rank takes part in
    the rounds of ``_until_every_rank`` that the other ranks wait for it in."""
    outcome = {}

    def read():
        try:
            outcome["payload"] = store.read(directory, number)
        except BaseException as error:  # raised on the training thread below
            outcome["error"] = error

    reader = threading.Thread(target=read, name="gradsync-resume", daemon=True)
    reader.start()
    _until_every_rank(lambda seconds: reader.join(seconds) or not reader.is_alive(),
                      "elastic.loaded")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["payload"]


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
        state._load_payload(_read_in_rounds(directory, best))
    elif best >= 0:
        _until_every_rank(lambda seconds: True, "elastic.loaded")
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
            # Every rank's commits are on disk before any rank leaves.
            _until_every_rank(state.flush, "elastic.flushed")
            shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            raise SystemExit(notices.EXIT_RESTART)
        # The last commits on disk before the world reports training finished: the writer's
        # thread would not outlive the process.
        state.flush()
        return result

    return wrapper
