"""Horovod's MXNet API on Ringmaster: `import ringmaster.mxnet as hvd` in place of
`import horovod.mxnet as hvd`. Run the script with
`ringmaster local --np N -- $(scripts/mxnet-venv.sh) train.py` (or `ringmaster submit`); see
docs/mxnet.md for the API against Horovod's and what differs."""
from ringmaster.basics import (ccl_built, cross_rank, cross_size, cuda_built,  # noqa: F401
                               ddl_built, gloo_built, gloo_enabled,
                               is_homogeneous, is_initialized, local_rank, local_size, mpi_built,
                               mpi_enabled, mpi_threads_supported, nccl_built, rank, rocm_built,
                               shutdown, size, start_timeline, stop_timeline)
from ringmaster.common.objects import allgather_object, broadcast_object  # noqa: F401
from ringmaster.common.process_sets import init_framework as init  # noqa: F401
from ringmaster.exceptions import HorovodInternalError  # noqa: F401
from ringmaster.mxnet.compression import Compression  # noqa: F401
from ringmaster.mxnet.mpi_ops import (Adasum, Average, Max, Min, Product, Sum,  # noqa: F401
                                      ProcessSet, add_process_set, allgather, allreduce,
                                      allreduce_, alltoall, broadcast, broadcast_,
                                      global_process_set, grouped_allgather, grouped_allreduce,
                                      grouped_allreduce_, grouped_reducescatter,
                                      handle_average_backwards_compatibility, reducescatter,
                                      remove_process_set)
from ringmaster.mxnet.trainer import (DistributedOptimizer, DistributedTrainer,  # noqa: F401
                                      broadcast_parameters)
