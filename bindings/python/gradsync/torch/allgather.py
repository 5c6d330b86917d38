"""allgather and grouped allgather: every rank's rows concatenated, differentiable."""

import torch

from gradsync import _core
from gradsync.torch.allreduce import _check_one_device, grouped_allreduce
from gradsync.torch.handles import _register, synchronize
from gradsync.torch.process_sets import _id_of, global_process_set
from gradsync.torch.wire import (_DTYPES, Average, _args, _check, _device, _name, _output_tensor,
                                 _ready_stream, _to_wire)


def _start_allgather(tensor, wire_name, process_set):
    """The runtime's allgather of ``tensor`` under ``wire_name`` ("" to generate one), and the
    tensor it reads, to keep alive until the handle is synchronized."""
    _check(tensor)
    wire = _to_wire(tensor)
    h = _core.allgather(*_args(wire), wire_name, _id_of(process_set), _ready_stream(wire),
                        (tensor, wire))
    return h, wire


def _allgather_async(tensor, name, process_set):
    h, wire = _start_allgather(tensor, _name("allgather", name), process_set)
    return _register([h], (tensor, wire), lambda: _output_tensor(h, tensor.dtype))


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts concatenating every rank's ``tensor`` along the first dimension; returns a handle."""
    return _allgather_async(tensor, name, process_set)


def _own_rows(grads, rows, process_set):
    """Horovod's gradient of an allgather, for each tensor of a group: every rank's output
    gradient averaged over the set, then this rank's rows of it."""
    averaged = grouped_allreduce([g.contiguous() for g in grads], op=Average,
                                 process_set=process_set)
    counts = grouped_allgather([torch.tensor([r], dtype=torch.int64) for r in rows],
                               process_set=process_set)
    me = process_set.rank()
    return [grad.narrow(0, int(count[:me].sum()) if me > 0 else 0, r)
            for grad, count, r in zip(averaged, counts, rows)]


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.rows = tensor.shape[0] if tensor.dim() > 0 else 1
        ctx.process_set = process_set
        return synchronize(allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        return _own_rows([grad_output], [ctx.rows], ctx.process_set)[0], None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Returns every rank's ``tensor`` concatenated along the first dimension; differentiable
    (the gradient is Horovod's: the output's gradient averaged over the ranks, this rank's rows)."""
    result = _Allgather.apply(tensor, name, process_set)
    return result


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.rows = [t.shape[0] if t.dim() > 0 else 1 for t in tensors]
        ctx.process_set = process_set
        return tuple(synchronize(grouped_allgather_async(list(tensors), name, process_set)))

    @staticmethod
    def backward(ctx, *grads):
        return (None, None) + tuple(_own_rows(grads, ctx.rows, ctx.process_set))


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    if not tensors:
        return _register([], (), lambda: [])
    for t in tensors:
        _check(t)
    # The group's device is its first member's: the others must share it.
    _check_one_device(tensors)
    wires = [_to_wire(t) for t in tensors]
    kind, index = _device(wires[0])
    names = [] if name is None else ["grouped_allgather.%s.%d" % (name, i)
                                     for i in range(len(tensors))]
    handles = _core.grouped_allgather([w.data_ptr() for w in wires],
                                      [_DTYPES[w.dtype] for w in wires],
                                      [list(w.shape) for w in wires], kind, index, names,
                                      _id_of(process_set), _ready_stream(wires[0]),
                                      (tensors, wires))
    return _register(handles, (tensors, wires),
                     lambda: [_output_tensor(h, t.dtype) for h, t in zip(handles, tensors)])


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """allgather of each tensor, negotiated as one group; differentiable as allgather."""
    if not tensors:
        return []
    return list(_GroupedAllgather.apply(name, process_set, *tensors))
