"""DistributedOptimizer: Horovod's optimizer wrapper, with every gradient enqueued from backward."""

import contextlib
import warnings

import torch

from gradsync.torch import mpi_ops
from gradsync.torch.compression import Compression
from gradsync.torch.grad_hooks import register_grad_ready_hook
from gradsync.torch.gradient_batch import GradientBatch
from gradsync.torch.handles import _results_in_turn
from gradsync.torch.process_sets import _id_of, global_process_set
from gradsync.torch.sparse import sparse_allreduce_async
from gradsync.torch.wire import (_CORE_OPS, _name, _note_producer, _release_after_consumer,
                                 _stream_of, _wait_for_streams)

# Marks a parameter whose gradient is in flight in the batch (self._handles' value for it).
_IN_BATCH = (None, None)


def _mixed_into(mixin, optimizer):
    """``optimizer``'s class with ``mixin``'s methods, under the same name, so that ``isinstance``
    and ``state_dict`` hold."""
    # The mixin's own attributes, less the instance-dict descriptors that belong to its class.
    methods = {k: v for k, v in mixin.__dict__.items() if k not in ("__dict__", "__weakref__")}
    return type(optimizer.__class__.__name__, (optimizer.__class__,), methods)


def _names_of(param_groups, named_parameters):
    """Parameter id -> the name its reduction goes by: from ``named_parameters`` (which must
    hold every parameter of the groups, each name once), else from its position."""
    all_params = [p for g in param_groups for p in g["params"]]
    if named_parameters is None:
        return {id(p): "param.%d.%d" % (gi, pi)
                for gi, g in enumerate(param_groups) for pi, p in enumerate(g["params"])}
    named = list(named_parameters)
    names = [n for n, _ in named]
    if len(set(names)) != len(names):
        raise ValueError("named_parameters has duplicate names")
    known = {id(p) for _, p in named}
    missing = [p for p in all_params if id(p) not in known]
    if missing:
        raise ValueError("named_parameters was given, but %d of the optimizer's "
                         "parameters are not in it" % len(missing))
    return {id(p): n for n, p in named}


class _DistributedOptimizer:
    """Mixed into the wrapped optimizer's own class, so ``isinstance`` and ``state_dict`` hold.

    Each parameter's gradient accumulator gets a hook. After ``backward_passes_per_step``
    backward passes have accumulated into ``p.grad``, the hook enqueues its allreduce at once, so
    communication overlaps the rest of backward. ``synchronize()`` (called by ``step()``) enqueues
    what backward did not produce, waits for everything and writes the results into ``p.grad``.
    Gradients are summed over the accumulated passes and then reduced with ``op`` over ranks.

    Ungrouped, uncompressed parameters of a dtype the runtime carries go through one
    ``_core.AllreduceBatch`` (``gradsync::AllreduceBatch``): a hook starts its parameter's
    reduction with two integers, small gradients share buckets that are negotiated and reduced as
    one operation each, and ``synchronize()`` waits for all of them at once. A gradient that no
    longer fits its slot (its dtype, device or layout changed since the optimizer was made) is
    reduced through the slot from a fitting copy, then copied back; a parameter without a gradient
    contributes zeros, as on the general path. Groups and compression take the general path.
    """

    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, groups, sparse_as_dense, process_set):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        self._op = op
        self._sparse_as_dense = sparse_as_dense
        self._process_set = process_set
        if op == mpi_ops.Average:
            self._scales = (1.0 / gradient_predivide_factor, gradient_predivide_factor)
        elif gradient_predivide_factor != 1.0:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
        else:
            self._scales = (1.0, 1.0)

        all_params = [p for g in self.param_groups for p in g["params"]]
        self._names = _names_of(self.param_groups, named_parameters)
        # Horovod's attribute, which scripts read: each parameter's name.
        self._parameter_names = {p: self._names[id(p)] for p in all_params}
        self._groups = self._group_of(groups, all_params)

        self.backward_passes_per_step = backward_passes_per_step
        self._delay = {}
        self._handles = {}  # parameter id -> (handle, what its result is written back with)
        self._group_waiting = {}  # group index -> ids of its members still to be produced
        self._grad_accumulators = []
        self._should_synchronize = True
        self._synchronized = False
        self._requires_update = [p for p in all_params if p.requires_grad]
        self._by_id = {id(p): p for p in self._requires_update}
        self._reset_delays()
        # The batch is made at the first gradient, once init() and the process set surely exist.
        self._is_member = None
        self._sparse = set()  # ids of parameters whose gradients came sparse
        self._remake_batch = False
        self._batch = None
        self._batch_made = False
        self._register_hooks()

    @staticmethod
    def _group_of(groups, all_params):
        """Parameter id -> group index, from Horovod's ``groups`` (a count or lists of params).

        Only the optimizer's trainable parameters are kept, as Horovod keeps them: a group waits
        for each member's gradient before it is reduced, and a frozen parameter or one the
        optimizer does not hold never produces one, so its group would never be reduced and
        every rank would step on its own gradients. A group left with no members is dropped.
        """
        if groups is None:
            return {}
        trainable = [p for p in all_params if p.requires_grad]
        if isinstance(groups, int):
            if groups <= 0:
                return {}
            size = (len(trainable) + groups - 1) // groups
            return {id(p): i // size for i, p in enumerate(trainable)}
        groups = list(groups)
        if any(isinstance(members, torch.Tensor) for members in groups):
            # A flat list of parameters would be read as groups of their rows, none of which
            # the optimizer holds: every group would be dropped without a word.
            raise ValueError("groups must be a list of lists of parameters")
        # Read once: a group may be given as a generator, model.parameters() say.
        groups = [list(members) for members in groups]
        listed = set()
        for members in groups:
            for p in members:
                if not isinstance(p, torch.Tensor):
                    raise ValueError("groups must be lists of torch.Tensor parameters")
                # One parameter's gradient can be reduced in only one group.
                if id(p) in listed:
                    raise ValueError("a parameter can appear only once in groups")
                listed.add(id(p))
        trainable_ids = {id(p) for p in trainable}
        # Each group keeps its index in ``groups``: its reduction's name, the same on every rank.
        return {id(p): gi for gi, members in enumerate(groups) for p in members
                if id(p) in trainable_ids}

    def _make_batch(self):
        """The batch of the parameters it can carry (none with compression)."""
        self._batch = None
        if self._compression is not Compression.none:
            return
        # In backward's order (reverse registration, roughly), as the batch wants its list: its
        # buckets then close as backward goes, and its last bucket, which the wait reduces on this
        # thread from the second step on, is the one backward fills last.
        members = [p for p in reversed(self._requires_update)
                   if id(p) not in self._groups and id(p) not in self._sparse
                   and GradientBatch.carries(p)]
        if members:
            self._batch = GradientBatch(
                members, [_name("allreduce", self._names[id(p)]) for p in members],
                _CORE_OPS[self._op], self._scales[0], self._scales[1], _id_of(self._process_set))

    def _start_in_batch(self, p):
        """Starts ``p``'s reduction through the batch; False if ``p`` has no slot in it."""
        if not self._batch_made:
            self._make_batch()
            self._batch_made = True
        if self._batch is None or p not in self._batch:
            return False
        grad = p.grad
        if grad is not None and grad.is_sparse and not self._sparse_as_dense:
            # Gathered, not reduced in the batch: the batch is made again without it after this
            # step (its slot counts as zeros meanwhile).
            self._sparse.add(id(p))
            self._remake_batch = True
            return False
        if grad is None or grad.is_sparse:
            grad = self._prepare_grad(p)
        self._batch.start(p, grad)
        self._handles[id(p)] = _IN_BATCH
        return True

    def _reset_delays(self):
        for p in self._requires_update:
            self._delay[id(p)] = self.backward_passes_per_step
        self._group_waiting = {}
        self._group_streams = {}  # group index -> the CUDA streams that produced its members
        for pid, gi in self._groups.items():
            self._group_waiting.setdefault(gi, set()).add(pid)

    def _register_hooks(self):
        for p in self._requires_update:
            self._grad_accumulators.append(register_grad_ready_hook(p, self._on_grad_ready))

    def _on_grad_ready(self, p):
        pid = id(p)
        delay = self._delay[pid]
        if delay <= 0:
            raise AssertionError(
                "Gradients were computed more than backward_passes_per_step times before "
                "call to step(). Increase backward_passes_per_step to accumulate gradients "
                "locally.")
        self._delay[pid] = delay - 1
        if delay == 1:
            self._enqueue(p)

    def _prepare_grad(self, p):
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        if p.grad.is_sparse:
            p.grad = p.grad.to_dense()  # sparse_as_dense, or a grouped parameter
        return p.grad

    def _enqueue(self, p):
        if not self._member():
            return  # as Horovod: a rank outside the process set steps on its own gradients
        if not self._start_in_batch(p):
            self._enqueue_general(p)

    def _member(self):
        """Whether this rank is in the optimizer's process set (asked once: sets do not change
        their members, and the set surely exists by the first gradient)."""
        if self._is_member is None:
            self._is_member = self._process_set.included()
        return self._is_member

    def _enqueue_general(self, p):
        """Enqueues ``p`` outside the batch: with its group, or on its own."""
        pid = id(p)
        if pid in self._groups:
            gi = self._groups[pid]
            self._handles[pid] = (None, None)
            if p.is_cuda:
                _note_producer(self._group_streams.setdefault(gi, []), p.device)
            waiting = self._group_waiting[gi]
            waiting.discard(pid)
            if not waiting:
                self._enqueue_group(gi)
            return
        if p.grad is not None and p.grad.is_sparse and not self._sparse_as_dense:
            # As Horovod: every rank's indices and values gathered, no compression.
            self._sparse.add(pid)
            handle = sparse_allreduce_async(p.grad, name=self._names[pid], op=self._op,
                                            process_set=self._process_set)
            self._handles[pid] = (handle, ("sparse",))
            return
        grad = self._prepare_grad(p)
        compressed, ctx = self._compression.compress(grad)
        handle = mpi_ops.allreduce_async_(compressed, name=self._names[pid], op=self._op,
                                          prescale_factor=self._scales[0],
                                          postscale_factor=self._scales[1],
                                          process_set=self._process_set)
        made_on = _stream_of(p.device) if p.is_cuda else None
        self._handles[pid] = (handle, (ctx, compressed, made_on))

    def _enqueue_group(self, gi):
        members = [self._by_id[pid] for pid, g in self._groups.items() if g == gi
                   and pid in self._by_id]
        # The runtime takes the stream the copies are made on as every member's producer.
        made_on = _wait_for_streams(self._group_streams.pop(gi, []), members[0])
        compressed, ctxs = zip(*[self._compression.compress(self._prepare_grad(p))
                                 for p in members])
        handle = mpi_ops.grouped_allreduce_async_(list(compressed), name="group.%d" % gi,
                                                  op=self._op, prescale_factor=self._scales[0],
                                                  postscale_factor=self._scales[1],
                                                  process_set=self._process_set)
        first = id(members[0])
        self._handles[first] = (handle, ("group", members, ctxs, compressed, made_on))
        for p in members[1:]:
            self._handles[id(p)] = (None, None)

    def synchronize(self):
        """Completes every gradient's reduction and writes the results into ``p.grad``."""
        for p in self._requires_update:
            if id(p) not in self._handles:
                self._enqueue(p)
        if self._batch is not None:
            # As DDP on one CUDA device: the optimizer's kernels, queued on the current stream,
            # wait for the reductions on the device; the host blocks only until they are launched.
            self._batch.finish()
        pending = [(pid, handle, ctx) for pid, (handle, ctx) in self._handles.items()
                   if handle is not None]
        results = _results_in_turn([handle for _, handle, _ in pending],
                                   bool(pending) and self._by_id[pending[0][0]].is_cuda)
        for (pid, _, ctx), result in zip(pending, results):
            if ctx[0] == "sparse":
                # Sparse gradients take no set_(): the same tensor, refilled.
                self._by_id[pid].grad.zero_().add_(result)
                continue
            if ctx[0] == "group":
                _, members, ctxs, compressed, made_on = ctx
                for p, c, t in zip(members, ctxs, compressed):
                    self._write_back(p, t, c, made_on)
            else:
                self._write_back(self._by_id[pid], ctx[1], ctx[0], ctx[2])
        self._handles.clear()
        self._reset_delays()
        self._synchronized = True
        if self._remake_batch:
            # A member turned out to have sparse gradients; every rank saw it in this step.
            self._remake_batch = False
            self._batch = None
            self._batch_made = False

    def _write_back(self, p, reduced, ctx, made_on):
        result = self._compression.decompress(reduced, ctx)
        if result is not p.grad:
            p.grad.copy_(result)
        if reduced is not p.grad:
            _release_after_consumer(reduced, made_on)

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Inside, ``step()`` does not synchronize: call ``synchronize()`` yourself before it."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                # Its start is Horovod's words, which scripts and tests look for.
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "after optimizer.synchronize(): the gradients are reduced a "
                              "second time; call step() inside optimizer.skip_synchronize() "
                              "when you synchronize yourself")
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def _gradsync_local_step(self, closure=None):
        """The wrapped optimizer's own step, without synchronizing."""
        return super(self.__class__, self).step(closure)

    def add_param_group(self, param_group):
        """The wrapped optimizer's, with the group's trainable parameters reduced as the others'
        from the next backward on, their reductions named by position. Between steps, on every
        rank alike."""
        if "_requires_update" not in self.__dict__:
            # The base class's __init__ adding the groups the optimizer was wrapped with.
            return super(self.__class__, self).add_param_group(param_group)
        if self._handles or any(d != self.backward_passes_per_step for d in self._delay.values()):
            raise RuntimeError("add_param_group() was called between backward and step(): "
                               "gradients are being reduced; add the group between steps")
        super(self.__class__, self).add_param_group(param_group)
        gi = len(self.param_groups) - 1
        params = self.param_groups[gi]["params"]
        try:
            self._take_parameters(params)
        except BaseException:
            self.param_groups.pop()
            raise
        for pi, p in enumerate(params):
            self._names[id(p)] = "param.%d.%d" % (gi, pi)
            self._parameter_names[p] = self._names[id(p)]
            if p.requires_grad:
                self._requires_update.append(p)
                self._delay[id(p)] = self.backward_passes_per_step
                self._grad_accumulators.append(register_grad_ready_hook(p, self._on_grad_ready))
        return None

    def _take_parameters(self, added):
        self._by_id.update((id(p), p) for p in added if p.requires_grad)
        self._batch = None  # made again, with them, at the next gradient
        self._batch_made = False

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize(). This is "
                                 "prohibited as it can cause a race condition.")
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=mpi_ops.Average,
                         gradient_predivide_factor=1.0, num_groups=0, groups=None,
                         sparse_as_dense=False, process_set=global_process_set):
    """Wraps ``optimizer`` so that ``step()`` applies gradients reduced over every rank.

    Arguments are Horovod's: ``named_parameters`` names each gradient's allreduce (names must
    match across ranks; without them, names come from the parameter's position);
    ``backward_passes_per_step`` backward passes accumulate locally before one reduction;
    ``op`` is Average, Sum or Adasum (see ``_DistributedAdasumOptimizer``: each rank steps on
    its own gradients and the steps are combined); ``gradient_predivide_factor`` splits the average
    into a division before and after the sum; ``num_groups`` or ``groups`` (lists of parameters)
    reduce parameters together as grouped allreduces; ``sparse_as_dense`` densifies sparse
    gradients (otherwise they are reduced by gathering every rank's entries, as Horovod's
    ``sparse_allreduce_async``); ``process_set`` reduces among its members only, and a rank
    outside it steps on its own gradients.
    """
    if op not in (mpi_ops.Average, mpi_ops.Sum, mpi_ops.Adasum):
        raise ValueError("DistributedOptimizer supports op=Average, op=Sum and op=Adasum")
    if num_groups and groups is not None:
        raise ValueError("num_groups and groups are mutually exclusive")
    if backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be at least 1")
    if op == mpi_ops.Adasum:
        from gradsync.torch.adasum_optimizer import adasum_optimizer  # it imports this module
        if gradient_predivide_factor != 1.0 or num_groups or groups is not None:
            raise ValueError("op=Adasum takes no gradient_predivide_factor, num_groups or groups")
        return adasum_optimizer(optimizer, named_parameters, compression,
                                backward_passes_per_step, process_set)
    cls = _mixed_into(_DistributedOptimizer, optimizer)
    return _carry_over(optimizer, cls(
        optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
        gradient_predivide_factor, groups if groups is not None else num_groups, sparse_as_dense,
        process_set))


def _carry_over(optimizer, distributed):
    """``distributed`` with ``optimizer``'s defaults (for groups added later) and state (momentum
    loaded from a checkpoint before wrapping, say), which its class's __init__ made anew."""
    distributed.defaults = dict(optimizer.defaults)
    distributed.state.update(optimizer.state)
    return distributed
