"""Gradient compression's shape, for every framework API (Horovod's Compression.none and
Compression.fp16): a framework gives how to tell a floating-point tensor and how to cast one."""


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


def fp16_compressor(is_floating, cast, float16):
    """The Compressor under which floating-point tensors travel as float16 and others are left
    alone: `is_floating(dtype)`, `cast(tensor, dtype)` and the framework's `float16` dtype."""

    class FP16Compressor(Compressor):
        """Floating-point tensors travel as float16; others are left alone."""

        @staticmethod
        def compress(tensor):
            compressed = tensor
            if is_floating(tensor.dtype):
                compressed = cast(tensor, float16)
            return compressed, tensor.dtype

        @staticmethod
        def decompress(tensor, ctx):
            if is_floating(ctx):
                return cast(tensor, ctx)
            return tensor

    return FP16Compressor
