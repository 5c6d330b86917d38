"""allreduce and grouped allreduce: sync, async, in place, differentiable."""

import functools
import operator

import torch

from gradsync import _core
from gradsync.torch.compression import Compression
from gradsync.torch.handles import _register, synchronize
from gradsync.torch.process_sets import _id_of, global_process_set
from gradsync.torch.wire import (_CORE_OPS, _DEVICE_CPU, _DEVICE_CUDA, _DTYPES, Adasum, Average,
                                 Sum, _args, _check, _check_in_place, _consumer, _device, _name,
                                 _op_of, _ready_stream, _stream_of,
                                 _to_wire, _wire_op)

# Whether a tensor lies in host memory. Tensor.is_cpu (PyTorch 1.13 on) costs what is_cuda does,
# a tenth of reading device.type, which older PyTorch needs; the short paths ask it every call.
_on_host = (operator.attrgetter("is_cpu") if hasattr(torch.Tensor, "is_cpu")
            else lambda tensor: tensor.device.type == "cpu")


def _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor, process_set):
    _check(tensor)
    code = _DTYPES.get(tensor.dtype)
    on_cuda = tensor.is_cuda
    if code is not None and (on_cuda or _on_host(tensor)) and tensor.is_contiguous():
        # The common case, kept short (a step enqueues every gradient): a tensor the runtime
        # carries as it is goes straight to its output, and the handle returns the output.
        if on_cuda:
            device = tensor.device
            kind, index = _DEVICE_CUDA, device.index or 0
            ready, consumer = _stream_of(device), device
        else:
            kind, index, ready, consumer = _DEVICE_CPU, -1, 0, None
        return _core.allreduce(tensor.data_ptr(), output.data_ptr(), code, tensor.shape, kind,
                               index, _name("allreduce", name), _CORE_OPS[op], prescale_factor,
                               postscale_factor, _id_of(process_set), ready, tensor, output, None,
                               consumer)
    # A tensor on another device (meta, mps, xla) is refused here, before a copy of it is made:
    # the runtime could only read its pointer as host memory.
    _device(tensor)
    op = _wire_op(tensor.dtype, op)
    wire = _to_wire(tensor)
    # A tensor the runtime carries as it is goes straight to its output; a converted copy is
    # reduced in place and copied out at the end.
    source, target = (tensor, output) if wire is tensor else (wire, wire)

    # The handle records the copy on a consumer stream other than its producer's (handles.py).
    def finish():
        if target is not output:
            output.copy_(target)
        return output

    return _core.allreduce(source.data_ptr(), target.data_ptr(), *_args(source)[1:],
                           _name("allreduce", name), _CORE_OPS[op], prescale_factor,
                           postscale_factor, _id_of(process_set), _ready_stream(source),
                           (tensor, output, wire), None, finish, _consumer(source))


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    """Starts reducing ``tensor`` over the ranks into a new tensor; returns a handle."""
    op = _op_of(op, average)
    output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    return _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor,
                            process_set)


# Horovod's op (None: the default, Average) -> the runtime's, for allreduce_async_'s short path.
_SHORT_PATH_OPS = {None: _CORE_OPS[Average], **_CORE_OPS}


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    """Starts reducing ``tensor`` over the ranks in place; returns a handle."""
    # The short path: what a script enqueueing every gradient of a step passes (a dense,
    # contiguous host tensor of a carried dtype, on the global set). Everything else (a CUDA
    # tensor, one on any other device), and every error, takes the general path below.
    core_op = _SHORT_PATH_OPS.get(op) if average is None else None
    if (core_op is not None and process_set is global_process_set
            and isinstance(tensor, torch.Tensor) and _on_host(tensor)
            and not tensor.is_sparse and tensor.is_contiguous()):
        code = _DTYPES.get(tensor.dtype)
        if code is not None:
            data = tensor.data_ptr()
            return _core.allreduce(data, data, code, tensor.shape, _DEVICE_CPU, -1,
                                   "" if name is None else "allreduce.%s" % (name,), core_op,
                                   prescale_factor, postscale_factor, 0, 0, tensor, tensor, None,
                                   None)
    op = _op_of(op, average)
    # A non-contiguous tensor is reduced as a contiguous copy, and the result copied back.
    _check_in_place(tensor)
    return _allreduce_async(tensor, tensor, name, op, prescale_factor, postscale_factor,
                            process_set)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """Reduces ``tensor`` over the ranks in place and returns it."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, process_set):
        ctx.op = op
        ctx.scales = (prescale_factor, postscale_factor)
        ctx.process_set = process_set
        return synchronize(allreduce_async(tensor, None, name, op, prescale_factor,
                                           postscale_factor, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        # Horovod's gradient, for every op it differentiates: the output's gradient reduced with
        # the forward pass's op and scale factors (exact for Sum and Average; for Min, Max and
        # Product what Horovod scripts were written against).
        grad = allreduce(grad_output, op=ctx.op, prescale_factor=ctx.scales[0],
                         postscale_factor=ctx.scales[1], process_set=ctx.process_set)
        return grad, None, None, None, None, None


# Adasum's gradient is not an Adasum of the output's gradient, and Horovod's backward would take it
# for one; gradsync refuses to record it instead.
_NOT_DIFFERENTIABLE = (Adasum,)


def _refuse_recording(op, tensors):
    """Raises where autograd would record an allreduce of ``tensors`` with an ``op`` it cannot
    differentiate: grad mode on and a tensor that requires a gradient. Under torch.no_grad() (an
    evaluation's metrics, a parameter reduced by hand) nothing is recorded, so nothing is refused.
    """
    if (op in _NOT_DIFFERENTIABLE and torch.is_grad_enabled()
            and any(t.requires_grad for t in tensors)):
        raise NotImplementedError(
            "autograd cannot record an Adasum allreduce, whose gradient is not an Adasum of the "
            "output's (Sum and Average, Min, Max and Product it can): detach the tensor or "
            "reduce it under torch.no_grad()")


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Returns ``tensor`` reduced over the ranks (Average by default); differentiable."""
    op = _op_of(op, average)
    compressed, ctx = compression.compress(tensor)
    _refuse_recording(op, (compressed,))
    reduced = _Allreduce.apply(compressed, name, op, prescale_factor, postscale_factor,
                               process_set)
    return compression.decompress(reduced, ctx)


def _grouped_allreduce_async(tensors, outputs, name, op, prescale_factor, postscale_factor,
                             process_set):
    if not tensors:
        return _register([], (), lambda: [])
    for t in tensors:
        _check(t)
    _check_one_device(tensors)
    op = _group_wire_op(tensors, op)
    wires = [_to_wire(t) for t in tensors]
    # Each group member is reduced in place: the tensor itself, its output holding a copy of it,
    # or its converted copy, which is copied out at the end.
    targets = []
    for t, w, o in zip(tensors, wires, outputs):
        if w is not t:
            targets.append(w)
        else:
            if o is not t:
                o.copy_(t)
            targets.append(o)
    names = [] if name is None else _grouped_names(name, len(tensors))
    kind, index = _device(targets[0])
    # In place, with no converted copy: the handle returns the tensors as they are.
    copies = any(target is not o for o, target in zip(outputs, targets))

    def finish():
        for o, target in zip(outputs, targets):
            if target is not o:
                o.copy_(target)
        return list(outputs)

    return _core.grouped_allreduce([t.data_ptr() for t in targets],
                                   [_DTYPES[t.dtype] for t in targets],
                                   [t.shape for t in targets], kind, index, names,
                                   _CORE_OPS[op], prescale_factor, postscale_factor,
                                   _id_of(process_set), _ready_stream(targets[0]),
                                   (tensors, outputs, wires, targets),
                                   None if copies else list(outputs), finish if copies else None,
                                   _consumer(targets[0]))


def _check_one_device(tensors):
    """Refuses a group whose members lie on more than one device: the runtime takes one device
    for the whole group and would read every member's memory as that device's."""
    # Devices compare as torch.device values: one set of them per group, not a lookup each.
    if len({t.device for t in tensors}) > 1:
        raise ValueError("a group's tensors must all be on one device")


def _group_wire_op(tensors, op):
    """The one op the runtime reduces every member of a group with: ``op`` as each member's
    dtype travels (a bool sum is a maximum, a bool product a minimum). A group whose members would
    need two ops (bool and other dtypes under Sum or Product) is refused, whatever their order."""
    wire_ops = {_wire_op(dtype, op) for dtype in {t.dtype for t in tensors}}
    if len(wire_ops) > 1:
        raise ValueError(
            "op=%s reduces bool tensors as %s but the other tensors of this group as %s, and a "
            "group is reduced with one op: a group mixing bool and other dtypes takes Max or Min "
            "only; reduce the bool tensors in a group of their own"
            % (("Sum", "Max (a logical or)", "a sum") if op == Sum
               else ("Product", "Min (a logical and)", "a product")))
    return wire_ops.pop()


@functools.lru_cache(maxsize=64)
def _grouped_names(name, count):
    """The runtime's names for the members of group ``name``: the same every step, so made once."""
    return ["grouped_allreduce.%s.%d" % (name, i) for i in range(count)]


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    op = _op_of(op, average)
    outputs = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    return _grouped_allreduce_async(tensors, outputs, name, op, prescale_factor, postscale_factor,
                                    process_set)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    op = _op_of(op, average)
    # Non-contiguous members are reduced as contiguous copies, and the results copied back.
    for t in tensors:
        _check_in_place(t)
    return _grouped_allreduce_async(tensors, tensors, name, op, prescale_factor, postscale_factor,
                                    process_set)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.op = op
        ctx.scales = (prescale_factor, postscale_factor)
        ctx.process_set = process_set
        return tuple(synchronize(grouped_allreduce_async(list(tensors), None, name, op,
                                                         prescale_factor, postscale_factor,
                                                         process_set)))

    @staticmethod
    def backward(ctx, *grads):
        reduced = grouped_allreduce(list(grads), op=ctx.op, prescale_factor=ctx.scales[0],
                                    postscale_factor=ctx.scales[1], process_set=ctx.process_set)
        return (None, None, None, None, None) + tuple(reduced)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Returns every tensor reduced over the ranks, negotiated and fused as one group."""
    op = _op_of(op, average)
    if not tensors:
        return []
    compressed, ctxs = zip(*[compression.compress(t) for t in tensors])
    _refuse_recording(op, compressed)
    reduced = _GroupedAllreduce.apply(name, op, prescale_factor, postscale_factor, process_set,
                                      *compressed)
    return [compression.decompress(t, c) for t, c in zip(reduced, ctxs)]
