"""DDP's buckets: the parameters cut as PyTorch DDP first assigns them, for the wrapper's grouped
allreduces (with compression and inside ``join()``), its communication hooks and its bucket views.

Thread safety: one wrapper's, on its training loop's thread.
"""

# PyTorch DDP starts with a small bucket so that the first allreduce leaves early in backward.
_FIRST_BUCKET_BYTES = 1024 * 1024


class Bucket:
    """Parameters whose gradients are reduced as one grouped allreduce."""

    __slots__ = ("index", "params", "ready", "streams", "launched")

    def __init__(self, index, params):
        self.index = index
        self.params = params
        self.ready = set()  # ids of the parameters whose gradient this backward produced
        self.streams = []  # the CUDA streams that produced them (from _stream_of)
        self.launched = None  # (handle, [(param, reduced, context)], stream it was launched on)


def flat_views(flat, tensors):
    """Views of ``flat``, back to back from its start, each of its tensor's shape: where each of
    ``tensors`` lies in a bucket's flat tensor."""
    views, start = [], 0
    for t in tensors:
        views.append(flat[start:start + t.numel()].view(t.shape))
        start += t.numel()
    return views


def buckets_of(params, bucket_cap_bytes):
    """Parameters in reverse order of registration (backward's order, roughly), cut into buckets
    as PyTorch DDP first assigns them: a 1 MiB first bucket, then ``bucket_cap_bytes`` each, and
    a new bucket wherever the dtype or device changes, so that each bucket is one flat tensor's
    worth (a communication hook's ``bucket.buffer()``)."""
    buckets, current, current_bytes = [], [], 0
    cap = min(_FIRST_BUCKET_BYTES, bucket_cap_bytes)
    for p in reversed(params):
        if current and (p.dtype, p.device) != (current[0].dtype, current[0].device):
            buckets.append(Bucket(len(buckets), current))
            current, current_bytes, cap = [], 0, bucket_cap_bytes
        current.append(p)
        current_bytes += p.numel() * p.element_size()
        if current_bytes >= cap:
            buckets.append(Bucket(len(buckets), current))
            current, current_bytes, cap = [], 0, bucket_cap_bytes
    if current:
        buckets.append(Bucket(len(buckets), current))
    return buckets
