"""Gradient compression for allreduce (Horovod's horovod.torch.compression)."""
import torch

from ringmaster.common.compression import (Compressor, NoneCompressor,  # noqa: F401
                                           fp16_compressor)

FP16Compressor = fp16_compressor(lambda dtype: dtype.is_floating_point,
                                 lambda tensor, dtype: tensor.type(dtype), torch.float16)


class Compression:
    """The available compressors: Compression.none, Compression.fp16."""

    none = NoneCompressor
    fp16 = FP16Compressor
