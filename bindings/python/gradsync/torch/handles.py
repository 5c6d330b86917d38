"""Handles of asynchronous collectives: the integer Horovod returns, ``poll`` and ``synchronize``.

The table behind them is gradsync._core's: each handle keeps the tensors its operation reads or
writes alive until it is synchronized, and knows how to produce the operation's result.
"""

from gradsync import _core
from gradsync.torch.wire import _release_kept_after_consumer, _stream_of


def _register(handles, keep, finish, consumer=None, producer=0):
    """A new handle for the runtime handles ``handles``, whose result is ``finish()``. With
    ``consumer`` (a CUDA device), ``synchronize`` orders the device's current stream after the
    operation instead of waiting for it on the host; ``producer`` is then the stream the
    operation's inputs were ready on (``_ready_stream``)."""
    return _core.register_handle(handles, keep, finish, consumer, producer)


def poll(handle):
    """True once the operation behind ``handle`` has finished. Never blocks. Raises ValueError
    for anything but a pending handle, as Horovod's does."""
    return _core.poll_handle(handle)


def synchronize(handle):
    """Waits for the operation behind ``handle`` and returns its result.

    A CUDA allreduce or broadcast is waited for as PyTorch DDP waits for its buckets: the host
    blocks only until the operation is launched, and the device's current stream waits for it,
    so that every kernel queued there afterwards (the optimizer's, ``.cpu()``'s copy) reads the
    result while the host runs ahead. Work on another stream must wait for the current one.
    Where the current stream is not the one current at the call, the operation's tensors are
    recorded on it (``Tensor.record_stream``), so that the caching allocator, which would hand
    their memory out again on their own stream, waits for it first.

    Raises HorovodInternalError (gradsync's GradsyncInternalError) with the runtime's message when
    the operation failed: a mismatch between ranks, a stall, a shutdown. Returns None for an
    integer that is no pending handle (one already synchronized), as Horovod does; raises
    ValueError for what is no integer.
    """
    return _core.synchronize_handle(handle, _stream_of, _release_kept_after_consumer)


def _synchronize_all(handles):
    """``[synchronize(h) for h in handles]``, with the current stream of each consumer device
    ordered after all of them at once: one wait for each bucket rather than for each tensor."""
    return _core.synchronize_handles(list(handles), _stream_of, _release_kept_after_consumer)


def _results_in_turn(handles, on_cuda):
    """The results of ``handles``, in order. CUDA results (``on_cuda``) come from one
    ``_synchronize_all``; host results are each waited for as they are taken, so that the host's
    work on one (a gradient written back) overlaps the operations still in flight."""
    if on_cuda:
        return _synchronize_all(handles)
    return (synchronize(h) for h in handles)
