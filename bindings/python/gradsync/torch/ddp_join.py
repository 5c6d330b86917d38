"""The state of ``DistributedDataParallel.join()``: which ranks still train, and its end."""

import torch

from gradsync import _core
from gradsync.torch.allreduce import allreduce
from gradsync.torch.wire import Sum


class JoinState:
    """What ``join()`` changes in each step while its context is open."""

    def __init__(self, divide_by_initial_world_size, throw_on_early_termination):
        self.divide_by_initial_world_size = divide_by_initial_world_size
        self.throw_on_early_termination = throw_on_early_termination
        self.active_ranks = None  # ranks still training, from this step's forward
        self.terminated_early = False

    def count_active_ranks(self, process_set, prefix):
        """Learns which ranks still train this step: joined ranks contribute zeros."""
        mine = torch.zeros(process_set.size(), dtype=torch.int32)
        mine[process_set.rank()] = 1
        active = allreduce(mine, op=Sum, name="%s.active" % prefix, process_set=process_set)
        self.active_ranks = [r for r, a in enumerate(active.tolist()) if a]
        if self.throw_on_early_termination and len(self.active_ranks) < process_set.size():
            self.terminated_early = True
            raise RuntimeError("Detected at least one rank that exhausted inputs. Throwing "
                               "across all ranks.")

    def end(self, failed, prefix):
        """Leaves the join: waits for every rank, then (with ``throw_on_early_termination``)
        raises where another rank ran out first. ``failed``: the loop raised, and that error is
        what the caller needs to see."""
        try:
            _core.join()
            if self.throw_on_early_termination:
                flag = torch.tensor([int(self.terminated_early)], dtype=torch.int32)
                anyone = allreduce(flag, op=Sum, name="%s.terminated" % prefix)
                if int(anyone) and not self.terminated_early and not failed:
                    raise RuntimeError("Detected at least one rank that exhausted inputs. "
                                       "Throwing across all ranks.")
        except Exception:
            if not failed:
                raise
