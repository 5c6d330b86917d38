"""DistributedOptimizer(op=Adasum): Horovod's Adasum optimizer, which combines the ranks' steps."""

import contextlib

import torch

from gradsync import _core
from gradsync.torch import mpi_ops
from gradsync.torch.grad_hooks import register_grad_ready_hook
from gradsync.torch.optimizer import (_carry_over, _DistributedOptimizer, _mixed_into,
                                      _names_of)
from gradsync.torch.process_sets import global_process_set


class _DistributedAdasumOptimizer:
    """Mixed into the wrapped optimizer's own class, as the plain form is.

    Adasum combines what each rank's optimizer would do alone, not the gradients: once
    ``backward_passes_per_step`` passes have accumulated into a parameter's gradient, its hook
    takes the wrapped optimizer's step for that parameter only (momentum and the like kept per rank,
    from the rank's own gradients), turns the parameter into the change the step made, and
    enqueues the change's Adasum at once, so that the combination overlaps the rest of backward.
    ``step()`` waits for each combined change and sets the parameter to where it stood plus that
    change; every rank ends the step with the same parameters. A parameter that had no gradient
    on a rank takes part with no change there.

    Adasum combines floating-point parameters, on the host or on a GPU (whose changes the runtime
    combines on the host: docs/user_guide.md, "Adasum"), over a process set of a power-of-two
    size; a rank outside ``process_set`` steps on its own. As under Horovod, the step happens in
    backward, so nothing between backward and ``step()`` changes it (gradient clipping, a
    ``GradScaler``'s unscaling), ``synchronize()`` does nothing and ``skip_synchronize()`` raises.
    """

    def __init__(self, params, named_parameters, compression, backward_passes_per_step,
                 process_set):
        super(self.__class__, self).__init__(params)
        all_params = [p for g in self.param_groups for p in g["params"]]
        if isinstance(self, torch.optim.LBFGS):
            raise ValueError("op=Adasum steps each parameter alone, which LBFGS cannot do")
        self._take_parameters(all_params)
        # Checked here where it can be (after init()); the enqueue refuses it otherwise.
        set_size = 1
        if _core.is_initialized() and process_set.process_set_id is not None:
            set_size = process_set.size() if process_set.included() else 1
        if set_size & (set_size - 1):
            raise ValueError("op=Adasum needs a process set of a power-of-two size, not %d"
                             % set_size)
        self._names = _names_of(self.param_groups, named_parameters)
        self._parameter_names = {p: self._names[id(p)] for p in all_params}
        self._compression = compression
        self._process_set = process_set
        self.backward_passes_per_step = backward_passes_per_step
        self._requires_update = [p for p in all_params if p.requires_grad]
        self._starts = {}  # parameter id -> where it stood before the step
        self._handles = {}  # parameter id -> (handle, compression context, enqueued tensor)
        self._delay = {}
        self._is_member = None
        self._reset_delays()
        self._grad_accumulators = [register_grad_ready_hook(p, self._on_grad_ready)
                                   for p in self._requires_update]

    @staticmethod
    def _take_parameters(added):
        not_floating = [p for p in added if not p.is_floating_point()]
        if not_floating:
            raise ValueError("op=Adasum combines floating-point parameters, not %s"
                             % not_floating[0].dtype)

    add_param_group = _DistributedOptimizer.add_param_group

    def _reset_delays(self):
        for p in self._requires_update:
            self._delay[id(p)] = self.backward_passes_per_step

    def _on_grad_ready(self, p):
        delay = self._delay[id(p)]
        if delay <= 0:
            raise AssertionError(
                "Gradients were computed more than backward_passes_per_step times before "
                "call to step(). Increase backward_passes_per_step to accumulate gradients "
                "locally.")
        self._delay[id(p)] = delay - 1
        if delay == 1:
            self._enqueue(p)

    _member = _DistributedOptimizer._member

    def _enqueue(self, p):
        start = self._starts.get(id(p))
        if start is None:
            start = self._starts[id(p)] = torch.empty_like(p, requires_grad=False)
        with torch.no_grad():
            start.copy_(p)
            self._step_only(p)
            if not self._member():
                self._handles[id(p)] = (None, None, None)
                return
            # The step's change, combined in place where the parameter is contiguous.
            change = p.sub_(start) if p.is_contiguous() else (p - start).contiguous()
            try:
                compressed, ctx = self._compression.compress(change)
                handle = mpi_ops.allreduce_async_(
                    compressed, name="adasum." + self._names[id(p)], op=mpi_ops.Adasum,
                    process_set=self._process_set)
            except BaseException:
                p.copy_(start)  # back where it stood: the step did not happen
                raise
        self._handles[id(p)] = (handle, ctx, compressed)

    def _step_only(self, p):
        """The wrapped optimizer's step with ``p`` as its only parameter."""
        kept = [group["params"] for group in self.param_groups]
        try:
            for group in self.param_groups:
                group["params"] = [q for q in group["params"] if q is p]
            super(self.__class__, self).step()
        finally:
            for group, params in zip(self.param_groups, kept):
                group["params"] = params

    def synchronize(self):
        """Nothing: the step applies the combined changes (Horovod's Adasum optimizer's rule)."""

    @contextlib.contextmanager
    def skip_synchronize(self):
        raise AssertionError("Skipping synchronization is not supported when using Adasum "
                             "optimizer.")
        yield  # pylint: disable=unreachable

    def _apply_changes(self):
        """Steps and enqueues what backward did not, and applies every combined change."""
        for p in self._requires_update:
            if id(p) not in self._handles:
                self._enqueue(p)
        by_id = {id(p): p for p in self._requires_update}
        for pid, (handle, ctx, _) in self._handles.items():
            if handle is None:
                continue  # outside the process set: the local step stands
            change = self._compression.decompress(mpi_ops.synchronize(handle), ctx)
            with torch.no_grad():
                by_id[pid].copy_(self._starts[pid].add_(change))
        self._handles.clear()
        self._reset_delays()

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        self._apply_changes()
        return loss

    # Refused while changes are in flight, as the plain form refuses it.
    zero_grad = _DistributedOptimizer.zero_grad


def adasum_optimizer(optimizer, named_parameters, compression, backward_passes_per_step,
                     process_set=global_process_set):
    """``optimizer``'s class with the Adasum mixin, over its parameter groups."""
    cls = _mixed_into(_DistributedAdasumOptimizer, optimizer)
    return _carry_over(optimizer, cls(optimizer.param_groups, named_parameters, compression,
                                      backward_passes_per_step, process_set))
