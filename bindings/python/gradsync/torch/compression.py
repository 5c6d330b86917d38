"""Gradient compression applied around a collective: Horovod's none and fp16, and bf16."""

import torch


class Compressor:
    """Turns a tensor into what is sent, and back."""

    @staticmethod
    def compress(tensor):
        """Returns the tensor to send and the context decompress needs."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class _CastCompressor(Compressor):
    """Floating tensors travel as ``wire_dtype`` and come back in their own dtype."""

    wire_dtype = None

    @classmethod
    def compress(cls, tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != cls.wire_dtype:
            return tensor.type(cls.wire_dtype), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.type(ctx)


class FP16Compressor(_CastCompressor):
    wire_dtype = torch.float16


class BF16Compressor(_CastCompressor):
    """bfloat16 keeps float32's range, so large gradients do not overflow as they can in fp16."""

    wire_dtype = torch.bfloat16


class Compression:
    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor


def compression_of_comm_hook(hook):
    """The compression that does what one of PyTorch DDP's built-in communication hooks does, for
    ``DistributedDataParallel.register_comm_hook``; None for any other hook."""
    if not torch.distributed.is_available():
        return None
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    for name, compression in (("allreduce_hook", Compression.none),
                              ("fp16_compress_hook", Compression.fp16),
                              ("bf16_compress_hook", Compression.bf16)):
        if hook is getattr(default_hooks, name, None):
            return compression
    return None
