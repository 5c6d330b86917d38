"""Whole-model helpers: broadcast parameters, optimizer state and Python objects; gather objects."""

import collections
import pickle

import torch

try:
    # Horovod pickles objects with cloudpickle, which also takes lambdas, closures and classes
    # defined in __main__; plain pickle loads what it made where cloudpickle is installed too.
    import cloudpickle as _pickler
except ImportError:
    _pickler = pickle

from gradsync import _core
from gradsync.torch import mpi_ops
from gradsync.torch.handles import _synchronize_all
from gradsync.torch.process_sets import global_process_set


def broadcast_parameters(params, root_rank, process_set=global_process_set):
    """Overwrites every parameter and buffer with ``root_rank``'s, in place.

    ``params`` is a ``state_dict()``, an iterable of ``(name, tensor)`` such as
    ``named_parameters()``, or of tensors such as ``list(model.parameters())``. The broadcasts
    are enqueued together, so they fuse.
    """
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, collections.abc.Iterable):
        # As Horovod takes them: a tensor without a name is broadcast unnamed, so its name is
        # made up in call order, the same on every rank.
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError("invalid params of type: %s" % type(params))
    handles = []
    for name, p in items:
        if p is None:
            continue
        tensor = p.data if isinstance(p, torch.nn.Parameter) else p
        handles.append(mpi_ops.broadcast_async_(tensor, root_rank, name=name,
                                                process_set=process_set))
    _synchronize_all(handles)


def _pickled(obj):
    """``obj`` pickled, as a uint8 tensor."""
    payload = _pickler.dumps(obj)
    return torch.frombuffer(bytearray(payload), dtype=torch.uint8)


def _unpickled(data):
    return _pickler.loads(data.numpy().tobytes())


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Returns ``root_rank``'s ``obj`` on every rank: the root's own object on the root, an
    unpickled copy elsewhere. cloudpickle, as Horovod uses, when it is installed (so lambdas and
    closures travel), else pickle. When the root cannot pickle ``obj``, every rank raises: the
    root its pickling error, the others ``pickle.PicklingError``."""
    # Not named after the object's type, as Horovod names it: the ranks that only receive often
    # pass None, and names that differ between ranks never match.
    name = name or "broadcast_object"
    data, failure = None, None
    if _core.rank() == root_rank:  # a global rank, as Horovod takes every root
        try:
            data = _pickled(obj)
        except Exception as error:  # whatever the pickler raises, the other ranks must hear of it
            failure = error
        # -1 tells the others that no data follows, so they raise rather than wait for it.
        length = torch.tensor([-1 if failure else data.numel()], dtype=torch.int64)
    else:
        length = torch.tensor([0], dtype=torch.int64)
    mpi_ops.broadcast_(length, root_rank, name=name + ".length", process_set=process_set)
    if failure is not None:
        raise failure
    if length.item() < 0:
        raise pickle.PicklingError("broadcast_object %r: root rank %d could not pickle its object"
                                   % (name, root_rank))
    if data is None:
        data = torch.empty(int(length.item()), dtype=torch.uint8)
    mpi_ops.broadcast_(data, root_rank, name=name + ".data", process_set=process_set)
    return obj if _core.rank() == root_rank else _unpickled(data)


def allgather_object(obj, name=None, process_set=global_process_set):
    """Returns a list of every rank's ``obj`` in rank order (pickled as ``broadcast_object``
    pickles). When some rank cannot pickle its ``obj``, every rank raises: that rank its pickling
    error, the others ``pickle.PicklingError``."""
    name = name or "allgather_object"  # the ranks' objects may differ in type
    try:
        data, failure = _pickled(obj), None
    except Exception as error:  # whatever the pickler raises, the other ranks must hear of it
        data, failure = torch.empty(0, dtype=torch.uint8), error
    # A length of -1 says that this rank has nothing to send, so that no rank waits for the data.
    length = torch.tensor([-1 if failure else data.numel()], dtype=torch.int64)
    lengths = mpi_ops.allgather(length, name=name + ".lengths", process_set=process_set).tolist()
    if failure is not None:
        raise failure
    unpicklable = [r for r, n in enumerate(lengths) if n < 0]
    if unpicklable:
        raise pickle.PicklingError("allgather_object %r: ranks %s of the process set could not "
                                   "pickle their objects" % (name, unpicklable))
    gathered = mpi_ops.allgather(data, name=name + ".data", process_set=process_set)
    objects, offset = [], 0
    for length in lengths:
        objects.append(_unpickled(gathered[offset:offset + length]))
        offset += length
    return objects


def _state_layout(state):
    """What the root sends of an optimizer state: per parameter index, each entry as a tensor's
    shape, dtype and device kind (its values go by broadcast) or as the value itself."""
    layout = {}
    for pid, entries in state.items():
        layout[pid] = {
            key: ("tensor", tuple(value.shape), value.dtype, value.device.type)
            if torch.is_tensor(value) else ("value", value)
            for key, value in entries.items()}
    return layout


def _parameters_by_index(optimizer, state_dict):
    """state_dict's parameter indices -> the optimizer's parameters."""
    found = {}
    for saved, group in zip(state_dict["param_groups"], optimizer.param_groups):
        for pid, p in zip(saved["params"], group["params"]):
            found[pid] = p
    return found


def _receiving_state(layout, mine, parameters):
    """A state shaped as the root's `layout`: this rank's tensors where they fit (received into
    in place), new ones where they do not; entries the root lacks are dropped."""
    state, tensors = {}, {}
    for pid, entries in layout.items():
        have = mine.get(pid, {})
        received = {}
        for key, kind in entries.items():
            if kind[0] != "tensor":
                received[key] = kind[1]
                continue
            _, shape, dtype, device_type = kind
            tensor = have.get(key)
            if not (torch.is_tensor(tensor) and tuple(tensor.shape) == shape
                    and tensor.dtype == dtype):
                param = parameters.get(pid)
                device = param.device if param is not None and device_type != "cpu" \
                    else torch.device("cpu")
                tensor = torch.empty(shape, dtype=dtype, device=device)
            received[key] = tensor
            tensors["%s.%s" % (pid, key)] = tensor
        state[pid] = received
    return state, tensors


def broadcast_optimizer_state(optimizer, root_rank, model=None, process_set=global_process_set):
    """Overwrites the optimizer's state and hyperparameters with ``root_rank``'s.

    The root's state is replicated as it is, whatever the others hold: its layout (which
    parameters have state, under which keys, of which shapes) and its plain values (step counts,
    learning rates, betas) travel as one pickled object, then its tensors are broadcast into
    this rank's own where they fit, into new ones where they do not (a parameter that had no
    gradient here, a frozen or unused layer, has no state here). Entries the root lacks are
    dropped. When the root has no state yet (before the first step), only the hyperparameters
    are sent, so a fresh optimizer stays fresh: unlike Horovod, Adam's step count is not
    advanced by a zero-gradient step. ``model`` is accepted for Horovod's signature: Horovod uses
    it to find sparse parameters for that zero-gradient step, which is not taken here.
    """
    del model
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    state_dict = optimizer.state_dict()
    groups = [{k: v for k, v in g.items() if k != "params"} for g in state_dict["param_groups"]]
    layout, groups = broadcast_object((_state_layout(state_dict["state"]), groups), root_rank,
                                      name="optimizer_state.layout", process_set=process_set)
    state, tensors = _receiving_state(layout, state_dict["state"],
                                      _parameters_by_index(optimizer, state_dict))
    broadcast_parameters(tensors, root_rank, process_set=process_set)
    state_dict["state"] = state
    for group, received in zip(state_dict["param_groups"], groups):
        group.update(received)
    optimizer.load_state_dict(state_dict)
