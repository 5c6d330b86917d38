"""reducescatter and grouped reducescatter: each rank's share of a reduction, differentiable."""

import torch

from gradsync import _core
from gradsync.torch.allgather import grouped_allgather
from gradsync.torch.allreduce import _check_one_device, _group_wire_op
from gradsync.torch.compression import Compression
from gradsync.torch.handles import _register, synchronize
from gradsync.torch.process_sets import _id_of, global_process_set
from gradsync.torch.wire import (_CORE_OPS, _DTYPES, Average, Sum, _check, _device, _op_of,
                                 _output_tensor, _ready_stream, _to_wire)


def _reducescatter_async(tensors, name, op, prescale_factor, postscale_factor, process_set,
                         prefix):
    if not tensors:
        return [], ()
    for t in tensors:
        _check(t)
    # The runtime takes one device (the first member's) and one op for the whole group: a member
    # on another device, or of a dtype that would need another op, is refused.
    _check_one_device(tensors)
    op = _group_wire_op(tensors, op)
    wires = [_to_wire(t) for t in tensors]
    kind, index = _device(wires[0])
    names = [] if name is None else ["%s.%s.%d" % (prefix, name, i) for i in range(len(tensors))]
    handles = _core.reducescatter([w.data_ptr() for w in wires], [_DTYPES[w.dtype] for w in wires],
                                  [list(w.shape) for w in wires], kind, index, names,
                                  _CORE_OPS[op], prescale_factor, postscale_factor,
                                  _id_of(process_set), _ready_stream(wires[0]), (tensors, wires))
    return handles, (tensors, wires)


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    """Starts reducing ``tensor`` and leaving each rank its share of the rows; returns a handle."""
    op = _op_of(op, None)
    handles, keep = _reducescatter_async([tensor], None if name is None else name, op,
                                         prescale_factor, postscale_factor, process_set,
                                         "reducescatter")
    return _register(handles, keep, lambda: _output_tensor(handles[0], tensor.dtype))


def _gathered_gradients(grads, ctx):
    """Horovod's gradient of a reducescatter, for each tensor of a group: every rank's share of
    the output gradient gathered back, times the scale factors, and times the set's size for a
    sum."""
    factor = ctx.scale * (ctx.process_set.size() if ctx.op == Sum else 1)
    scaled = [g.contiguous() * factor if factor != 1 else g.contiguous() for g in grads]
    return grouped_allgather(scaled, process_set=ctx.process_set)


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.op = op
        ctx.scale = prescale_factor * postscale_factor
        ctx.process_set = process_set
        return synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor,
                                               postscale_factor))

    @staticmethod
    def backward(ctx, grad_output):
        return _gathered_gradients([grad_output], ctx)[0], None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Returns this rank's share of ``tensor`` reduced over the ranks; differentiable."""
    op = _op_of(op, None)
    compressed, ctx = compression.compress(tensor)
    reduced = _Reducescatter.apply(compressed, name, op, process_set, prescale_factor,
                                   postscale_factor)
    return compression.decompress(reduced, ctx)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    op = _op_of(op, None)
    handles, keep = _reducescatter_async(list(tensors), name, op, prescale_factor,
                                         postscale_factor, process_set, "grouped_reducescatter")
    return _register(handles, keep,
                     lambda: [_output_tensor(h, t.dtype) for h, t in zip(handles, tensors)])


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):
        ctx.op = op
        ctx.scale = prescale_factor * postscale_factor
        ctx.process_set = process_set
        return tuple(synchronize(grouped_reducescatter_async(
            list(tensors), name, op, process_set, prescale_factor, postscale_factor)))

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, None, None, None) + tuple(_gathered_gradients(grads, ctx))


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """reducescatter of each tensor, negotiated as one group; differentiable as reducescatter."""
    op = _op_of(op, None)
    if not tensors:
        return []
    compressed, ctxs = zip(*[compression.compress(t) for t in tensors])
    reduced = _GroupedReducescatter.apply(name, op, process_set, prescale_factor,
                                          postscale_factor, *compressed)
    return [compression.decompress(t, c) for t, c in zip(reduced, ctxs)]
