"""GradientBatch: parameters' gradients reduced in place through one ``_core.AllreduceBatch``.

Both ``DistributedOptimizer`` and ``DistributedDataParallel`` reduce through it: a backward hook
starts a gradient with two integers (its slot and its memory) and, for a CUDA gradient, the
stream current where backward made it, so the hook never waits for the device; ``finish()`` waits
for every reduction of the step once, or orders the device's current stream after them, as
PyTorch DDP does.

Thread safety: one batch serves one training loop on one thread (its hooks and its finish).
"""

import torch

from gradsync import _core
from gradsync.torch.wire import (_DEVICE_CPU, _DEVICE_CUDA, _DTYPES, _release_after_consumer,
                                 _stream_of)


class GradientBatch:
    """A fixed list of parameters whose gradients are reduced with one op and its scales.

    ``params`` come in the order backward produces their gradients (reverse registration,
    roughly), as the batch wants its list: its buckets then close as backward goes. ``names``
    name each one's reduction and must match across ranks.
    """

    def __init__(self, params, names, op, prescale, postscale, process_set_id):
        devices = [(_DEVICE_CPU, -1) if p.device.type == "cpu" else
                   (_DEVICE_CUDA, p.device.index if p.device.index is not None else 0)
                   for p in params]
        self._batch = _core.AllreduceBatch(
            list(names), [_DTYPES[p.dtype] for p in params], [list(p.shape) for p in params],
            [kind for kind, _ in devices], [index for _, index in devices], op, prescale,
            postscale, process_set_id)
        self._slots = {id(p): (i, p.dtype, p.device.type == "cuda", p.device, p.numel())
                       for i, p in enumerate(params)}
        cuda_devices = {p.device for p in params if p.device.type == "cuda"}
        # With one device, a step's consumer is its current stream; with several, the host.
        self._consumer = next(iter(cuda_devices)) if len(cuda_devices) == 1 else None
        self._in_flight = []  # gradients started since the last finish, kept alive until it
        self._producers = set()  # the streams their CUDA gradients were started from
        # (gradient, fitting copy in flight, the stream its memory came from) to copy back after
        # the wait
        self._refits = []

    @staticmethod
    def carries(p):
        """Whether a parameter's gradient can have a slot: a dtype the runtime carries, on the
        host or a CUDA device."""
        return p.dtype in _DTYPES and p.device.type in ("cpu", "cuda")

    def __contains__(self, p):
        return id(p) in self._slots

    def __len__(self):
        return len(self._slots)

    def in_flight(self):
        """Gradients started since the last ``finish()``."""
        return self._batch.in_flight()

    def caller_reductions(self):
        """Steps whose last bucket the waiting thread reduced itself."""
        return self._batch.caller_reductions()

    def start(self, p, grad):
        """Starts reducing ``grad``, a dense gradient of ``p`` (which has a slot), in place.

        Called from every hook, so it keeps to attribute reads and one crossing into the runtime.
        A gradient that no longer fits the slot (its dtype, device or layout changed since the
        batch was made) is reduced through a fitting copy, written back by ``finish()``: every
        rank reduces the slot the same way whatever its gradient looks like here. One of another
        size raises ValueError before anything starts.
        """
        index, dtype, is_cuda, device, numel = self._slots[id(p)]
        if grad.numel() != numel:
            # The runtime would read and write the slot's size at the gradient's memory.
            raise ValueError("a gradient of shape %s, where the parameter had %d elements when "
                             "the batch was made: a parameter replaced by one of another shape "
                             "needs a new wrapper" % (tuple(grad.shape), numel))
        stream = _stream_of(device) if is_cuda else None
        if (grad.dtype is not dtype or grad.is_cuda is not is_cuda
                or (is_cuda and grad.device != device) or not grad.is_contiguous()):
            fitting = grad.to(device=device, dtype=dtype).contiguous()
            self._refits.append((grad, fitting, stream))
            grad = fitting
        if is_cuda:
            # The kernels that produced the gradient may still be queued on the current stream:
            # the runtime's stream waits for it there, and the hook returns at once.
            self._batch.start(index, grad.data_ptr(), stream)
            self._producers.add(stream)
        else:
            self._batch.start(index, grad.data_ptr())
        self._in_flight.append(grad)

    def finish(self):
        """Completes every reduction started since the last call.

        With one CUDA device the host blocks only until they are launched, and the device's
        current stream waits for them; otherwise the host waits. Raises the runtime's error when
        a reduction failed.
        """
        if not self._in_flight:
            return
        waited = False  # set once the runtime returned: then nothing writes into the step's tensors
        try:
            if self._consumer is not None:
                consumer = _stream_of(self._consumer)
                self._batch.synchronize_stream(consumer)
                waited = True
                if self._producers - {consumer}:
                    # Recorded on the consumer as wire._release_kept_after_consumer does, every
                    # gradient, since which stream each came from is not kept.
                    current = torch.cuda.current_stream(self._consumer)
                    for grad in self._in_flight:
                        if grad.is_cuda:
                            grad.record_stream(current)
            else:
                self._batch.wait()
                waited = True
            for grad, reduced, made_on in self._refits:
                grad.copy_(reduced)
                _release_after_consumer(reduced, made_on)
        finally:
            try:
                if not waited:
                    # Interrupted before the runtime returned (KeyboardInterrupt), or it raised: it
                    # may still write into the gradients and refitted copies dropped below, and
                    # would refuse the next step. A second wait after one that returned is free.
                    try:
                        self._batch.wait()
                    except Exception:  # pylint: disable=broad-except
                        pass  # the interruption, or the first error, is what the caller hears of
            finally:
                self._in_flight = []
                self._producers.clear()
                self._refits = []
