"""The collectives of ``horovod.torch`` over gradsync's runtime: same names, arguments and defaults.

Asynchronous calls return an integer handle for ``poll`` and ``synchronize``. Tensors reach the
runtime as their data pointers, so inputs and in-place outputs are never copied; tensors are kept
alive here until their handle is synchronized. int16 and bool tensors, which the runtime does not
carry, travel as int32 and uint8 copies (bool sums and maxima are logical or, minima and products
logical and).
"""

import itertools

import torch

from gradsync import GradsyncInternalError, _core
from gradsync.torch.compression import Compression
from gradsync.torch.process_sets import _id_of, global_process_set

# Horovod's reduce op values.
Average = 0
Sum = 1
Adasum = 2
Min = 3
Max = 4
Product = 5

# Horovod's op -> the runtime's ReduceOp.
_CORE_OPS = {Sum: 0, Average: 1, Min: 2, Max: 3, Product: 4}
_OP_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max",
             Product: "Product"}

# torch dtype -> the runtime's DataType.
_DTYPES = {torch.uint8: 0, torch.int8: 1, torch.int32: 2, torch.int64: 3, torch.float16: 4,
           torch.bfloat16: 5, torch.float32: 6, torch.float64: 7}
# dtypes the runtime lacks, and the dtype each travels as.
_WIRE_DTYPES = {torch.int16: torch.int32, torch.bool: torch.uint8}

_DEVICE_CPU, _DEVICE_CUDA = 0, 1


class _Pending:
    """An enqueued operation: its runtime handles, the tensors to keep alive, and what it returns."""

    __slots__ = ("handles", "keep", "finish")

    def __init__(self, handles, keep, finish):
        self.handles = handles
        self.keep = keep
        self.finish = finish


_handle_map = {}
_handle_ids = itertools.count(1)


def _register(handles, keep, finish):
    handle = next(_handle_ids)
    _handle_map[handle] = _Pending(handles, keep, finish)
    return handle


def _forget_handles():
    _handle_map.clear()


def poll(handle):
    """True once the operation behind ``handle`` has finished. Never blocks."""
    pending = _handle_map.get(handle)
    if pending is None:
        raise ValueError("unknown handle %r (already synchronized?)" % (handle,))
    return all(h.poll() for h in pending.handles)


def synchronize(handle):
    """Waits for the operation behind ``handle`` and returns its result.

    Raises HorovodInternalError (gradsync's GradsyncInternalError) with the runtime's message when
    the operation failed: a mismatch between ranks, a stall, a shutdown.
    """
    pending = _handle_map.pop(handle, None)
    if pending is None:
        raise ValueError("unknown handle %r (already synchronized?)" % (handle,))
    for h in pending.handles:
        h.wait()
    return pending.finish()


def _op_of(op, average, default=Average):
    """Horovod's rule: ``average`` is the legacy flag, and ``op`` supersedes it."""
    if op is not None and average is not None:
        raise ValueError("The op parameter supersedes average. Please provide only one of them.")
    if average is not None:
        op = Average if average else Sum
    if op is None:
        op = default
    if op == Adasum:
        raise NotImplementedError("Adasum is not supported by gradsync: use op=Average or op=Sum")
    if op not in _CORE_OPS:
        raise ValueError("unknown reduce op %r" % (op,))
    return op


def _name(prefix, name):
    return "" if name is None else "%s.%s" % (prefix, name)


def _device(tensor):
    if tensor.device.type == "cpu":
        return _DEVICE_CPU, -1
    if tensor.device.type == "cuda":
        return _DEVICE_CUDA, tensor.device.index if tensor.device.index is not None else 0
    raise ValueError("tensors on %s are not supported by gradsync" % tensor.device)


def _check(tensor):
    if not isinstance(tensor, torch.Tensor):
        raise ValueError("expected a torch.Tensor, got %s" % type(tensor).__name__)
    if tensor.dtype not in _DTYPES and tensor.dtype not in _WIRE_DTYPES:
        raise ValueError("Tensor type %s is not supported." % tensor.type())
    if tensor.is_sparse:
        raise ValueError("sparse tensors are not supported: densify them (sparse_as_dense=True)")


def _args(tensor):
    """The runtime's view of a contiguous tensor of a dtype it carries."""
    kind, index = _device(tensor)
    return tensor.data_ptr(), _DTYPES[tensor.dtype], list(tensor.shape), kind, index


def _to_wire(tensor):
    """The tensor the runtime sees: ``tensor`` itself, or a contiguous copy in a carried dtype."""
    wire = _WIRE_DTYPES.get(tensor.dtype)
    if wire is not None:
        return tensor.to(wire).contiguous()
    return tensor if tensor.is_contiguous() else tensor.contiguous()


def _wire_op(dtype, op):
    if dtype != torch.bool:
        return op
    if op in (Sum, Max):
        return Max
    if op in (Min, Product):
        return Min
    raise ValueError("op=Average is not defined for bool tensors; use Sum (or) or Min (and)")


def _output_tensor(h, dtype):
    """A collective's allocated output as a tensor of ``dtype`` that shares its memory."""
    shape = h.output_shape()
    wire = _WIRE_DTYPES.get(dtype, dtype)
    buffer = h.output
    if buffer is None or buffer.nbytes == 0:
        result = torch.empty(shape, dtype=wire)
    else:
        result = torch.frombuffer(buffer, dtype=wire).reshape(shape)
    return result if wire == dtype else result.to(dtype)


# ----------------------------------------------------------------------------------------------
# allreduce


def _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor, process_set):
    _check(tensor)
    op = _wire_op(tensor.dtype, op)
    wire = _to_wire(tensor)
    # A tensor the runtime carries as it is goes straight to its output; a converted copy is
    # reduced in place and copied out at the end.
    source, target = (tensor, output) if wire is tensor else (wire, wire)
    h = _core.allreduce(source.data_ptr(), target.data_ptr(), *_args(source)[1:],
                        _name("allreduce", name), _CORE_OPS[op], prescale_factor,
                        postscale_factor, _id_of(process_set))

    def finish():
        if target is not output:
            output.copy_(target)
        return output

    return _register([h], (tensor, output, wire), finish)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    """Starts reducing ``tensor`` over the ranks into a new tensor; returns a handle."""
    op = _op_of(op, average)
    output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    return _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor,
                            process_set)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    """Starts reducing ``tensor`` over the ranks in place; returns a handle."""
    op = _op_of(op, average)
    if not tensor.is_contiguous():
        raise ValueError("Tensor is required to be contiguous.")
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
        # The gradient of a sum (or average) over ranks is the same reduction of the gradients.
        grad = allreduce(grad_output, op=ctx.op, prescale_factor=ctx.scales[0],
                         postscale_factor=ctx.scales[1], process_set=ctx.process_set)
        return grad, None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Returns ``tensor`` reduced over the ranks (Average by default); differentiable."""
    op = _op_of(op, average)
    compressed, ctx = compression.compress(tensor)
    if op in (Min, Max, Product) and compressed.requires_grad:
        raise NotImplementedError("the gradient of allreduce is defined for Sum and Average only")
    reduced = _Allreduce.apply(compressed, name, op, prescale_factor, postscale_factor,
                               process_set)
    return compression.decompress(reduced, ctx)


# ----------------------------------------------------------------------------------------------
# grouped allreduce


def _grouped_allreduce_async(tensors, outputs, name, op, prescale_factor, postscale_factor,
                             process_set):
    if not tensors:
        return _register([], (), lambda: [])
    for t in tensors:
        _check(t)
    if len({_device(t) for t in tensors}) > 1:
        raise ValueError("a group's tensors must all be on one device")
    wires = [_to_wire(t) for t in tensors]
    op = _wire_op(tensors[0].dtype, op)
    if any(_wire_op(t.dtype, op) != op for t in tensors):
        raise ValueError("a group's op must be defined for every tensor of the group")
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
    names = [] if name is None else ["grouped_allreduce.%s.%d" % (name, i)
                                     for i in range(len(tensors))]
    kind, index = _device(targets[0])
    handles = _core.grouped_allreduce([t.data_ptr() for t in targets],
                                      [_DTYPES[t.dtype] for t in targets],
                                      [list(t.shape) for t in targets], kind, index, names,
                                      _CORE_OPS[op], prescale_factor, postscale_factor,
                                      _id_of(process_set))

    def finish():
        for o, target in zip(outputs, targets):
            if target is not o:
                o.copy_(target)
        return list(outputs)

    return _register(handles, (tensors, outputs, wires, targets), finish)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    op = _op_of(op, average)
    outputs = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    return _grouped_allreduce_async(tensors, outputs, name, op, prescale_factor, postscale_factor,
                                    process_set)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    op = _op_of(op, average)
    if any(not t.is_contiguous() for t in tensors):
        raise ValueError("Tensors are required to be contiguous.")
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
    reduced = _GroupedAllreduce.apply(name, op, prescale_factor, postscale_factor, process_set,
                                      *compressed)
    return [compression.decompress(t, c) for t, c in zip(reduced, ctxs)]


# ----------------------------------------------------------------------------------------------
# allgather


def _allgather_async(tensor, name, process_set):
    _check(tensor)
    wire = _to_wire(tensor)
    h = _core.allgather(*_args(wire), _name("allgather", name), _id_of(process_set))
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
                                      _id_of(process_set))
    return _register(handles, (tensors, wires),
                     lambda: [_output_tensor(h, t.dtype) for h, t in zip(handles, tensors)])


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    return synchronize(grouped_allgather_async(tensors, name, process_set))


# ----------------------------------------------------------------------------------------------
# broadcast


def _broadcast_async(tensor, output, root_rank, name, process_set):
    _check(tensor)
    if output is not tensor:
        output.copy_(tensor)
    wire = _to_wire(output)
    h = _core.broadcast(*_args(wire), root_rank, _name("broadcast", name), _id_of(process_set))

    def finish():
        if wire is not output:
            output.copy_(wire)
        return output

    return _register([h], (tensor, output, wire), finish)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts copying ``root_rank``'s ``tensor`` to a new tensor on every rank; returns a handle."""
    output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    return _broadcast_async(tensor, output, root_rank, name, process_set)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    if not tensor.is_contiguous():
        raise ValueError("Tensor is required to be contiguous.")
    return _broadcast_async(tensor, tensor, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Overwrites ``tensor`` with ``root_rank``'s and returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank = root_rank
        ctx.process_set = process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        # Only the root's input reached the outputs: it gets the sum of every rank's gradient.
        grad = allreduce(grad_output, op=Sum, process_set=ctx.process_set)
        if ctx.process_set.rank() != ctx.root_rank:
            grad = torch.zeros_like(grad)
        return grad, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Returns ``root_rank``'s ``tensor`` on every rank; differentiable."""
    return _Broadcast.apply(tensor, root_rank, name, process_set)


# ----------------------------------------------------------------------------------------------
# alltoall


def _splits_list(splits):
    if splits is None:
        return []
    if isinstance(splits, torch.Tensor):
        if splits.dtype not in (torch.int32, torch.int64):
            raise ValueError("splits must be an integer tensor")
        return [int(s) for s in splits.tolist()]
    return [int(s) for s in splits]


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts sending slices of ``tensor`` to every rank; returns a handle.

    ``synchronize`` returns the received tensor, and with it the rows received from each rank
    (``(output, received_splits)``) when ``splits`` were given.
    """
    _check(tensor)
    wire = _to_wire(tensor)
    h = _core.alltoall(*_args(wire), _splits_list(splits), _name("alltoall", name),
                       _id_of(process_set))

    def finish():
        output = _output_tensor(h, tensor.dtype)
        if splits is None:
            return output
        return output, torch.tensor(h.received_splits(), dtype=torch.int32)

    return _register([h], (tensor, wire), finish)


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        ctx.process_set = process_set
        output, received = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.mark_non_differentiable(received)
        ctx.received = received
        return output, received

    @staticmethod
    def backward(ctx, grad_output, grad_received):
        # Each row goes back to where it came from.
        grad, _ = synchronize(alltoall_async(grad_output.contiguous(), ctx.received,
                                             process_set=ctx.process_set))
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends slices of ``tensor`` along the first dimension to every rank; differentiable.

    Returns the received tensor, or ``(tensor, received_splits)`` when ``splits`` were given.
    """
    split_list = _splits_list(splits)
    if not split_list:
        rows = tensor.shape[0] if tensor.dim() > 0 else 0
        n = process_set.size()
        split_list = [rows // n + (1 if r < rows % n else 0) for r in range(n)]
    output, received = _Alltoall.apply(tensor, split_list, name, process_set)
    return output if splits is None else (output, received)


# ----------------------------------------------------------------------------------------------
# reducescatter


def _reducescatter_async(tensors, name, op, prescale_factor, postscale_factor, process_set,
                         prefix):
    if not tensors:
        return [], ()
    for t in tensors:
        _check(t)
    op = _wire_op(tensors[0].dtype, op)
    wires = [_to_wire(t) for t in tensors]
    kind, index = _device(wires[0])
    names = [] if name is None else ["%s.%s.%d" % (prefix, name, i) for i in range(len(tensors))]
    handles = _core.reducescatter([w.data_ptr() for w in wires], [_DTYPES[w.dtype] for w in wires],
                                  [list(w.shape) for w in wires], kind, index, names,
                                  _CORE_OPS[op], prescale_factor, postscale_factor,
                                  _id_of(process_set))
    return handles, (tensors, wires)


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    """Starts reducing ``tensor`` and leaving each rank its share of the rows; returns a handle."""
    op = _op_of(op, None)
    handles, keep = _reducescatter_async([tensor], None if name is None else name, op,
                                         prescale_factor, postscale_factor, process_set,
                                         "reducescatter")
    return _register(handles, keep, lambda: _output_tensor(handles[0], tensor.dtype))


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
        # Every rank's input reached every share: gather the shares' gradients back.
        grad = allgather(grad_output.contiguous(), process_set=ctx.process_set) * ctx.scale
        if ctx.op == Average:
            grad = grad / ctx.process_set.size()
        return grad, None, None, None, None, None


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


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    op = _op_of(op, None)
    compressed, ctxs = zip(*[compression.compress(t) for t in tensors]) if tensors else ((), ())
    reduced = synchronize(grouped_reducescatter_async(list(compressed), name, op, process_set,
                                                      prescale_factor, postscale_factor))
    return [compression.decompress(t, c) for t, c in zip(reduced, ctxs)]


# ----------------------------------------------------------------------------------------------
# join and barrier


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
