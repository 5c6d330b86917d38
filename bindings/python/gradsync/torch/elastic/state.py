"""Horovod's elastic state: what training needs to go on after a restart, kept at each commit.

``commit()`` copies the state in memory (``save``) and, when the job runs under
``gradsyncrun --min-np/--max-np``, hands the copy to a writer thread that makes it durable in the
job's checkpoint directory (store.py); then it asks whether the launcher has seen the hosts change
(``check_host_updates``). ``restore()`` goes back to the last commit in memory; ``sync()`` makes
every rank's state a root rank's. A new world loads the newest durable commit
(gradsync.torch.elastic run), so a job that lost a host goes on from its last commit.

Every rank must commit at the same points of the program, as it must reduce the same gradients.
"""

import copy
import threading

import torch

from gradsync.torch import functions
from gradsync.torch.basics import local_rank, rank
from gradsync.torch.elastic import notices, store
from gradsync.torch.elastic.sampler import ElasticSampler


class HostsUpdatedInterrupt(RuntimeError):
    """Raised by ``check_host_updates()`` on every rank, at the same commit, when the launcher has
    seen hosts come or go: the state is committed, and the job restarts on the hosts there are
    (Horovod's ``horovod.common.exceptions.HostsUpdatedInterrupt``)."""

    def __init__(self, skip_sync=False):
        super().__init__("the job's hosts changed")
        self.skip_sync = skip_sync


class State:
    """The base of the elastic states: reset callbacks, commit and the host-update check."""

    def __init__(self):
        self._reset_callbacks = []
        self._commits = 0  # the number of the last commit, the same on every rank
        self._writer = None

    def register_reset_callbacks(self, callbacks):
        """Callables run, in order, after the job restarts with other hosts (to rescale the
        learning rate to the new number of ranks, for example)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Saves the state (durably under an elastic launcher), then checks for host updates."""
        self.save()
        self._commits += 1
        directory = notices.checkpoint_dir()
        if directory is not None and local_rank() == 0:
            if self._writer is None:
                self._writer = store.Writer(directory)
            self._writer.submit(self._commits, *self._payload_for_writer())
        self.check_host_updates()

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt on every rank alike once the launcher has announced that
        the hosts changed. A collective: every rank calls it at the same point."""
        changed = functions.broadcast_object(notices.hosts_changed() if rank() == 0 else None,
                                             root_rank=0, name="elastic.hosts_changed")
        if changed:
            raise HostsUpdatedInterrupt(skip_sync=False)

    def flush(self, timeout=None):
        """Waits until this rank's commits are on disk, for at most ``timeout`` seconds when
        given; returns whether they are."""
        return self._writer is None or self._writer.flush(timeout)

    # What each kind of state defines.
    def save(self):
        raise NotImplementedError

    def restore(self):
        raise NotImplementedError

    def sync(self, root_rank=0):
        raise NotImplementedError

    def reset(self):
        pass

    def _payload(self):
        """The saved state, as a durable commit holds it."""
        raise NotImplementedError

    def _payload_for_writer(self):
        """The payload, and what the writer calls once it no longer reads it (or None)."""
        return self._payload(), None

    def _load_payload(self, payload):
        """Makes ``payload`` (a durable commit) the saved state, and restores it."""
        raise NotImplementedError


class ObjectState(State):
    """Plain values (``epoch=0, batch=0``) as attributes, saved and restored by copy and synced by
    a broadcast from the root."""

    def __init__(self, **kwargs):
        super().__init__()
        self._saved_state = dict(kwargs)
        self._set_attrs()

    def save(self):
        self._saved_state = {k: copy.deepcopy(getattr(self, k)) for k in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self, root_rank=0):
        if self._saved_state:
            self.save()
            self._saved_state = functions.broadcast_object(self._saved_state, root_rank=root_rank,
                                                           name="elastic.objects")
            self._set_attrs()

    def _set_attrs(self):
        for name, value in self._saved_state.items():
            setattr(self, name, copy.deepcopy(value))

    def _payload(self):
        return {"objects": self._saved_state}

    def _load_payload(self, payload):
        self._saved_state.update(payload["objects"])
        self._set_attrs()


def _stateful(value):
    return callable(getattr(value, "state_dict", None)) and \
        callable(getattr(value, "load_state_dict", None))


class TorchState(ObjectState):
    """A model, an optimizer and any other objects with ``state_dict()`` (ElasticSamplers,
    learning-rate schedulers), and plain values (Horovod's ``TorchState``).

    Objects with a ``state_dict()`` are saved as a copy of it and restored with
    ``load_state_dict``; sync broadcasts the root's parameters and buffers
    (``broadcast_parameters``), optimizer state (``broadcast_optimizer_state``) and every other
    state dict. Everything else is a plain value, as in ObjectState.
    """

    def __init__(self, model=None, optimizer=None, **kwargs):
        named = dict(kwargs, model=model, optimizer=optimizer)
        self._stateful = {k: v for k, v in named.items() if v is not None and _stateful(v)}
        for name, value in self._stateful.items():
            setattr(self, name, value)
        if model is None:
            self.model = None
        if optimizer is None:
            self.optimizer = None
        self._saved = {}
        self._snapshots = _SnapshotPool()
        super().__init__(**{k: v for k, v in kwargs.items() if k not in self._stateful})
        self._save_torch()

    def __setattr__(self, name, value):
        # As Horovod's: a model, optimizer or sampler assigned anew (state.model = ...) is the one
        # saved, restored and synced from then on, not the object it replaced.
        stateful = self.__dict__.get("_stateful")
        if stateful is not None and name in stateful:
            if not _stateful(value):
                raise ValueError("state.%s holds an object with state_dict() and "
                                 "load_state_dict(); %r has none" % (name, value))
            stateful[name] = value
        super().__setattr__(name, value)

    def save(self):
        self._save_torch()
        super().save()

    def restore(self):
        for name, value in self._stateful.items():
            _load(value, self._saved[name])
        super().restore()

    def sync(self, root_rank=0):
        for name, value in self._stateful.items():
            if isinstance(value, torch.nn.Module):
                functions.broadcast_parameters(value.state_dict(), root_rank=root_rank)
            elif isinstance(value, torch.optim.Optimizer):
                functions.broadcast_optimizer_state(value, root_rank=root_rank, model=self.model)
            else:
                _gather_local_indices(name, value)
                value.load_state_dict(functions.broadcast_object(
                    value.state_dict(), root_rank=root_rank, name="elastic.state.%s" % name))
        super().sync(root_rank)
        self._save_torch()

    def reset(self):
        for value in self._stateful.values():
            if isinstance(value, ElasticSampler):
                value.reset()

    def _save_torch(self):
        previous, snapshot = self._saved, self._snapshots.take()
        for name, value in self._stateful.items():
            _gather_local_indices(name, value)
            state = value.state_dict()
            # Live state never shares a tensor with a snapshot (_load), which may then be reused.
            if isinstance(value, (torch.nn.Module, torch.optim.Optimizer)):
                snapshot[name] = _copy_into(snapshot.get(name), state)
            else:
                snapshot[name] = copy.deepcopy(state)
        self._snapshots.hold(snapshot)
        self._saved = snapshot
        self._snapshots.release(previous)

    def _payload(self):
        payload = super()._payload()
        payload["state_dicts"] = dict(self._saved)
        return payload

    def _payload_for_writer(self):
        snapshot = self._saved
        self._snapshots.hold(snapshot)
        return self._payload(), lambda _: self._snapshots.release(snapshot)

    def _load_payload(self, payload):
        self._saved = dict(payload["state_dicts"])
        for name, value in self._stateful.items():
            if name in self._saved:
                _load(value, self._saved[name])
        super()._load_payload(payload)


class _Snapshot(dict):
    """A commit's copies of state dicts, by name, and how many read them."""

    def __init__(self):
        super().__init__()
        self.readers = 0


class _SnapshotPool:
    """Snapshots for reuse. A commit copies the model and optimizer into the tensors of a snapshot
    nothing reads any more (neither the state's last commit nor the writer's) instead of new ones:
    allocating a fresh copy (its pages faulted in and zeroed) costs several times the copy itself.
    The state holds one snapshot and the writer at most two (one written, one waiting), so at most
    three exist. Threads: ``release`` also from the writer's."""

    def __init__(self):
        self._lock = threading.Lock()
        self._free = []

    def take(self):
        with self._lock:
            return self._free.pop() if self._free else _Snapshot()

    def hold(self, snapshot):
        if isinstance(snapshot, _Snapshot):
            with self._lock:
                snapshot.readers += 1

    def release(self, snapshot):
        if isinstance(snapshot, _Snapshot):  # not what a resume loaded
            with self._lock:
                snapshot.readers -= 1
                if snapshot.readers == 0 and len(self._free) < 2:
                    self._free.append(snapshot)


def _load(value, saved):
    """``value.load_state_dict(saved)``, leaving ``saved`` as it was committed. A module copies a
    state dict into its own tensors. An optimizer copied it up to PyTorch 1.13, but from PyTorch 2
    keeps the tensors it is given where their dtype and device fit, and then steps them in place
    (momentum, Adam's moments and step counts): the snapshot would change under the training that
    follows, and a second restore would load that, and a snapshot reused by a later commit would
    be copied into live state while live state is stepped in it. So every object but a module gets
    a copy."""
    value.load_state_dict(saved if isinstance(value, torch.nn.Module) else copy.deepcopy(saved))


def _copy_into(reused, state):
    """A copy of ``state`` (dicts and lists of tensors and plain values), made in ``reused``'s
    tensors where ``reused`` is an earlier copy of the same structure, shapes and dtypes."""
    if torch.is_tensor(state):
        if torch.is_tensor(reused) and reused.shape == state.shape and \
                reused.dtype == state.dtype and reused.device == state.device and \
                reused.layout == state.layout == torch.strided and not state.requires_grad:
            return reused.copy_(state)
        return copy.deepcopy(state)
    if isinstance(state, dict):
        if type(reused) is not type(state) or list(reused) != list(state):
            return copy.deepcopy(state)
        for key, value in state.items():
            reused[key] = _copy_into(reused[key], value)
        if hasattr(state, "_metadata"):  # a module's state dict: its layers' versions
            reused._metadata = copy.deepcopy(state._metadata)
        return reused
    if isinstance(state, list) and isinstance(reused, list) and len(reused) == len(state):
        reused[:] = [_copy_into(r, v) for r, v in zip(reused, state)]
        return reused
    return copy.deepcopy(state)


def _gather_local_indices(name, value):
    """An ElasticSampler's indices recorded by each rank alone, made the union of every rank's."""
    if isinstance(value, ElasticSampler) and value._local_only:
        gathered = functions.allgather_object(value.processed_indices,
                                              name="elastic.sampler.%s" % name)
        value.processed_indices = set().union(*gathered)
        value._local_only = False
