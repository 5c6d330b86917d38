"""Communication hooks of a script's own for gradsync's DistributedDataParallel, as PyTorch DDP's
``register_comm_hook`` takes them.

A hook is called as under DDP, ``hook(state, bucket)`` with a ``GradBucket``, once the bucket's
gradients are all produced and the hooks of the buckets before it have been called (DDP's order,
the same on every rank). It returns a ``torch.futures.Future`` whose value is the bucket's
reduced flat tensor (or a list holding it, as the futures of ``torch.distributed`` do); the
wrapper writes it into the gradients at the end of backward.

A hook may call ``torch.distributed`` over the gradsync backend (``gradsync.torch.process_group``),
as hooks written for DDP do; the wrapper waits for those futures at the end of backward. Or it
communicates with ``allreduce_future``: it starts a gradsync allreduce and returns a
future that the wrapper completes on the thread of the backward: when a later bucket's hook is
called and the operation has finished, and at the end of backward, oldest first. Callbacks
chained with ``then`` therefore run on that thread, never on gradsync's own threads, and may
start allreduces of their own and wait for them. The operations are named after the bucket and
their order within it, so each rank's hook must start the same ones for a bucket.

Thread safety: one wrapper's hooks run on the thread of its backward.
"""

import contextlib
import importlib
import threading

import torch

from gradsync.torch.allreduce import allreduce_async_
from gradsync.torch.ddp_buckets import flat_views
from gradsync.torch.handles import poll, synchronize
from gradsync.torch.process_group_work import wait_for_pending
from gradsync.torch.process_sets import global_process_set
from gradsync.torch.wire import Average

_local = threading.local()  # .context: the _BucketContext of the hook or callback running here


class GradBucket:
    """What a hook is given: PyTorch's ``torch.distributed.GradBucket``, gradsync's bucket."""

    def __init__(self, index, buffer, params, is_last):
        self._index = index
        self._buffer = buffer
        self._params = params
        self._is_last = is_last

    def index(self):
        """The bucket's place in backward's order, 0 first."""
        return self._index

    def buffer(self):
        """The bucket's gradients, flattened into one tensor in ``parameters()``' order (zeros
        for a parameter backward left without one)."""
        return self._buffer

    def gradients(self):
        """The gradients as views into ``buffer()``, each of its parameter's shape."""
        return flat_views(self._buffer, self._params)

    def parameters(self):
        return list(self._params)

    def is_last(self):
        """Whether this is the last bucket of backward (the model's first layers)."""
        return self._is_last

    def set_buffer(self, buffer):
        self._buffer = buffer


class _BucketContext:
    """Names the operations a bucket's hook and its callbacks start, in their order."""

    def __init__(self, runner, index):
        self.runner = runner
        self.index = index
        self.started = 0

    def next_name(self):
        self.started += 1
        return "%s.hook.%d.%d" % (self.runner.prefix, self.index, self.started)


@contextlib.contextmanager
def _within(context):
    """Makes ``context`` the one operations started here are counted in, for a while."""
    outer = getattr(_local, "context", None)
    _local.context = context
    try:
        yield
    finally:
        _local.context = outer


class _HookFuture(torch.futures.Future):
    """The future of ``allreduce_future``'s operation (``handle``, started in ``context``, a
    _BucketContext or None). Waiting for it completes it, and, within a hook, the operations
    started before it."""

    def __init__(self, handle, context):
        super().__init__()
        self.handle = handle
        self.context = context
        self.taken = False  # its operation waited for, its result being set

    def wait(self):
        if not self.done():
            if self.context is not None:
                self.context.runner.complete_through(self)
            else:
                _complete(self)
        return super().wait()


def _complete(future):
    """Waits for a _HookFuture's operation (on a GPU: orders the current stream after it) and
    completes it; its callbacks run here, counted in the bucket that started the operation."""
    if future.taken:
        return
    future.taken = True
    try:
        result = synchronize(future.handle)
    except Exception as error:  # the runtime's error goes to the future's consumers
        if future.context is not None:
            future.context.runner.note_error(error)
        with _within(future.context):
            future.set_exception(error)
        return
    with _within(future.context):
        future.set_result(result)


def hook_process_set():
    """Within a hook or its callbacks, the wrapper's process set; elsewhere the global set."""
    context = getattr(_local, "context", None)
    return context.runner.process_set if context is not None else global_process_set


def allreduce_future(tensor, op=Average, name=None, process_set=None):
    """Starts reducing ``tensor`` in place over the ranks; returns a ``torch.futures.Future``
    whose value is ``tensor`` once reduced (not a list, unlike ``torch.distributed``'s).

    Within a hook or its callbacks, ``name`` defaults to one made from the bucket and the
    operation's order in it, and ``process_set`` to the wrapper's. Elsewhere the operation is
    unnamed and on the global set unless given, and only ``wait()`` completes its future."""
    context = getattr(_local, "context", None)
    if name is None and context is not None:
        name = context.next_name()
    if process_set is None:
        process_set = hook_process_set()
    future = _HookFuture(allreduce_async_(tensor, name=name, op=op, process_set=process_set),
                         context)
    if context is not None:
        context.runner.pending.append(future)
    return future


def allreduce_hook(state, bucket):
    """DDP's default hook in gradsync's terms: the bucket averaged over the wrapper's set."""
    del state
    return allreduce_future(bucket.buffer())


class HookRunner:
    """Calls a wrapper's hook for each bucket of a backward, in bucket order, and completes the
    futures of the operations the hooks start."""

    def __init__(self, state, hook, prefix, process_set, bucket_count):
        self.state = state
        self.hook = hook
        self.prefix = prefix
        self.process_set = process_set
        self.bucket_count = bucket_count
        self.pending = []  # the _HookFutures of the operations hooks started, oldest first
        self._waiting = {}  # bucket index -> (GradBucket) of a bucket whose turn has not come
        self._called = []  # (GradBucket, its hook's future), in bucket order
        self._error = None
        # bucket index -> (its flat host buffer, the gradients' views into it), kept from step to
        # step: making 2 views a gradient every step cost more than the hook's own work
        self._host_buffers = {}

    def note_error(self, error):
        if self._error is None:
            self._error = error

    def ready(self, index, params, grads):
        """Takes a complete bucket's gradients (one dtype and device); calls its hook, and those
        of the buckets after it that were waiting for it, once every earlier one's was called."""
        self.ready_buffer(index, params, self._flatten(index, grads))

    def ready_buffer(self, index, params, buffer):
        """``ready`` for a bucket whose gradients already lie in ``buffer``, back to back."""
        self._waiting[index] = GradBucket(index, buffer, params, index == self.bucket_count - 1)
        self.complete_finished()
        while len(self._called) in self._waiting:
            self._call(self._waiting.pop(len(self._called)))

    def _flatten(self, index, grads):
        """The bucket's buffer: the gradient itself where it is alone; on the host, the bucket's
        buffer of the last step, whose memory the system need not hand over again (a fresh 100
        MB buffer costs tens of milliseconds of page faults a step); on a GPU a new one, which
        the caching allocator makes cheap and orders on the current stream."""
        if len(grads) == 1:
            return grads[0].reshape(-1)
        first = grads[0]
        if first.is_cuda:
            return torch.cat([g.reshape(-1) for g in grads])
        size = sum(g.numel() for g in grads)
        kept = self._host_buffers.get(index)
        if kept is None or kept[0].numel() != size or kept[0].dtype != first.dtype:
            buffer = torch.empty(size, dtype=first.dtype)
            kept = self._host_buffers[index] = (buffer, flat_views(buffer, grads))
        buffer, slots = kept
        for g, slot in zip(grads, slots):
            if g.data_ptr() != slot.data_ptr():  # a gradient written there last step is there
                slot.copy_(g)
        return buffer

    def _call(self, bucket):
        with _within(_BucketContext(self, bucket.index())):
            future = self.hook(self.state, bucket)
        if not isinstance(future, torch._C.Future):  # what then() returns, too
            raise TypeError("DistributedDataParallel: a communication hook must return a "
                            "torch.futures.Future, not %r" % (type(future).__name__,))
        self._called.append((bucket, future))

    def complete_finished(self):
        """Completes the futures whose operations have finished, without waiting."""
        for future in list(self.pending):
            if not future.taken and poll(future.handle):
                _complete(future)
        self.pending = [f for f in self.pending if not f.taken]

    def complete_through(self, last):
        """Completes the futures up to ``last``, oldest first, waiting for each operation."""
        while self.pending and not last.taken:
            _complete(self.pending.pop(0))

    def finish(self):
        """Once every bucket's hook was called: completes every future, and returns the buckets'
        results as [(bucket index, param, reduced gradient)]."""
        if len(self._called) != self.bucket_count:
            raise RuntimeError("DistributedDataParallel: %d of %d buckets reached their "
                               "communication hook" % (len(self._called), self.bucket_count))
        try:
            while self.pending:
                _complete(self.pending.pop(0))
            if not all(future.done() for _, future in self._called):
                # A hook that called torch.distributed over the gradsync backend: its futures
                # complete on that backend's thread.
                wait_for_pending()
            if self._error is None:
                return [triple for bucket, future in self._called
                        for triple in self._results(bucket, future)]
        except Exception:
            if self._error is None:
                raise
        finally:
            error, self._error = self._error, None
            self.pending = []
            self._called = []
            self._waiting = {}
        # An operation failed: the runtime's error, not the callback chain's, and even where the
        # hook's callbacks did not look at its result.
        raise error

    def _results(self, bucket, future):
        if not future.done():
            raise RuntimeError("DistributedDataParallel: the communication hook's future for "
                               "bucket %d was not complete at the end of backward: complete it "
                               "from futures of allreduce_future, or before returning it"
                               % bucket.index())
        value = future.wait()
        if isinstance(value, (list, tuple)) and len(value) == 1:
            value = value[0]
        size = bucket.buffer().numel()
        if not isinstance(value, torch.Tensor) or value.numel() != size:
            raise RuntimeError("DistributedDataParallel: the communication hook's future for "
                               "bucket %d must hold a tensor of the bucket's %d elements, not "
                               "%r" % (bucket.index(), size, value))
        params = bucket.parameters()
        pieces = self._pieces(bucket.index(), value.reshape(-1), params)
        return [(bucket.index(), p, piece if piece.dtype == p.dtype else piece.to(p.dtype))
                for p, piece in zip(params, pieces)]

    def _pieces(self, index, flat, params):
        """Each parameter's part of a bucket's result: the kept views where the result is the
        bucket's host buffer (a hook that reduced it in place)."""
        kept = self._host_buffers.get(index)
        if (kept is not None and kept[0].data_ptr() == flat.data_ptr() and
                kept[0].numel() == flat.numel() and kept[0].dtype == flat.dtype):
            return kept[1]
        return flat_views(flat, params)


def _wrapped_by_compress_wrapper(hook):
    """(DDP's wrapper maker, the hook it wraps) where ``hook`` is DDP's fp16_compress_wrapper or
    bf16_compress_wrapper around a hook, else None. The wrapper is a closure of DDP's over that
    one hook."""
    try:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    except ImportError:
        return None
    if getattr(hook, "__module__", None) != default_hooks.__name__:
        return None
    maker = getattr(default_hooks, hook.__qualname__.split(".")[0], None)
    cells = [c.cell_contents for c in (getattr(hook, "__closure__", None) or ())]
    inner = [c for c in cells if callable(c)]
    if maker is None or not hook.__qualname__.endswith("_compress_wrapper_hook") or len(inner) != 1:
        return None
    return maker, inner[0]


_PYTORCH_HOOKS_PACKAGE = "torch.distributed.algorithms.ddp_comm_hooks."


def _pytorch_hooks():
    """PyTorch DDP's hooks that gradsync runs in its own form: (their module, name, ours)."""
    from gradsync.torch import local_sgd, powersgd  # they build on this module
    return [("powerSGD_hook", "powerSGD_hook", powersgd.powerSGD_hook),
            ("powerSGD_hook", "batched_powerSGD_hook", powersgd.batched_powerSGD_hook),
            ("post_localSGD_hook", "post_localSGD_hook", local_sgd.post_localSGD_hook)]


def gradsync_form_of(hook):
    """The hook ``register_comm_hook`` runs for ``hook``: gradsync's for PyTorch's PowerSGD and
    post-local SGD hooks, also inside DDP's fp16_compress_wrapper or bf16_compress_wrapper;
    ``hook`` itself otherwise."""
    wrapped = _wrapped_by_compress_wrapper(hook)
    if wrapped is not None:
        maker, inner = wrapped
        ours = gradsync_form_of(inner)
        return hook if ours is inner else maker(ours)
    for module, name, ours in _pytorch_hooks():
        try:
            theirs = importlib.import_module(_PYTORCH_HOOKS_PACKAGE + module)
        except ImportError:
            continue
        if hook is getattr(theirs, name, None):
            return ours
    return hook
