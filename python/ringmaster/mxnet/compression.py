"""Gradient compression for allreduce (Horovod's horovod.mxnet.compression)."""
import numpy as np

from ringmaster.common.compression import (Compressor, NoneCompressor,  # noqa: F401
                                           fp16_compressor)

FP16Compressor = fp16_compressor(lambda dtype: np.issubdtype(np.dtype(dtype), np.floating),
                                 lambda tensor, dtype: tensor.astype(dtype, copy=False),
                                 np.float16)


class Compression:
    """The available compressors: Compression.none, Compression.fp16."""

    none = NoneCompressor
    fp16 = FP16Compressor
