"""Gradient compression for allreduce (Horovod's horovod.torch.compression)."""
import torch


class Compressor:
    """Interface for compressing and decompressing a tensor."""

    @staticmethod
    def compress(tensor):
        """Returns (compressed tensor, context needed to decompress it)."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        """Returns the tensor decompressed with `ctx`."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    """Floating-point tensors travel as float16; others are left alone."""

    @staticmethod
    def compress(tensor):
        compressed = tensor
        if tensor.dtype.is_floating_point:
            compressed = tensor.type(torch.float16)
        return compressed, tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        dtype = ctx
        if dtype.is_floating_point:
            return tensor.type(dtype)
        return tensor


class Compression:
    """The available compressors: Compression.none, Compression.fp16."""

    none = NoneCompressor
    fp16 = FP16Compressor
