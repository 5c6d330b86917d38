"""DistributedDataParallel's buffers: rank 0's (the process set's first rank's) handed to every
replica before a synchronized forward, as PyTorch DDP's ``broadcast_buffers`` does.

Thread safety: one wrapper's, on its training loop's thread.
"""

import torch

from gradsync.torch.allreduce import grouped_allreduce_async_
from gradsync.torch.broadcast import broadcast_async_
from gradsync.torch.ddp_buckets import flat_views
from gradsync.torch.handles import _synchronize_all, synchronize
from gradsync.torch.wire import Sum


def _copy_all(destinations, sources):
    """Copies each source into its destination: in a few launches where this PyTorch has the
    multi-tensor copy (ResNet-50's 161 buffers would otherwise be 161 launches every forward)."""
    foreach_copy = getattr(torch, "_foreach_copy_", None)
    if foreach_copy is not None:
        foreach_copy(destinations, sources)
        return
    for d, s in zip(destinations, sources):
        d.copy_(s)


def _buffer_groups(buffers):
    """The buffers by dtype and device, in registration order within each."""
    groups = {}
    for b in buffers:
        groups.setdefault((b.dtype, b.device), []).append(b)
    return list(groups.values())


def broadcast_buffers(buffers, root, prefix, process_set):
    """Gives every rank ``root``'s (a global rank) ``buffers``."""
    # As PyTorch DDP coalesces them: one broadcast per dtype and device, not one per buffer
    # (ResNet-50 has 161, each a launch of its own on a GPU).
    pending = []
    for i, group in enumerate(_buffer_groups(buffers)):
        # A lone buffer is broadcast into itself: the broadcast receives a non-contiguous one
        # into a copy and copies it back, where a reshape's copy would be received and dropped.
        flat = group[0] if len(group) == 1 else torch.cat([b.reshape(-1) for b in group])
        h = broadcast_async_(flat, root, name="%s.buffers.%d" % (prefix, i),
                             process_set=process_set)
        pending.append((h, flat, group))
    _synchronize_all([h for h, _, _ in pending])
    for _, flat, group in pending:
        if len(group) > 1:
            _copy_all(group, flat_views(flat, group))


def hand_over_buffers(buffers, source, prefix, process_set):
    """Gives every rank the ``buffers`` of ``source`` (a rank of the set) while some ranks have
    joined: a broadcast cannot run beside joined ranks, so the source hands its buffers over
    through a sum to which everyone else adds zeros."""
    mine = process_set.rank() == source
    contributions = [b if mine else torch.zeros_like(b) for b in buffers]
    h = grouped_allreduce_async_(contributions, name="%s.buffers" % prefix, op=Sum,
                                 process_set=process_set)
    synchronize(h)
    for b, c in zip(buffers, contributions):
        if c is not b:
            b.copy_(c)
