"""DistributedDataParallel: PyTorch DDP's module wrapper, with gradsync doing the communication.

Thread safety: like PyTorch's DDP, one wrapper serves one training loop on one thread.
"""

import contextlib
import warnings

import torch

from gradsync import _core
from gradsync.torch.allreduce import allreduce_async_, grouped_allreduce_async_
from gradsync.torch.bucket_views import BucketViews
from gradsync.torch.comm_hooks import HookRunner, gradsync_form_of
from gradsync.torch.compression import Compression, compression_of_comm_hook
from gradsync.torch.ddp_buckets import buckets_of
from gradsync.torch.ddp_buffers import broadcast_buffers, hand_over_buffers
from gradsync.torch.ddp_join import JoinState
from gradsync.torch.functions import broadcast_parameters
from gradsync.torch.grad_hooks import (_weakly, accumulator_of, queue_end_of_backward,
                                       register_grad_ready_hook)
from gradsync.torch.gradient_batch import GradientBatch
from gradsync.torch.handles import _results_in_turn, synchronize
from gradsync.torch.process_group import process_set_of_group
from gradsync.torch.process_sets import _collective_prefix, _id_of, global_process_set
from gradsync.torch.sync_batch_norm import warn_of_torch_sync_batch_norm
from gradsync.torch.wire import (_CORE_OPS, Average, Sum, _note_producer, _release_after_consumer,
                                 _wait_for_streams)


def _first_rank(process_set):
    """The global rank of the set's first member, DDP's rank 0 (broadcasts name global roots)."""
    return min(_core.process_set_ranks(process_set._require_id()))


def _tensors_in(output):
    """The tensors of a module's output: itself, or inside tuples, lists and dicts (Hugging Face
    model outputs are dicts)."""
    if isinstance(output, torch.Tensor):
        yield output
    elif isinstance(output, (tuple, list)):
        for item in output:
            yield from _tensors_in(item)
    elif isinstance(output, dict):
        for item in output.values():
            yield from _tensors_in(item)


def _held_gradient(param):
    """What a parameter that backward did not reach contributes: a copy of the gradient it holds
    (accumulated under ``no_sync()``), so that it keeps its own where no rank used it, or zeros."""
    grad = param.grad
    if grad is None:
        return torch.zeros_like(param, memory_format=torch.contiguous_format)
    if grad.is_sparse:
        raise ValueError("DistributedDataParallel does not reduce sparse gradients "
                         "(parameter of shape %s)" % (tuple(param.shape),))
    return grad.detach().clone(memory_format=torch.contiguous_format)


class DistributedDataParallel(torch.nn.Module):
    """Wraps ``module`` so that backward leaves every gradient averaged over the ranks.

    As with PyTorch's DDP: rank 0's parameters and buffers are broadcast at construction and, with
    ``broadcast_buffers``, its buffers again before each forward that will be followed by a
    synchronized backward. Each gradient's reduction starts from a hook as soon as backward
    produces it, and ``loss.backward()`` returns only once every gradient is reduced (on one CUDA
    device: once every reduction is launched, the current stream waiting for them, as DDP does),
    so ``optimizer.step()`` sees the averaged gradients. ``no_sync()`` accumulates locally;
    ``join()`` lets ranks with fewer batches finish early.

    Gradients travel as ``DistributedOptimizer``'s do, through one batch of the runtime
    (``gradsync.torch.gradient_batch``): a hook hands over two integers, small gradients share
    buckets laid out once, larger ones are fused by the runtime as they arrive (its fusion
    threshold, 25 MiB on a GPU, plays ``bucket_cap_mb``'s part), and the gradients are reduced in
    place. With ``gradient_as_bucket_view=True``, as in DDP, the gradients become views into
    flat buckets of ``bucket_cap_mb`` (``gradsync.torch.bucket_views``), each reduced in place as
    one tensor once complete: one operation a bucket, and no copies (a gradient that
    ``zero_grad()`` set to None is its view again before backward). With ``compression`` and
    inside ``join()`` gradients go instead in DDP's buckets, each one grouped allreduce; with a
    communication hook (``register_comm_hook``), in DDP's buckets handed to the hook.

    Parameters that took no part in this backward never hang it: every gradient is reduced in
    every synchronized backward, a missing one counting as the gradient it holds (accumulated
    under ``no_sync()``) or zeros. With ``find_unused_parameters=True`` a gradient that no rank
    produced since the last synchronized backward is left as it was (``None`` stays ``None``), as
    DDP leaves it; without, it is reduced and a warning names it once.

    ``device_ids``, ``output_device``, ``dim``, ``check_reduction`` and ``static_graph`` are
    accepted for DDP's signature and change nothing here: the module stays on its device and is
    called with the inputs as they are. ``process_group`` may be a ``torch.distributed`` group of
    the gradsync backend (``gradsync.torch.process_group``), which stands for its process set.
    Beyond DDP, ``process_set`` restricts the replicas to a process set and ``compression``
    compresses gradients on the wire.
    The wrappers of one process set must be created in the same order on each of its ranks: their
    collectives are named after that order.
    """

    def __init__(self, module, device_ids=None, output_device=None, dim=0,
                 broadcast_buffers=True, process_group=None, bucket_cap_mb=25,
                 find_unused_parameters=False, check_reduction=False,
                 gradient_as_bucket_view=False, static_graph=False,
                 process_set=global_process_set, compression=Compression.none):
        super().__init__()
        del device_ids, output_device, dim, check_reduction, static_graph
        if process_group is not None:
            if process_set is not global_process_set:
                raise ValueError("give DistributedDataParallel a process_group or a process_set, "
                                 "not both")
            process_set = process_set_of_group(process_group)
        if bucket_cap_mb is None or bucket_cap_mb <= 0:
            raise ValueError("bucket_cap_mb must be positive")
        if not _core.is_initialized():
            raise ValueError("gradsync is not initialized: call gradsync.torch.init() first")
        self.module = module
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.process_set = process_set
        self.compression = compression
        self.require_backward_grad_sync = True
        self._prefix = _collective_prefix("ddp", process_set)

        # Parameters shared between submodules appear once in parameters().
        self._params = [p for p in module.parameters() if p.requires_grad]
        self._buffers_to_sync = list(module.named_buffers())
        self._buckets = buckets_of(self._params, int(bucket_cap_mb * 1024 * 1024))
        self._bucket_of = {id(p): b for b in self._buckets for p in b.params}
        self._param_index = {id(p): i for i, p in enumerate(self._params)}
        self._sync_next_backward = False
        self._in_backward = False
        self._batched_backward = False  # this backward's gradients go through self._gradients
        self._started = set()  # ids of the parameters started in the batch in this backward
        self._join = None
        self._comm_hook = None
        self._hooks = None  # the HookRunner of a hook of the script's own
        self._warned_unused = set()
        # Parameters whose gradient backward accumulated under no_sync() since the last
        # synchronized backward: that one reduces what they hold, even where it did not touch them.
        self._accumulated = set()
        self._views = self._make_views() if gradient_as_bucket_view else None
        self._gradients = self._make_batch() if self._views is None else None

        self._root = _first_rank(process_set)
        # Parameters and buffers, as PyTorch DDP: not state_dict(), which leaves out buffers
        # registered with persistent=False and may hold a module's extra state (not a tensor).
        states = {**dict(module.named_parameters()), **dict(self._buffers_to_sync)}
        broadcast_parameters(sorted(states.items()), root_rank=self._root,
                             process_set=process_set)
        self._hook_handles = [register_grad_ready_hook(p, self._on_grad_ready)
                              for p in self._params]
        # In backward's order, roughly, so that the first looked at is usually reached.
        self._accumulators = [accumulator_of(p) for p in reversed(self._params)]
        warn_of_torch_sync_batch_norm(module, process_set)

    # ------------------------------------------------------------------------------------------
    # forward

    def forward(self, *inputs, **kwargs):
        if self._in_backward:
            # Its end never ran: some of its reductions are under way, others never started.
            raise RuntimeError("DistributedDataParallel: the previous synchronized backward pass "
                               "did not finish (it raised); this rank's reductions are "
                               "incomplete, so the wrapper cannot be used again: make a new one "
                               "on every rank")
        will_sync = torch.is_grad_enabled() and self.require_backward_grad_sync
        if self._join is not None and will_sync:
            self._join.count_active_ranks(self.process_set, self._prefix)
        if will_sync and self.broadcast_buffers and self._buffers_to_sync:
            self._sync_buffers()
        if will_sync:
            # Only the backward's end clears it: a forward in between under no_grad() or
            # no_sync() (a target network's, say) leaves the backward this one prepared averaged,
            # as PyTorch DDP does.
            self._sync_next_backward = True
        if will_sync and self._views is not None and self._join is None:
            self._views.prefill()  # backward then accumulates into the buckets
        output = self.module(*inputs, **kwargs)
        if will_sync:
            # The output's gradient is the backward's first: a hook there queues the step's end on
            # the outermost backward, even when a reentrant checkpoint runs a backward of its own
            # inside it, before any parameter's gradient (the hooks below also queue it, for a
            # loss that does not go through the output).
            for tensor in _tensors_in(output):
                if tensor.requires_grad and tensor.grad_fn is not None:
                    tensor.register_hook(_weakly(self._on_output_grad))
        return output

    def _sync_buffers(self):
        if self.process_set.size() == 1:
            return  # from the only rank to itself: nothing would change
        buffers = [b for _, b in self._buffers_to_sync]
        if self._join is None:
            broadcast_buffers(buffers, self._root, self._prefix, self.process_set)
        else:
            hand_over_buffers(buffers, self._join.active_ranks[0], self._prefix,
                              self.process_set)

    # ------------------------------------------------------------------------------------------
    # backward

    def _make_batch(self):
        """The batch every gradient goes through outside ``join()``, or None where the buckets
        carry them: with compression or a communication hook, and for a parameter the runtime
        cannot carry, whose bucket then reports its dtype or device as unsupported."""
        if (self.compression is not Compression.none or self._hooks is not None
                or not self._params
                or not all(GradientBatch.carries(p) for p in self._params)):
            return None
        # In backward's order, roughly: the reverse of registration.
        ordered = list(reversed(self._params))
        names = ["%s.grad.%d" % (self._prefix, self._param_index[id(p)]) for p in ordered]
        return GradientBatch(ordered, names, _CORE_OPS[Average], 1.0, 1.0,
                             _id_of(self.process_set))

    def _make_views(self):
        """The buckets as flat tensors whose slices become the gradients, or None (with a
        warning) where they cannot be: with compression, or parameters that are not contiguous
        or have a dtype the runtime does not carry. A communication hook is given the buckets
        themselves."""
        if not self._params:
            return None
        if self.compression is Compression.none and BucketViews.fit(self._buckets):
            return BucketViews(self._buckets, self._prefix, _id_of(self.process_set),
                               self._hooks)
        warnings.warn("DistributedDataParallel: gradient_as_bucket_view=True needs no compression "
                      "and, in each bucket, contiguous parameters of one dtype and device; the "
                      "gradients are reduced as without it")
        return None

    def _begin_backward(self):
        """Queues the end of this synchronized backward, once."""
        if self._in_backward:
            return
        self._in_backward = True
        carrier = self._views if self._views is not None else self._gradients
        self._batched_backward = carrier is not None and self._join is None
        queue_end_of_backward(self._finish_backward)

    def _on_output_grad(self, grad):
        del grad  # left as it is
        if self._sync_next_backward and self._backward_reaches_parameters():
            self._begin_backward()

    def _backward_reaches_parameters(self):
        """Whether the backward pass under way will accumulate into some parameter's gradient:
        ``torch.autograd.grad`` through the output (a gradient penalty's) will not, and must leave
        the step to the ``backward()`` that follows, as DDP's hooks on the accumulators do."""
        will_run = getattr(torch._C, "_will_engine_execute_node", None)
        if will_run is None:
            return True
        try:
            return any(will_run(node) for node in self._accumulators)
        except RuntimeError:
            # PyTorch refuses to answer for an accumulator that torch.autograd.grad takes as an
            # input (a gradient with respect to the parameters): it accumulates nothing either.
            return False

    def _on_grad_ready(self, p):
        if not self._sync_next_backward:
            self._accumulated.add(id(p))
            return
        self._begin_backward()
        if self._batched_backward:
            self._start_in_batch(p)
            return
        bucket = self._bucket_of[id(p)]
        bucket.ready.add(id(p))
        if p.is_cuda:
            _note_producer(bucket.streams, p.device)
        if len(bucket.ready) == len(bucket.params):
            self._launch(bucket)

    def _start_in_batch(self, p):
        pid = id(p)
        if pid in self._started:
            # Its reduction is under way in place: a second accumulation into the gradient
            # would race with it (a parameter in several reentrant checkpointed segments does
            # this; PyTorch DDP raises too).
            raise RuntimeError("DistributedDataParallel: the gradient of a parameter of shape %s "
                               "was produced twice in one backward pass" % (tuple(p.shape),))
        grad = p.grad
        if grad is None:
            return  # reduced as zeros once backward is over
        if grad.is_sparse:
            raise ValueError("DistributedDataParallel does not reduce sparse gradients "
                             "(parameter of shape %s)" % (tuple(p.shape),))
        if self._views is not None:
            self._views.ready(p, grad)
        else:
            self._gradients.start(p, grad)
        self._started.add(pid)

    def _op_and_scale(self):
        join = self._join
        if join is None or join.divide_by_initial_world_size or join.active_ranks is None:
            return Average, 1.0
        return Sum, 1.0 / len(join.active_ranks)

    def _launch(self, bucket):
        """Enqueues the bucket's gradients, zeros standing in for those backward did not make."""
        # The runtime takes the stream the copies are made on as every gradient's producer.
        made_on = _wait_for_streams(bucket.streams, bucket.params[0])
        grads = self._bucket_gradients(bucket)
        if self._hooks is not None:
            self._hooks.ready(bucket.index, bucket.params, grads)
            bucket.launched = (None, None, made_on)
            return
        compressed, contexts = zip(*map(self.compression.compress, grads))
        op, postscale = self._op_and_scale()
        handle = grouped_allreduce_async_(list(compressed),
                                          name="%s.bucket%d" % (self._prefix, bucket.index),
                                          op=op, postscale_factor=postscale,
                                          process_set=self.process_set)
        bucket.launched = (handle, list(zip(bucket.params, compressed, contexts)), made_on)

    @staticmethod
    def _bucket_gradients(bucket):
        """The bucket's gradients, contiguous; for those backward did not make, a copy of the
        gradient the parameter holds (accumulated under ``no_sync()``) or zeros."""
        grads = []
        ready = bucket.ready
        for p in bucket.params:
            if id(p) not in ready:
                grads.append(_held_gradient(p))
                continue
            # Read once: each read of .grad goes through PyTorch's attribute machinery.
            grad = p.grad
            if grad is None:
                grads.append(torch.zeros_like(p, memory_format=torch.contiguous_format))
            elif grad.is_sparse:
                raise ValueError("DistributedDataParallel does not reduce sparse gradients "
                                 "(parameter of shape %s)" % (tuple(p.shape),))
            else:
                grads.append(grad if grad.is_contiguous() else grad.contiguous())
        return grads

    def _finish_backward(self):
        """Runs once backward is over: reduces what is left, waits, writes ``p.grad``."""
        try:
            produced = (self._started if self._batched_backward else
                        {pid for b in self._buckets for pid in b.ready})
            # As DDP counts use over a no_sync() session: a gradient accumulated there and not
            # touched now is still this rank's to average.
            used = produced | self._accumulated if self._accumulated else produced
            usage = self._launch_usage(used) if self.find_unused_parameters else None
            locally_unused = [p for p in self._params if id(p) not in produced]
            if self._batched_backward:
                written = self._finish_batch(locally_unused)
            else:
                written = self._finish_buckets()
            used_anywhere = synchronize(usage).tolist() if usage is not None else None
            for p, reduced in written:
                if used_anywhere is None or used_anywhere[self._param_index[id(p)]]:
                    self._write_grad(p, reduced)
            if not self.find_unused_parameters:
                self._warn_unused(locally_unused)
        finally:
            for bucket in self._buckets:
                bucket.ready.clear()
                bucket.streams.clear()
                bucket.launched = None
            self._started.clear()
            self._accumulated.clear()
            self._in_backward = False
            self._sync_next_backward = False

    def _finish_batch(self, locally_unused):
        """Starts the parameters backward did not reach, each as a copy of the gradient it holds
        or as zeros, and completes the batch; returns those copies, reduced, to be written where
        some rank used the parameter."""
        if self._views is not None:
            return self._views.finish(locally_unused, self.find_unused_parameters)
        stand_ins = []
        for p in locally_unused:
            held = _held_gradient(p)
            self._gradients.start(p, held)
            stand_ins.append((p, held))
        self._gradients.finish()
        return stand_ins

    def _finish_buckets(self):
        """Launches the buckets not yet complete and waits for every one; returns each
        parameter's reduced gradient."""
        for bucket in self._buckets:
            if bucket.launched is None:
                self._launch(bucket)
        if self._hooks is not None:
            written = self._hooks.finish()
            for index, p, reduced in written:
                _release_after_consumer(reduced, self._buckets[index].launched[2])
            return [(p, reduced) for _, p, reduced in written]
        results = _results_in_turn([bucket.launched[0] for bucket in self._buckets],
                                   bool(self._buckets) and self._buckets[0].params[0].is_cuda)
        written = []
        for bucket, _ in zip(self._buckets, results):
            _, members, made_on = bucket.launched
            for p, reduced, context in members:
                written.append((p, self.compression.decompress(reduced, context)))
                if reduced is not p.grad:
                    _release_after_consumer(reduced, made_on)
        return written

    def _launch_usage(self, produced):
        """Enqueues the count of ranks that produced each gradient in this backward."""
        used = torch.tensor([int(id(p) in produced) for p in self._params], dtype=torch.int32)
        return allreduce_async_(used, name="%s.used" % self._prefix, op=Sum,
                                process_set=self.process_set)

    @staticmethod
    def _write_grad(p, reduced):
        if p.grad is None:
            p.grad = reduced
        elif reduced is not p.grad:
            p.grad.copy_(reduced)

    def _warn_unused(self, params):
        # Called after every backward: the names are looked up only for a parameter not yet
        # warned about (the walk over the module's parameters cost a backward of 100 linear
        # layers 180 us, 0.9 us per gradient, every step).
        fresh = [p for p in params if id(p) not in self._warned_unused]
        if not fresh:
            return
        names = {id(p): n for n, p in self.module.named_parameters()}
        new = [names.get(id(p), "?") for p in fresh]
        self._warned_unused.update(id(p) for p in params)
        warnings.warn("DistributedDataParallel: these parameters got no gradient in this "
                      "backward on this rank and were reduced as zeros (or as the gradient "
                      "they held): %s. Pass "
                      "find_unused_parameters=True to leave the gradients of parameters that "
                      "no rank used untouched." % ", ".join(new))

    def register_comm_hook(self, state, hook):
        """Reduces each bucket with ``hook(state, bucket)`` (``gradsync.torch.comm_hooks``), as
        PyTorch DDP does. DDP's built-in hooks become compressions: ``allreduce_hook`` (none),
        ``fp16_compress_hook`` and ``bf16_compress_hook`` (gradients travel in that dtype), whose
        ``state`` (DDP's process group) is unused: the wrapper's ``process_set`` plays its part.
        DDP's ``powerSGD_hook`` and ``batched_powerSGD_hook`` run as gradsync's
        (``gradsync.torch.powersgd``), with the ``PowerSGDState`` given, and DDP's
        ``post_localSGD_hook`` as ``gradsync.torch.local_sgd``'s. As under DDP, every rank
        registers the same, once, before its first backward."""
        if not callable(hook):
            raise TypeError("register_comm_hook takes a callable hook, not %r" % (hook,))
        if self._comm_hook is not None:
            raise RuntimeError("register_comm_hook can only be called once")
        if self._in_backward:
            raise RuntimeError("register_comm_hook was called during a backward pass")
        compression = compression_of_comm_hook(hook)
        self._comm_hook = hook
        if compression is None:
            self._hooks = HookRunner(state, gradsync_form_of(hook), self._prefix,
                                     self.process_set, len(self._buckets))
        elif compression is self.compression:
            return
        else:
            self.compression = compression
        if self._views is not None:
            self._views = self._make_views()  # with the hook, or None with the warning why
        self._gradients = self._make_batch() if self._views is None else None

    # ------------------------------------------------------------------------------------------
    # no_sync and join

    @contextlib.contextmanager
    def no_sync(self):
        """Inside, backward accumulates gradients locally; the first synchronized backward after
        reduces what accumulated."""
        previous = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    @contextlib.contextmanager
    def join(self, divide_by_initial_world_size=True, enable=True,
             throw_on_early_termination=False):
        """Wraps a training loop in which ranks may have different numbers of batches.

        A rank that leaves the loop first waits at the end of the context, taking part in the
        others' gradient allreduces with zeros, until every rank has left it. Gradients are
        averaged over all ranks (``divide_by_initial_world_size``, DDP's default) or over those
        still training. With ``throw_on_early_termination`` every rank raises instead, as soon as
        one has run out.
        """
        if not enable:
            yield
            return
        if self.process_set is not global_process_set:
            raise ValueError("join() covers the global process set only")
        self._join = JoinState(divide_by_initial_world_size, throw_on_early_termination)
        state = self._join
        failed = False
        try:
            yield
        except BaseException:
            failed = True
            raise
        finally:
            self._join = None
            state.end(failed, self._prefix)
