"""sparse_allreduce_async: a sparse gradient reduced as Horovod reduces it, by gathering every
rank's indices and values rather than densifying."""

import torch

from gradsync.torch.allgather import _start_allgather
from gradsync.torch.handles import _register
from gradsync.torch.process_sets import global_process_set
from gradsync.torch.wire import Average, Sum, _name, _output_tensor

# The gathered indices come from valid tensors of one size, so they need no check. PyTorch 2 warns
# at a process's first sparse tensor made without saying whether to check; 1.13 takes no such
# argument.
_UNCHECKED = ({"check_invariants": False}
              if hasattr(torch.sparse, "check_sparse_tensor_invariants") else {})


def sparse_allreduce_async(tensor, name=None, op=Average, process_set=global_process_set):
    """Starts reducing a sparse COO ``tensor`` over the set's ranks; returns a handle.

    Every rank's indices and values are gathered (two allgathers), so ``synchronize`` returns a
    sparse tensor of ``tensor``'s size holding every rank's entries, uncoalesced, with the values
    divided by the set's size for ``op=Average``. As in Horovod, the ranks may hold different
    numbers of entries; only Average and Sum are defined.
    """
    if not tensor.is_sparse:
        raise ValueError("sparse_allreduce_async needs a sparse COO tensor")
    if op not in (Average, Sum):
        raise ValueError("sparse_allreduce_async supports op=Average and op=Sum")
    # Entries are gathered along the first dimension: one row of indices per entry.
    indices = tensor._indices().t().contiguous()
    values = tensor._values().contiguous()
    h_indices, wire_indices = _start_allgather(
        indices, _name("sparse_allreduce", name and name + ".indices"), process_set)
    h_values, wire_values = _start_allgather(
        values, _name("sparse_allreduce", name and name + ".values"), process_set)
    size = tensor.size()
    sparse_dims = tensor.sparse_dim()

    def finish():
        gathered_indices = _output_tensor(h_indices, indices.dtype).reshape(-1, sparse_dims)
        gathered_values = _output_tensor(h_values, values.dtype).reshape(
            (-1,) + tuple(values.shape[1:]))
        if op == Average:
            gathered_values = gathered_values / process_set.size()
        return torch.sparse_coo_tensor(gathered_indices.t(), gathered_values, size,
                                       device=tensor.device, **_UNCHECKED)

    return _register([h_indices, h_values], (tensor, wire_indices, wire_values), finish)
