"""DistributedOptimizer(op=Adasum): Horovod's Adasum optimizer, which combines the ranks' steps."""

import torch

from gradsync.torch import mpi_ops
from gradsync.torch.grad_hooks import register_grad_ready_hook
from gradsync.torch.optimizer import _names_of
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

    Adasum combines host tensors (parameters on the CPU), over a process set of a power-of-two
    size; a rank outside ``process_set`` steps on its own.
    """

    def __init__(self, params, named_parameters, compression, backward_passes_per_step,
                 process_set):
        super(self.__class__, self).__init__(params)
        all_params = [p for g in self.param_groups for p in g["params"]]
        on_device = [p for p in all_params if p.device.type != "cpu"]
        if on_device:
            raise ValueError("op=Adasum combines host tensors; %d parameters are on %s"
                             % (len(on_device), on_device[0].device))
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

    def _member(self):
        if self._is_member is None:
            self._is_member = self._process_set.included()
        return self._is_member

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
            p.sub_(start)  # the step's change, combined in place
            compressed, ctx = self._compression.compress(p)
            handle = mpi_ops.allreduce_async_(compressed, name="adasum." + self._names[id(p)],
                                              op=mpi_ops.Adasum, process_set=self._process_set)
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
        self.synchronize()
        return loss

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize(). This is "
                                 "prohibited as it can cause a race condition.")
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def adasum_optimizer(optimizer, named_parameters, compression, backward_passes_per_step,
                     process_set=global_process_set):
    """``optimizer``'s class with the Adasum mixin, over its parameter groups."""
    methods = {k: v for k, v in _DistributedAdasumOptimizer.__dict__.items()
               if k not in ("__dict__", "__weakref__")}
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), methods)
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
               process_set)
