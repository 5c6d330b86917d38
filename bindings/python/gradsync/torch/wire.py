"""How torch tensors and Horovod's arguments become the runtime's: dtypes, devices, reduce ops.

int16 and bool tensors, which the runtime does not carry, travel as int32 and uint8 copies (bool
sums and maxima are logical or, minima and products logical and); non-contiguous ones (a
channels_last model's, a transposed view) as contiguous copies. An in-place call copies the result
back into its tensor.
"""

import torch

# Horovod's reduce op values.
Average = 0
Sum = 1
Adasum = 2
Min = 3
Max = 4
Product = 5

# Horovod's op -> the runtime's ReduceOp.
_CORE_OPS = {Sum: 0, Average: 1, Min: 2, Max: 3, Product: 4, Adasum: 5}

# torch dtype -> the runtime's DataType.
_DTYPES = {torch.uint8: 0, torch.int8: 1, torch.int32: 2, torch.int64: 3, torch.float16: 4,
           torch.bfloat16: 5, torch.float32: 6, torch.float64: 7}
# dtypes the runtime lacks, and the dtype each travels as.
_WIRE_DTYPES = {torch.int16: torch.int32, torch.bool: torch.uint8}

_DEVICE_CPU, _DEVICE_CUDA = 0, 1


def _op_of(op, average, default=Average):
    """Horovod's rule: ``average`` is the legacy flag, and ``op`` supersedes it."""
    if op is not None and average is not None:
        raise ValueError("The op parameter supersedes average. Please provide only one of them.")
    if average is not None:
        op = Average if average else Sum
    if op is None:
        op = default
    if op not in _CORE_OPS:
        raise ValueError("unknown reduce op %r" % (op,))
    return op


def _name(prefix, name):
    return "" if name is None else "%s.%s" % (prefix, name)


def _device(tensor):
    if tensor.device.type == "cpu":
        return _DEVICE_CPU, -1
    if tensor.device.type == "cuda":
        return _DEVICE_CUDA, tensor.device.index if tensor.device.index is not None else 0
    raise ValueError("tensors on %s are not supported by gradsync" % tensor.device)


# cudaStreamLegacy, the handle of CUDA's legacy default stream: PyTorch reports that stream as 0,
# which the runtime reads as "nothing to wait for" (a host tensor, an input ready now).
_CUDA_STREAM_LEGACY = 1


# The current stream's handle as an integer, where this PyTorch has the call (CUDA builds since
# 1.x; Triton reads it so): torch.cuda.current_stream builds a Stream object in Python at each
# call, once per gradient in the hooks.
try:
    from torch._C import _cuda_getCurrentRawStream as _raw_current_stream
except ImportError:
    _raw_current_stream = None


def _stream_of(device):
    """The stream current on CUDA ``device``, as the cudaStream_t the runtime takes (an integer,
    never 0)."""
    if _raw_current_stream is not None:
        index = device.index if device.index is not None else torch.cuda.current_device()
        return _raw_current_stream(index) or _CUDA_STREAM_LEGACY
    return torch.cuda.current_stream(device).cuda_stream or _CUDA_STREAM_LEGACY


def _note_producer(streams, device):
    """Adds the stream current on CUDA ``device`` to ``streams`` (handles from ``_stream_of``)
    unless it is there: the streams that made a bucket's gradients."""
    stream = _stream_of(device)
    if stream not in streams:
        streams.append(stream)


def _wait_for_streams(streams, tensor):
    """Makes the current stream of a CUDA ``tensor``'s device wait for each of ``streams`` other
    than itself, so that work given to it next follows every one of them; returns its handle
    (None for a host tensor, which has no stream)."""
    if not tensor.is_cuda:
        return None
    device = tensor.device
    current = _stream_of(device)
    for other in streams:
        if other != current:
            torch.cuda.current_stream(device).wait_stream(_torch_stream(other, device))
    return current


def _release_after_consumer(tensor, made_on):
    """Lets go of a CUDA ``tensor`` gradsync made while ``made_on`` (from ``_stream_of``) was
    current, once the current stream was ordered after the operations that read or wrote it. The
    caching allocator hands its memory out again on ``made_on`` at once: where that is another
    stream, which the current one's work has not been ordered before, the allocator is told to
    wait for the current stream first."""
    if made_on is not None and made_on != _stream_of(tensor.device):
        tensor.record_stream(torch.cuda.current_stream(tensor.device))


def _release_kept_after_consumer(kept, producer):
    """``_release_after_consumer`` for each CUDA tensor in ``kept`` (a tensor, or tuples and lists
    of them) that an operation whose inputs were ready on ``producer`` read or wrote: called where
    the current stream, just ordered after the operation, is another one. The caller's tensors
    were made on ``producer``, or the caller told the allocator about it; gradsync's stream, which
    may still be writing them, is ordered before ``producer``'s work only through a consumer on
    ``producer``."""
    if isinstance(kept, torch.Tensor):
        if kept.is_cuda:
            _release_after_consumer(kept, producer)
    elif isinstance(kept, (tuple, list)):
        for item in kept:
            _release_kept_after_consumer(item, producer)


def _torch_stream(raw, device):
    """The torch stream of a handle from ``_stream_of``: the device's default stream for
    cudaStreamLegacy, which ``torch.cuda.ExternalStream`` cannot wrap (PyTorch reads an odd
    stream id as one of its own pools' streams)."""
    if raw == _CUDA_STREAM_LEGACY:
        return torch.cuda.default_stream(device)
    return torch.cuda.ExternalStream(raw, device=device)


def _ready_stream(tensor):
    """The producer of a CUDA tensor, for the runtime to wait on: the stream current now on its
    device, where the kernels that made it may still be queued. gradsync's communication stream
    waits for that stream on the device, so the host never waits for the producer, as PyTorch
    DDP's hooks never do. 0 for a host tensor."""
    if tensor.device.type != "cuda":
        return 0
    return _stream_of(tensor.device)


def _consumer(tensor):
    """Where a stream-ordered handle's result is consumed: the tensor's CUDA device, or None for a
    host tensor (its handle is waited for on the host)."""
    return tensor.device if tensor.device.type == "cuda" else None


def _check(tensor):
    if not isinstance(tensor, torch.Tensor):
        raise ValueError("expected a torch.Tensor, got %s" % type(tensor).__name__)
    if tensor.dtype not in _DTYPES and tensor.dtype not in _WIRE_DTYPES:
        raise ValueError("Tensor type %s is not supported." % tensor.type())
    if tensor.is_sparse:
        raise ValueError("sparse tensors are not supported: densify them (sparse_as_dense=True)")


def _check_in_place(tensor):
    """``_check`` for a tensor an in-place collective writes its result into: one whose elements
    share memory (an expanded tensor) is refused before anything is enqueued, as PyTorch's own
    in-place ops refuse it, since its result could not be copied back."""
    _check(tensor)
    if not tensor.is_contiguous() and any(stride == 0 and extent > 1 for stride, extent
                                          in zip(tensor.stride(), tensor.shape)):
        raise ValueError("an in-place collective cannot write into a tensor whose elements share "
                         "memory (an expanded one): clone() it first")


def _args(tensor):
    """The runtime's view of a contiguous tensor of a dtype it carries."""
    kind, index = _device(tensor)
    return tensor.data_ptr(), _DTYPES[tensor.dtype], list(tensor.shape), kind, index


def _to_wire(tensor):
    """The tensor the runtime sees: ``tensor`` itself, or a contiguous copy in a carried dtype."""
    wire = _WIRE_DTYPES.get(tensor.dtype)
    if wire is not None:
        return tensor.to(wire).contiguous()
    return tensor if tensor.is_contiguous() else tensor.contiguous()


def _wire_op(dtype, op):
    if dtype != torch.bool:
        return op
    if op in (Sum, Max):
        return Max
    if op in (Min, Product):
        return Min
    raise ValueError("op=%s is not defined for bool tensors; use Sum (or) or Min (and)"
                     % ("Adasum" if op == Adasum else "Average"))


def _output_tensor(h, dtype):
    """A collective's allocated output as a tensor of ``dtype`` that shares its memory."""
    shape = h.output_shape()
    wire = _WIRE_DTYPES.get(dtype, dtype)
    buffer = h.output
    device = "cpu" if buffer is None or buffer.device < 0 else "cuda:%d" % buffer.device
    if buffer is None or buffer.nbytes == 0:
        result = torch.empty(shape, dtype=wire, device=device)
    elif device == "cpu":
        result = torch.frombuffer(buffer, dtype=wire).reshape(shape)
    else:
        # The tensor holds the buffer (its __cuda_array_interface__) alive, bytes first.
        result = torch.as_tensor(buffer, device=device).view(wire).reshape(shape)
    return result if wire == dtype else result.to(dtype)
