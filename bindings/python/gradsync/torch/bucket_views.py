"""BucketViews: DDP's buckets as flat tensors whose slices are the parameters' gradients, for
``DistributedDataParallel(gradient_as_bucket_view=True)``.

A gradient lives in its bucket once backward has produced it: the hook copies it there the first
time (and after ``zero_grad(set_to_none=True)``, which drops the view) and makes ``p.grad`` the
view, so later backward passes accumulate into the bucket itself. A bucket is reduced in place, as
one tensor, as soon as its last gradient is there: one crossing into the runtime a bucket instead
of one a gradient, and no copy into a fusion buffer and back. A parameter that a backward did not
produce contributes zeros through its slice (which is still its gradient if it was before).

Thread safety: one wrapper's, on its training loop's thread.
"""

import torch

from gradsync.torch.gradient_batch import GradientBatch
from gradsync.torch.wire import _CORE_OPS, Average


class BucketViews:
    """The buckets of one wrapper, each a flat tensor reduced with ``Average``."""

    def __init__(self, buckets, prefix, process_set_id):
        self._flats = []
        self._views = {}  # id(p): its slice of its bucket, shaped as p
        self._bucket_of = {}  # id(p): index of its bucket
        for bucket in buckets:
            first = bucket.params[0]
            flat = torch.zeros(sum(p.numel() for p in bucket.params), dtype=first.dtype,
                               device=first.device)
            offset = 0
            for p in bucket.params:
                self._views[id(p)] = flat[offset:offset + p.numel()].view_as(p)
                self._bucket_of[id(p)] = len(self._flats)
                offset += p.numel()
            self._flats.append(flat)
        self._sizes = [len(bucket.params) for bucket in buckets]
        self._ready = [0] * len(buckets)  # gradients there in this backward, per bucket
        names = ["%s.view%d" % (prefix, i) for i in range(len(self._flats))]
        self._batch = GradientBatch(self._flats, names, _CORE_OPS[Average], 1.0, 1.0,
                                    process_set_id)

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
        view = self._views[id(p)]
        if grad is not view:
            if grad.shape != view.shape:
                raise ValueError("a gradient of shape %s for a parameter of shape %s: a parameter "
                                 "replaced by one of another shape needs a new wrapper"
                                 % (tuple(grad.shape), tuple(view.shape)))
            view.copy_(grad)
            p.grad = view
        k = self._bucket_of[id(p)]
        self._ready[k] += 1
        if self._ready[k] == self._sizes[k]:
            self._batch.start(self._flats[k], self._flats[k])

    def finish(self, locally_unused):
        """Starts the buckets still short of gradients, the missing ones as zeros, and completes
        every bucket. Returns ``(p, reduced)`` for the parameters backward did not produce here:
        where some rank used them, the wrapper makes the view their gradient."""
        try:
            for p in locally_unused:
                self._views[id(p)].zero_()
            for k, flat in enumerate(self._flats):
                if self._ready[k] < self._sizes[k]:
                    self._batch.start(flat, flat)
            self._batch.finish()
        finally:
            self._ready = [0] * len(self._flats)
        return [(p, self._views[id(p)]) for p in locally_unused]
