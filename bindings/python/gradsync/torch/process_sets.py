"""Process sets: subsets of the ranks that run collectives among themselves.

As in Horovod, a ``ProcessSet`` may be made before ``init`` (then passed to ``init``) or added at
run time with ``add_process_set``; inside a set, ranks are numbered 0..size-1 in ascending global
rank.
"""

import collections
import itertools

from gradsync import _core


class ProcessSet:
    """A set of global ranks; ``process_set_id`` is known once the set exists."""

    def __init__(self, ranks):
        if hasattr(ranks, "Get_group"):
            raise ValueError("ProcessSet(comm) is not supported: pass the list of global ranks")
        self.ranks = sorted(int(r) for r in ranks)
        self.process_set_id = None

    def _require_id(self):
        if self.process_set_id is None:
            raise ValueError("process set %s has not been added: pass it to init(process_sets=...) "
                             "or to add_process_set()" % self.ranks)
        return self.process_set_id

    def size(self):
        return len(_core.process_set_ranks(self._require_id()))

    def rank(self):
        """This process's rank within the set, or -1 when it is not a member."""
        members = _core.process_set_ranks(self._require_id())
        me = _core.rank()
        return members.index(me) if me in members else -1

    def included(self):
        return self.rank() >= 0

    def __repr__(self):
        return "ProcessSet(process_set_id=%s, ranks=%s)" % (self.process_set_id, self.ranks)


class _GlobalProcessSet(ProcessSet):
    def __init__(self):
        super().__init__([])
        self.process_set_id = 0

    def size(self):
        return _core.size()

    def rank(self):
        return _core.rank()


global_process_set = _GlobalProcessSet()


def _ranks_of(process_set):
    return process_set.ranks if isinstance(process_set, ProcessSet) else sorted(process_set)


def _after_init(requested):
    """Gives the sets passed to init their ids (1, 2, ... in order) and the global set its ranks."""
    global_process_set.ranks = list(range(_core.size()))
    for set_id, process_set in zip(_core.process_set_ids()[1:], requested):
        if isinstance(process_set, ProcessSet):
            process_set.process_set_id = set_id


# (kind, process set id) -> the numbers objects of that kind on that set take.
_ordinals = collections.defaultdict(itertools.count)


def _collective_prefix(kind, process_set):
    """Names the n-th object of ``kind`` that communicates on a set: ``<kind><set id>.<n>``.

    The set's ranks create (or first use) such objects in the same order, so the prefixes agree
    across ranks, and they stay the same step after step, where the response cache serves them.
    """
    set_id = _id_of(process_set)
    return "%s%d.%d" % (kind, set_id, next(_ordinals[(kind, set_id)]))


def _id_of(process_set):
    if process_set is None:
        return 0
    if not isinstance(process_set, ProcessSet):
        raise ValueError("process_set must be a ProcessSet, not %r" % (process_set,))
    return process_set._require_id()


def add_process_set(process_set):
    """Adds a set (a ProcessSet or a list of global ranks) on every rank; returns the ProcessSet.

    Collective over every rank, members or not, in the same order everywhere.
    """
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.process_set_id is not None:
        raise ValueError("%r has already been added" % process_set)
    process_set.process_set_id = _core.add_process_set(process_set.ranks)
    return process_set


def remove_process_set(process_set):
    """Removes a set on every rank; its pending operations fail. Returns True when removed."""
    _core.remove_process_set(_id_of(process_set))
    process_set.process_set_id = None
    return True
