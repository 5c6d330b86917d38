"""Handles of asynchronous collectives: the integer Horovod returns, ``poll`` and ``synchronize``.

Each handle keeps the tensors its operation reads or writes alive until it is synchronized, and
knows how to produce the operation's result.
"""

import itertools

from gradsync.torch.wire import _stream_of


class _Pending:
    """An enqueued operation: its runtime handles, the tensors to keep alive, what it returns,
    and the CUDA device whose current stream consumes its result (None: wait on the host)."""

    __slots__ = ("handles", "keep", "finish", "consumer")

    def __init__(self, handles, keep, finish, consumer):
        self.handles = handles
        self.keep = keep
        self.finish = finish
        self.consumer = consumer


_handle_map = {}
_handle_ids = itertools.count(1)


def _register(handles, keep, finish, consumer=None):
    """A new handle. With ``consumer`` (a CUDA device), ``synchronize`` orders the device's
    current stream after the operation instead of waiting for it on the host."""
    handle = next(_handle_ids)
    _handle_map[handle] = _Pending(handles, keep, finish, consumer)
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

    A CUDA allreduce or broadcast is waited for as PyTorch DDP waits for its buckets: the host
    blocks only until the operation is launched, and the device's current stream waits for it,
    so that every kernel queued there afterwards (the optimizer's, ``.cpu()``'s copy) reads the
    result while the host runs ahead. Work on another stream must wait for the current one.

    Raises HorovodInternalError (gradsync's GradsyncInternalError) with the runtime's message when
    the operation failed: a mismatch between ranks, a stall, a shutdown.
    """
    pending = _handle_map.pop(handle, None)
    if pending is None:
        raise ValueError("unknown handle %r (already synchronized?)" % (handle,))
    if pending.consumer is None:
        for h in pending.handles:
            h.wait()
    else:
        stream = _stream_of(pending.consumer)
        for h in pending.handles:
            h.synchronize_stream(stream)
    return pending.finish()
