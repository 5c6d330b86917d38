"""PowerSGD (Vogels, Karimireddy and Jaggi, 2019) as communication hooks of gradsync's
DistributedDataParallel, with the hyperparameters, state and results of PyTorch DDP's
``powerSGD_hook`` and ``batched_powerSGD_hook``.

Each gradient matrix M of a bucket (a gradient viewed as rows by the rest) worth compressing is
sent as two thin matrices: P = M Q summed over the ranks and orthogonalized, then Q = M^T P
averaged, and M is replaced by P Q^T. Vectors, and matrices whose P and Q would not be
``min_compression_rate`` times smaller, are averaged as they are, in one allreduce. The P of
every matrix of a bucket travels as one allreduce and its Q as one more; the first starts with
the vectors' allreduce as the hook is called, the second from the first's completion, neither
waited for on the host before the end of backward. With error feedback each rank adds what the
last compression lost of its gradient before compressing; with warm start, each Q starts from the
last step's. Until ``start_powerSGD_iter`` steps have run the buckets are averaged uncompressed.

``register_comm_hook`` also takes PyTorch's own hooks and ``PowerSGDState`` and runs them as
these: the state's fields are read and written as PyTorch's hooks do, so a script's state (and a
checkpoint of it) carries over.

Thread safety: a state serves one wrapper, whose hooks run on the thread of its backward.
"""

import logging
import math
from collections import OrderedDict

import torch

from gradsync.torch.comm_hooks import allreduce_future
from gradsync.torch.ddp_buckets import flat_views
from gradsync.torch.wire import Average, Sum

_log = logging.getLogger(__name__)


class PowerSGDState:
    """PowerSGD's hyperparameters and its state between steps, as PyTorch's ``PowerSGDState``:
    the same arguments, defaults and fields. ``process_group`` must be None: the wrapper's
    ``process_set`` is the one the hooks reduce over."""

    def __init__(self, process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=1000,
                 min_compression_rate=2, use_error_feedback=True, warm_start=True,
                 orthogonalization_epsilon=0, random_seed=0,
                 compression_stats_logging_frequency=10000, batch_tensors_with_same_shape=False):
        if process_group is not None:
            raise ValueError("gradsync's PowerSGDState takes no process group: the hooks reduce "
                             "over the DistributedDataParallel wrapper's process_set")
        if (use_error_feedback or warm_start) and start_powerSGD_iter <= 1:
            # As PyTorch's: the first steps' buckets are averaged uncompressed.
            raise ValueError("start_powerSGD_iter must be above 1 with use_error_feedback or "
                             "warm_start")
        import numpy  # PyTorch's state draws Q's seeds from numpy's generator; so does this one
        self.process_group = None
        self.matrix_approximation_rank = matrix_approximation_rank
        self.start_powerSGD_iter = start_powerSGD_iter
        self.min_compression_rate = min_compression_rate
        self.use_error_feedback = use_error_feedback
        self.warm_start = warm_start
        self.orthogonalization_epsilon = orthogonalization_epsilon
        self.batch_tensors_with_same_shape = batch_tensors_with_same_shape
        self.rng = numpy.random.RandomState(random_seed)
        self.error_dict = {}  # bucket index -> what the last compression lost of its buffer
        self.p_memory_dict = {}  # bucket index -> its Ps, flat
        self.q_memory_dict = {}  # bucket index -> its Qs, flat
        self.iter = 0
        self.total_numel_before_compression = 0
        self.total_numel_after_compression = 0
        self.compression_stats_logging_frequency = max(1, compression_stats_logging_frequency)
        self.next_stats_report = 0

    def maybe_increase_iter(self, bucket):
        """Counts a step when its last bucket is reduced."""
        if bucket.is_last():
            self.iter += 1
            if self.iter == self.start_powerSGD_iter:
                _log.info("PowerSGD compresses from step %d on", self.iter)

    def compression_stats(self):
        """(elements before / after, elements before, elements after), over every compressed
        step so far."""
        after = self.total_numel_after_compression
        before = self.total_numel_before_compression
        return (before / after if after > 0 else 0, before, after)


def _report_stats(state, bucket):
    if bucket.is_last() and state.iter >= state.next_stats_report:
        rate, before, after = state.compression_stats()
        _log.info("PowerSGD at step %d: %d elements before compression, %d after (rate %.3g)",
                  state.iter, before, after, rate)
        state.next_stats_report = state.iter + state.compression_stats_logging_frequency


def _orthogonalize(batch, epsilon):
    """Makes the columns of each matrix of ``batch`` (b x n x r, r <= n) orthonormal, in place:
    Gram-Schmidt for one or two columns and for half precision (which QR does not take), QR
    otherwise."""
    rank = batch.shape[2]
    if rank > 2 and batch.dtype not in (torch.float16, torch.bfloat16):
        batch.copy_(torch.linalg.qr(batch).Q)
        return
    for i in range(rank):
        column = batch[:, :, i:i + 1]
        column /= torch.norm(column, dim=1, keepdim=True) + epsilon
        if i + 1 < rank:
            rest = batch[:, :, i + 1:]
            rest -= torch.sum(column * rest, dim=1, keepdim=True) * column


def _fill_random(state, tensors, dtype, device):
    """Fills ``tensors`` with normal values from a seed drawn from the state's generator, drawn
    on the host (so every rank, whatever its device, draws the same)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(state.rng.randint(1_000_000_000))
        for t in tensors:
            t.copy_(torch.randn(*t.shape, device="cpu", dtype=dtype).to(device))


def _done(value):
    future = torch.futures.Future()
    future.set_result(value)
    return future


def _uncompressed(state, bucket):
    state.maybe_increase_iter(bucket)
    return allreduce_future(bucket.buffer())


def _with_error_feedback(state, index, flat):
    """Adds what the bucket's last compression lost to ``flat`` and returns the bucket's error
    tensor holding the sum, from which the compressed result is to be subtracted (``_lost``); None
    without error feedback. The error tensor is reused from step to step: no allocation."""
    if not state.use_error_feedback:
        return None
    error = state.error_dict.get(index)
    if error is None or error.shape != flat.shape:
        error = state.error_dict[index] = flat.detach().clone()
    else:
        flat.add_(error)
        error.copy_(flat)
    return error


def _lost(error, result):
    """The error feedback's error: the sum ``_with_error_feedback`` returned less what the
    compression made of it."""
    if error is not None:
        error.sub_(result)


def _end_of_step(state, bucket, error, compressed):
    """A compressed bucket's last steps: the error feedback's error, the factors dropped without
    warm start, the step counted."""
    _lost(error, compressed)
    if not state.warm_start:
        state.p_memory_dict.clear()
        state.q_memory_dict.clear()
    state.maybe_increase_iter(bucket)


def _settle(result, step, fut):
    """Runs ``step(fut)`` and completes ``result`` with what it returns, or with its error: an
    error raised in a callback would otherwise stay in a future no one reads."""
    try:
        value = step(fut)
    except Exception as error:
        result.set_exception(error)
        return
    if value is not None:
        result.set_result(value)


def _split(state, bucket):
    """The bucket's gradients as (matrices worth compressing, each rows by the rest; the others),
    counting both in the state's statistics."""
    matrices, plain = [], []
    for g in bucket.gradients():
        if g.dim() == 0:
            plain.append(g)
            continue
        matrix = g.view(g.shape[0], -1)
        rows, cols = matrix.shape
        rank = min(rows, cols, state.matrix_approximation_rank)
        state.total_numel_before_compression += rows * cols
        if (rows + cols) * rank * state.min_compression_rate < rows * cols:
            matrices.append(matrix)
            state.total_numel_after_compression += (rows + cols) * rank
        else:
            plain.append(g)
            state.total_numel_after_compression += rows * cols
    return matrices, plain


def _batches(state, matrices):
    """[(count x rows x cols tensor, the matrices it stacks or None for a view of one)]: the
    matrices of one shape side by side, in the order each shape first comes (PyTorch's order, in
    which the Qs draw their random values); stacked with ``batch_tensors_with_same_shape``."""
    by_shape = OrderedDict()
    for m in matrices:
        by_shape.setdefault(tuple(m.shape), []).append(m)
    batches = []
    for group in by_shape.values():
        if state.batch_tensors_with_same_shape and len(group) > 1:
            batches.append((torch.stack(group), group))
        else:
            batches.extend((m.unsqueeze(0), None) for m in group)
    return batches


def _low_rank_factors(state, index, batches, dtype, device):
    """Each batch's P (count x rows x rank) and Q (count x cols x rank), views into the bucket's
    flat P and Q memories, which are made (Q's random) where the bucket has none to start from."""
    shapes = [(count, rows, cols, min(rows, cols, state.matrix_approximation_rank))
              for (count, rows, cols) in (b.shape for b, _ in batches)]
    fresh = not state.warm_start or index not in state.p_memory_dict
    if fresh:
        p_size = sum(count * rows * rank for count, rows, _, rank in shapes)
        q_size = sum(count * cols * rank for count, _, cols, rank in shapes)
        state.p_memory_dict[index] = torch.empty(p_size, device=device, dtype=dtype)
        state.q_memory_dict[index] = torch.empty(q_size, device=device, dtype=dtype)
    ps, qs, p_at, q_at = [], [], 0, 0
    for count, rows, cols, rank in shapes:
        p_size, q_size = count * rows * rank, count * cols * rank
        ps.append(state.p_memory_dict[index][p_at:p_at + p_size].view(count, rows, rank))
        qs.append(state.q_memory_dict[index][q_at:q_at + q_size].view(count, cols, rank))
        p_at += p_size
        q_at += q_size
    if fresh:
        _fill_random(state, qs, dtype, device)
    return ps, qs


def powerSGD_hook(state, bucket):
    """PowerSGD on each gradient matrix of the bucket (PyTorch's ``powerSGD_hook``)."""
    buffer = bucket.buffer()
    if state.iter < state.start_powerSGD_iter:
        return _uncompressed(state, bucket)
    index = bucket.index()
    error = _with_error_feedback(state, index, buffer)
    matrices, plain = _split(state, bucket)
    _report_stats(state, bucket)
    batches = _batches(state, matrices)
    ps, qs = _low_rank_factors(state, index, batches, buffer.dtype, buffer.device)
    for q in qs:
        _orthogonalize(q, state.orthogonalization_epsilon)
    for (b, _), q, p in zip(batches, qs, ps):
        torch.bmm(b, q, out=p)

    plain_flat = torch.cat([g.reshape(-1) for g in plain]) if plain else None
    plain_done = allreduce_future(plain_flat) if plain else _done(None)
    p_done = allreduce_future(state.p_memory_dict[index], op=Sum) if ps else _done(None)
    result = torch.futures.Future()

    def on_ps(fut):
        fut.value()  # raises the allreduce's error
        for p in ps:
            _orthogonalize(p, state.orthogonalization_epsilon)
        for (b, _), p, q in zip(batches, ps, qs):
            torch.bmm(b.transpose(1, 2), p, out=q)
        q_done = allreduce_future(state.q_memory_dict[index], op=Average) if qs else _done(None)
        q_done.then(lambda f: _settle(result, on_qs, f))

    def on_qs(fut):
        fut.value()
        for p, q, (b, group) in zip(ps, qs, batches):
            torch.bmm(p, q.transpose(1, 2), out=b)
            if group is not None:  # a stacked copy: back into the gradients
                for i, m in enumerate(group):
                    m.copy_(b[i])
        # The vectors' allreduce started first and has most likely finished; chained rather
        # than waited for, so that a bucket of vectors alone never waits inside backward.
        plain_done.then(lambda f: _settle(result, on_plain, f))

    def on_plain(fut):
        fut.value()
        if plain:
            for g, averaged in zip(plain, flat_views(plain_flat, plain)):
                g.copy_(averaged)
        _end_of_step(state, bucket, error, buffer)
        return buffer

    p_done.then(lambda f: _settle(result, on_ps, f))
    return result


def batched_powerSGD_hook(state, bucket):
    """PowerSGD on the whole bucket viewed as one square matrix, padded with zeros (PyTorch's
    ``batched_powerSGD_hook``): fewer, larger products, a coarser approximation."""
    buffer = bucket.buffer()
    if state.iter < state.start_powerSGD_iter:
        return _uncompressed(state, bucket)
    index = bucket.index()
    dtype, device = buffer.dtype, buffer.device
    total = buffer.numel()
    side = math.ceil(math.sqrt(total))
    rank = state.matrix_approximation_rank
    state.total_numel_before_compression += total
    state.total_numel_after_compression += side * rank * 2
    _report_stats(state, bucket)

    padded = torch.zeros(side * side, device=device, dtype=dtype)
    padded[:total].copy_(buffer)
    error = _with_error_feedback(state, index, padded)
    matrix = padded.view(side, side)
    if not state.warm_start or index not in state.p_memory_dict:
        state.p_memory_dict[index] = torch.empty(side, rank, device=device, dtype=dtype)
        state.q_memory_dict[index] = torch.empty(side, rank, device=device, dtype=dtype)
        _fill_random(state, [state.q_memory_dict[index]], dtype, device)
    p, q = state.p_memory_dict[index], state.q_memory_dict[index]
    _orthogonalize(q.unsqueeze(0), state.orthogonalization_epsilon)
    torch.matmul(matrix, q, out=p)
    result = torch.futures.Future()

    def on_p(fut):
        fut.value()
        _orthogonalize(p.unsqueeze(0), state.orthogonalization_epsilon)
        torch.matmul(matrix.t(), p, out=q)
        allreduce_future(q, op=Average).then(lambda f: _settle(result, on_q, f))

    def on_q(fut):
        fut.value()
        torch.matmul(p, q.t(), out=matrix)
        _end_of_step(state, bucket, error, padded)
        buffer.copy_(padded[:total])
        return buffer

    allreduce_future(p, op=Sum).then(lambda f: _settle(result, on_p, f))
    return result
