"""``horovod.torch``'s API over gradsync: ``import gradsync.torch as hvd`` runs Horovod scripts.

CUDA tensors go through the device data plane (NCCL, or MPI staged through host memory) in a
build with CUDA, and their outputs stay on their device.
"""

from gradsync import GradsyncError, GradsyncInternalError, GradsyncValueError
from gradsync.torch.basics import (ccl_built, cross_rank, cross_size, cuda_built, ddl_built,
                                   gloo_built, gloo_enabled, gpu_device, init,
                                   is_homogeneous,
                                   is_initialized, local_rank, local_size, mpi_built,
                                   mpi_enabled, mpi_threads_supported, nccl_built, rank,
                                   rocm_built, shutdown, size, start_timeline, stop_timeline)
from gradsync.torch.compression import Compression
from gradsync.torch.ddp import DistributedDataParallel
from gradsync.torch.functions import (allgather_object, broadcast_object,
                                      broadcast_optimizer_state, broadcast_parameters)
from gradsync.torch.mpi_ops import (Adasum, Average, HorovodInternalError, Max, Min, Product, Sum,
                                    allgather, allgather_async, allreduce, allreduce_,
                                    allreduce_async, allreduce_async_, alltoall, alltoall_async,
                                    barrier, broadcast, broadcast_, broadcast_async,
                                    broadcast_async_, grouped_allgather, grouped_allgather_async,
                                    grouped_allreduce, grouped_allreduce_, grouped_allreduce_async,
                                    grouped_allreduce_async_, grouped_reducescatter,
                                    grouped_reducescatter_async, join, poll, reducescatter,
                                    reducescatter_async, sparse_allreduce_async, synchronize)
from gradsync.torch.optimizer import DistributedOptimizer
from gradsync.torch.process_sets import (ProcessSet, add_process_set, global_process_set,
                                         remove_process_set)
from gradsync.torch.sync_batch_norm import SyncBatchNorm
from gradsync.torch import elastic  # noqa: E402  (it uses the modules above)
from gradsync.torch import process_group  # noqa: E402  (registers the torch.distributed backend)
