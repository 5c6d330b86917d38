"""BucketViews: DDP's buckets as flat tensors whose slices are the parameters' gradients, for
``DistributedDataParallel(gradient_as_bucket_view=True)``.

A gradient lives in its bucket: before a synchronized backward, each ``p.grad`` that is None (as
``zero_grad()`` leaves them in PyTorch 2, whose default is ``set_to_none=True``) becomes its view,
zeroed with the rest of its bucket, so that autograd accumulates into the bucket itself. A
gradient that still arrives elsewhere (made inside ``no_sync()``, or under ``create_graph``) is
copied into its view by the hook, which makes ``p.grad`` the view, as DDP's hook does with every
gradient after such a ``zero_grad()``. (Done so at every step, that copy and assignment in Python
made the wrapper's step 1.09-1.16 of DDP's on the host: docs/benchmarks.md.)

A bucket is reduced in place, as one tensor, as soon as its last gradient is there: one
crossing into the runtime a bucket instead of one a gradient, and (for a bucket of 64 KiB or more,
which the runtime reduces where it is) no copy into a fusion buffer and back. Consecutive
buckets are slices of one allocation (``_allocate``), so that device buckets the runtime fuses are
reduced where they lie too. A parameter that a backward did not produce contributes zeros
through its slice.

Thread safety: one wrapper's, on its training loop's thread.
"""

import torch

from gradsync.torch.gradient_batch import GradientBatch
from gradsync.torch.wire import _CORE_OPS, Average, _note_producer, _wait_for_streams


class BucketViews:
    """The buckets of one wrapper, each a flat tensor reduced with ``Average``."""

    def __init__(self, buckets, prefix, process_set_id, hooks=None):
        self._params = [bucket.params for bucket in buckets]
        self._hooks = hooks  # a HookRunner (comm_hooks.py) that reduces the buckets instead
        self._filled = set()  # ids of the parameters whose None gradient prefill() replaced
        self._slot = {}  # id(p): (bucket index, offset, its view, the view's data_ptr())
        self._flats = self._allocate(buckets)
        for k, bucket in enumerate(buckets):
            offset = 0
            for p in bucket.params:
                view = self._view(self._flats[k], offset, p)
                self._slot[id(p)] = (k, offset, view, view.data_ptr())
                offset += p.numel()
        self._ready = [0] * len(buckets)  # gradients there in this backward, per bucket
        # Per CUDA bucket, the streams its gradients were made on in this backward.
        self._streams = [[] if flat.is_cuda else None for flat in self._flats]
        names = ["%s.view%d" % (prefix, i) for i in range(len(self._flats))]
        self._batch = GradientBatch(self._flats, names, _CORE_OPS[Average], 1.0, 1.0,
                                    process_set_id)

    @staticmethod
    def _allocate(buckets):
        """Each bucket's flat tensor. Consecutive buckets of one dtype and device are adjacent
        slices of one allocation, in bucket order, each a whole number of 16 bytes long (its
        tail zeros): the runtime fuses consecutive buckets into one of its own where they fit
        (25 MiB on a GPU), and reduces such a fused bucket where it lies, with no copy in or
        out, only when its members lie back to back so (docs/architecture.md, "Buckets reduced
        where they lie")."""
        flats = []
        run = []  # consecutive buckets of one dtype and device: (bucket, padded length)

        def allocate_run():
            if not run:
                return
            first = run[0][0].params[0]
            storage = torch.zeros(sum(length for _, length in run), dtype=first.dtype,
                                  device=first.device)
            offset = 0
            for _, length in run:
                flats.append(storage[offset:offset + length])
                offset += length
            run.clear()

        for bucket in buckets:
            first = bucket.params[0]
            unit = max(1, 16 // first.element_size())
            elements = sum(p.numel() for p in bucket.params)
            if run and (run[0][0].params[0].dtype != first.dtype
                        or run[0][0].params[0].device != first.device):
                allocate_run()
            run.append((bucket, (elements + unit - 1) // unit * unit))
        allocate_run()
        return flats

    @staticmethod
    def _view(flat, offset, p):
        return flat[offset:offset + p.numel()].view_as(p)

    @staticmethod
    def fit(buckets):
        """Whether each bucket's parameters can share one flat tensor: a dtype the runtime
        carries, one device, and dense, contiguous parameters (whose gradients are laid out as
        a slice of it is)."""
        for bucket in buckets:
            first = bucket.params[0]
            if not GradientBatch.carries(first):
                return False
            for p in bucket.params:
                if (p.dtype != first.dtype or p.device != first.device
                        or p.layout != torch.strided or not p.is_contiguous()):
                    return False
        return True

    def ready(self, p, grad):
        """Takes ``p``'s dense gradient ``grad`` (its ``p.grad``) into its bucket, which starts
        once all its gradients are there. Each parameter once a backward."""
        k, _, view, address = self._slot[id(p)]
        # The memory, not only the object: ``p.grad.data = ...`` moves the view's object.
        if grad is not view or grad.data_ptr() != address:
            if grad.shape != view.shape:
                raise ValueError("a gradient of shape %s for a parameter of shape %s: a parameter "
                                 "replaced by one of another shape needs a new wrapper"
                                 % (tuple(grad.shape), tuple(view.shape)))
            view = self._current_view(p)
            with torch.no_grad():  # under create_graph the gradient has a graph of its own
                view.copy_(grad)
            p.grad = view
        streams = self._streams[k]
        if streams is not None:
            _note_producer(streams, view.device)
        self._ready[k] += 1
        if self._ready[k] == len(self._params[k]):
            self._start(k)

    def _current_view(self, p):
        """``p``'s view, made again where something replaced the object that was."""
        k, offset, view, address = self._slot[id(p)]
        if view.data_ptr() != address:
            view = self._view(self._flats[k], offset, p)
            self._slot[id(p)] = (k, offset, view, address)
        return view

    def prefill(self):
        """Before a synchronized backward: makes each gradient that is None its view, zeroed, so
        that backward accumulates into its bucket with no copy. A bucket whose gradients are
        all None is zeroed as one tensor."""
        for k, params in enumerate(self._params):
            missing = [p for p in params if p.grad is None]
            if not missing:
                continue
            whole = len(missing) == len(params)
            if whole:
                self._flats[k].zero_()
            for p in missing:
                view = self._current_view(p)
                if not whole:
                    view.zero_()
                p.grad = view
                self._filled.add(id(p))

    def _start(self, k):
        flat = self._flats[k]
        streams = self._streams[k]
        if streams:
            # The batch takes the current stream as the bucket's producer: it waits for the
            # others that made its gradients first.
            _wait_for_streams(streams, flat)
            streams.clear()
        if self._hooks is not None:
            # The hook's buffer is the bucket itself, without the padding.
            params = self._params[k]
            self._hooks.ready_buffer(k, params, flat[:sum(p.numel() for p in params)])
            return
        self._batch.start(flat, flat)

    def finish(self, locally_unused, keep_their_gradients):
        """Starts the buckets still short of gradients, each missing one as the gradient its
        parameter holds (accumulated under ``no_sync()``, in its view or not) or as zeros, and
        completes every bucket. Returns ``(p, reduced)`` for the parameters backward did not
        produce here, whose reduced gradient the wrapper writes where it must. With
        ``keep_their_gradients`` (``find_unused_parameters``) such a parameter whose gradient is
        its view gets a copy of it first, so that it keeps its value if no rank used it, or None
        where ``prefill()`` gave it the view."""
        try:
            for p in locally_unused:
                view = self._current_view(p)
                grad = p.grad
                if grad is view:
                    if keep_their_gradients:
                        p.grad = None if id(p) in self._filled else view.clone()
                elif grad is None:
                    view.zero_()
                else:
                    with torch.no_grad():
                        view.copy_(grad)
            for k in range(len(self._flats)):
                if self._ready[k] < len(self._params[k]):
                    self._start(k)
            if self._hooks is None:
                self._batch.finish()
            else:
                for _, p, reduced in self._hooks.finish():
                    view = self._slot[id(p)][2]
                    if reduced.data_ptr() != view.data_ptr():
                        view.copy_(reduced)
        finally:
            self._filled.clear()
            self._ready = [0] * len(self._flats)
            for streams in self._streams:
                if streams is not None:
                    streams.clear()
        return [(p, self._slot[id(p)][2]) for p in locally_unused]
