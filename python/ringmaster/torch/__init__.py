"""Horovod's PyTorch API on Ringmaster: `import ringmaster.torch as hvd` in place of
`import horovod.torch as hvd`. Run the script with `ringmaster local --np N -- python3 train.py`
(or `ringmaster submit`); see docs/pytorch.md for what differs from Horovod."""
from ringmaster.basics import (ccl_built, cross_rank, cross_size, cuda_built, ddl_built, gloo_built,
                               gloo_enabled, is_homogeneous, is_initialized,
                               local_rank, local_size, mpi_built, mpi_enabled,
                               mpi_threads_supported, nccl_built, rank, rocm_built,
                               shutdown as _shutdown, size, start_timeline, stop_timeline)
from ringmaster.common.process_sets import init_framework as init  # noqa: F401
from ringmaster.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from ringmaster.torch.compression import Compression
from ringmaster.torch.functions import (allgather_object, broadcast_object,
                                        broadcast_optimizer_state, broadcast_parameters)
from ringmaster.torch.mpi_ops import (Adasum, Average, Max, Min, Product, Sum, ProcessSet,
                                      add_process_set, allgather, allgather_async, allreduce,
                                      allreduce_, allreduce_async, allreduce_async_, alltoall,
                                      alltoall_async, barrier, broadcast, broadcast_,
                                      broadcast_async, broadcast_async_, global_process_set,
                                      grouped_allgather, grouped_allgather_async,
                                      grouped_allreduce, grouped_allreduce_,
                                      grouped_allreduce_async, grouped_allreduce_async_,
                                      grouped_reducescatter, grouped_reducescatter_async,
                                      handle_average_backwards_compatibility, join, poll,
                                      reducescatter, reducescatter_async, remove_process_set,
                                      sparse_allreduce_async, synchronize)
from ringmaster.torch import mpi_ops as _mpi_ops
from ringmaster.torch.optimizer import DistributedOptimizer




def shutdown():
    """Ends this process's use of Ringmaster. Handles of operations still in flight become
    unknown (their tensors stay referenced: the daemon may still write them)."""
    _mpi_ops._forget_handles()
    _shutdown()


from ringmaster.torch import elastic  # noqa: E402
