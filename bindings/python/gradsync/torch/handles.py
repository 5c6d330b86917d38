"""Handles of asynchronous collectives: the integer Horovod returns, ``poll`` and ``synchronize``.

Each handle keeps the tensors its operation reads or writes alive until it is synchronized, and
knows how to produce the operation's result.
"""

import itertools


class _Pending:
    """An enqueued operation: its runtime handles, the tensors to keep alive, and what it returns."""

    __slots__ = ("handles", "keep", "finish")

    def __init__(self, handles, keep, finish):
        self.handles = handles
        self.keep = keep
        self.finish = finish


_handle_map = {}
_handle_ids = itertools.count(1)


def _register(handles, keep, finish):
    handle = next(_handle_ids)
    _handle_map[handle] = _Pending(handles, keep, finish)
    return handle


def _forget_handles():
    _handle_map.clear()


def poll(handle):
    """True once the operation behind ``handle`` has finished. Never blocks."""
    pending = _handle_map.get(handle)
    if pending is None:
        raise ValueError("unknown handle %r (already synchronized?)" % (handle,))
    return all(h.poll() for h in pending.handles)


def synchronize(handle):
    """Waits for the operation behind ``handle`` and returns its result.

    Raises HorovodInternalError (gradsync's GradsyncInternalError) with the runtime's message when
    the operation failed: a mismatch between ranks, a stall, a shutdown.
    """
    pending = _handle_map.pop(handle, None)
    if pending is None:
        raise ValueError("unknown handle %r (already synchronized?)" % (handle,))
    for h in pending.handles:
        h.wait()
    return pending.finish()
