"""The collectives of ``horovod.torch`` over gradsync's runtime: same names, arguments and defaults.

Scripts import these from ``horovod.torch.mpi_ops`` too, so this module gathers them in one place;
each collective lives in its own module. Asynchronous calls return an integer handle for ``poll``
and ``synchronize``. Tensors reach the runtime as their data pointers, so inputs and in-place
outputs are never copied; tensors are kept alive until their handle is synchronized.
"""

from gradsync import GradsyncInternalError, _core
from gradsync.torch.allgather import (allgather, allgather_async, grouped_allgather,
                                      grouped_allgather_async)
from gradsync.torch.allreduce import (allreduce, allreduce_, allreduce_async, allreduce_async_,
                                      grouped_allreduce, grouped_allreduce_,
                                      grouped_allreduce_async, grouped_allreduce_async_)
from gradsync.torch.alltoall import alltoall, alltoall_async
from gradsync.torch.broadcast import broadcast, broadcast_, broadcast_async, broadcast_async_
from gradsync.torch.handles import poll, synchronize
from gradsync.torch.process_sets import _id_of, global_process_set
from gradsync.torch.reducescatter import (grouped_reducescatter, grouped_reducescatter_async,
                                          reducescatter, reducescatter_async)
from gradsync.torch.sparse import sparse_allreduce_async
from gradsync.torch.wire import Adasum, Average, Max, Min, Product, Sum

__all__ = [
    "Adasum", "Average", "HorovodInternalError", "Max", "Min", "Product", "Sum", "allgather",
    "allgather_async", "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "alltoall", "alltoall_async", "barrier", "broadcast", "broadcast_", "broadcast_async",
    "broadcast_async_", "grouped_allgather", "grouped_allgather_async", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "grouped_reducescatter", "grouped_reducescatter_async", "join", "poll", "reducescatter",
    "reducescatter_async", "sparse_allreduce_async", "synchronize",
]

def join(device=-1):
    """Marks this rank as out of data until every rank has joined; returns the last to join.

    Meanwhile this rank takes part in the others' allreduces with zeros, so they neither hang nor
    get wrong sums (Average still divides by every rank). ``device`` is accepted for Horovod's
    signature; the host runtime ignores it.
    """
    del device
    return _core.join()


def barrier(process_set=global_process_set):
    """Returns once every rank of the set has entered the barrier."""
    _core.barrier(_id_of(process_set)).wait()


HorovodInternalError = GradsyncInternalError
