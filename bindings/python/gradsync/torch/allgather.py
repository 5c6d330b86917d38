"""allgather and grouped allgather: every rank's rows concatenated, differentiable."""

import torch

from gradsync import _core
from gradsync.torch.allreduce import allreduce
from gradsync.torch.handles import _register, synchronize
from gradsync.torch.process_sets import _id_of, global_process_set
from gradsync.torch.wire import (_DTYPES, Sum, _args, _check, _device, _name, _output_tensor,
                                 _ready_stream, _to_wire)


def _allgather_async(tensor, name, process_set):
    _check(tensor)
    wire = _to_wire(tensor)
    h = _core.allgather(*_args(wire), _name("allgather", name), _id_of(process_set),
                        _ready_stream(wire))
    return _register([h], (tensor, wire), lambda: _output_tensor(h, tensor.dtype))


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts concatenating every rank's ``tensor`` along the first dimension; returns a handle."""
    return _allgather_async(tensor, name, process_set)


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.rows = tensor.shape[0] if tensor.dim() > 0 else 1
        ctx.process_set = process_set
        return synchronize(allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        # Every rank's output feeds every rank's loss: sum the gradients, keep this rank's rows.
        grad = allreduce(grad_output, op=Sum, process_set=ctx.process_set)
        rows = allgather(torch.tensor([ctx.rows], dtype=torch.int64),
                         process_set=ctx.process_set)
        me = ctx.process_set.rank()
        offset = int(rows[:me].sum()) if me > 0 else 0
        return grad.narrow(0, offset, ctx.rows), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Returns every rank's ``tensor`` concatenated along the first dimension; differentiable."""
    result = _Allgather.apply(tensor, name, process_set)
    return result


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    if not tensors:
        return _register([], (), lambda: [])
    for t in tensors:
        _check(t)
    wires = [_to_wire(t) for t in tensors]
    kind, index = _device(wires[0])
    names = [] if name is None else ["grouped_allgather.%s.%d" % (name, i)
                                     for i in range(len(tensors))]
    handles = _core.grouped_allgather([w.data_ptr() for w in wires],
                                      [_DTYPES[w.dtype] for w in wires],
                                      [list(w.shape) for w in wires], kind, index, names,
                                      _id_of(process_set), _ready_stream(wires[0]))
    return _register(handles, (tensors, wires),
                     lambda: [_output_tensor(h, t.dtype) for h, t in zip(handles, tensors)])


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    return synchronize(grouped_allgather_async(tensors, name, process_set))
