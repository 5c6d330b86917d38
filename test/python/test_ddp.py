"""DistributedDataParallel: replicas match one process on the full batch, no_sync, join, unused
parameters and buffers behave as PyTorch DDP's do."""

import warnings
import weakref

import pytest
import torch
import torch.utils.checkpoint

import gradsync.torch as hvd

TOLERANCE = 1e-10  # float64 training; differences come only from summation order
PER_RANK = 4


def make_model():
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 4)).double()


def batch(step, rank):
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return (torch.randn(PER_RANK, 8, generator=gen, dtype=torch.float64),
            torch.randn(PER_RANK, 4, generator=gen, dtype=torch.float64))


def loss_of(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


def flat(tensors):
    return torch.cat([t.detach().flatten() for t in tensors])


def assert_replicas_equal(values):
    gathered = hvd.allgather(values.unsqueeze(0), name="ddp.replicas")
    for row in gathered:
        assert torch.equal(row, gathered[0])


def perturbed_model(rank):
    """Rank 0's weights must win at construction: the others start elsewhere."""
    model = make_model()
    if rank != 0:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    return model


def reference(size, steps, rows_of_step, divide_by):
    """One process: the gradient of sum over ranks of each rank's mean loss, over ``divide_by``."""
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        optimizer.zero_grad()
        ranks = rows_of_step(step)
        total = sum(loss_of(model, *batch(step, r)) for r in ranks)
        (total / divide_by(step, len(ranks))).backward()
        optimizer.step()
    return flat(model.parameters())


# Outside join() gradients go through the runtime's batch; inside, in DDP's buckets, which with
# every rank training reduce exactly as the batch does.
# With gradient_as_bucket_view=True they go as views into DDP's buckets instead.
@pytest.mark.parametrize("views", [False, True])
@pytest.mark.parametrize("bucket_cap_mb,joined",
                         [(25, False), (0.0002, False), (25, True), (0.0002, True)])
def test_ddp_matches_full_batch(bucket_cap_mb, joined, views, rank, size):
    model = hvd.DistributedDataParallel(perturbed_model(rank), bucket_cap_mb=bucket_cap_mb,
                                        gradient_as_bucket_view=views)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    steps = 4
    with model.join(enable=joined):
        for step in range(steps):
            optimizer.zero_grad()
            loss_of(model, *batch(step, rank)).backward()
            # backward returned: the gradients are already the same everywhere.
            assert_replicas_equal(flat(p.grad for p in model.parameters()))
            if views and not joined:
                assert all(p.grad._base is not None for p in model.parameters())
            optimizer.step()
    params = flat(model.parameters())
    assert_replicas_equal(params)
    want = reference(size, steps, lambda s: range(size), lambda s, n: size)
    assert torch.allclose(params, want, atol=TOLERANCE, rtol=0)


class CheckpointedTail(torch.nn.Module):
    """make_model()'s layers, the last one under a checkpoint. A reentrant one runs a backward of
    its own in the step's, which produces the step's first gradients; the other kind recomputes
    the layer inside the step's backward."""

    def __init__(self, reentrant):
        super().__init__()
        self.body = make_model()
        self.reentrant = reentrant

    def forward(self, x):
        hidden = self.body[1](self.body[0](x))
        return torch.utils.checkpoint.checkpoint(self.body[2], hidden,
                                                 use_reentrant=self.reentrant)


@pytest.mark.parametrize("views", [False, True])
@pytest.mark.parametrize("reentrant", [True, False])
def test_ddp_checkpoint_of_the_last_layer(reentrant, views, rank, size):
    """The step ends with the outermost backward, not with a checkpoint's inner one: every
    gradient is averaged, none left as this rank computed it."""
    model = hvd.DistributedDataParallel(CheckpointedTail(reentrant), gradient_as_bucket_view=views)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    steps = 3
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(steps):
            optimizer.zero_grad()
            loss_of(model, *batch(step, rank)).backward()
            optimizer.step()
    assert not any("got no gradient" in str(w.message) for w in caught)
    params = flat(model.parameters())
    assert_replicas_equal(params)
    want = reference(size, steps, lambda s: range(size), lambda s, n: size)
    assert torch.allclose(params, want, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("layer", ["torch", "gradsync"])
def test_ddp_warns_of_torch_sync_batch_norm(layer, size):
    """torch.nn.SyncBatchNorm without torch.distributed's process group normalizes each rank's
    batch alone: the wrapper names such layers and the fix, and is quiet about gradsync's own."""
    norm = torch.nn.SyncBatchNorm(16) if layer == "torch" else hvd.SyncBatchNorm(16)
    module = torch.nn.Sequential(torch.nn.Linear(8, 16), norm).double()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hvd.DistributedDataParallel(module)
    named = [str(w.message) for w in caught if "SyncBatchNorm" in str(w.message)]
    if layer == "torch" and size > 1:
        assert len(named) == 1 and "1 is torch.nn.SyncBatchNorm" in named[0]
        assert "convert_sync_batchnorm" in named[0]
    else:
        assert not named


def test_ddp_state_dict_and_module(rank):
    inner = make_model()
    model = hvd.DistributedDataParallel(inner)
    assert model.module is inner
    assert all(k.startswith("module.") for k in model.state_dict())


@pytest.mark.parametrize("set_to_none", [False, True])
@pytest.mark.parametrize("views", [False, True])
def test_ddp_no_sync_accumulates_locally(views, set_to_none, rank, size):
    model = hvd.DistributedDataParallel(perturbed_model(rank), gradient_as_bucket_view=views)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    steps = 3
    for step in range(steps):
        optimizer.zero_grad(set_to_none=set_to_none)
        x, y = batch(step, rank)
        with model.no_sync():
            (loss_of(model, x[:2], y[:2]) / 2).backward()
        local = flat(p.grad for p in model.parameters())
        if size > 1:
            gathered = hvd.allgather(local.unsqueeze(0), name="ddp.no_sync.local")
            assert not torch.equal(gathered[0], gathered[1])
        (loss_of(model, x[2:], y[2:]) / 2).backward()
        optimizer.step()
    params = flat(model.parameters())
    assert_replicas_equal(params)
    want = reference(size, steps, lambda s: range(size), lambda s, n: size)
    assert torch.allclose(params, want, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("divide_by_initial_world_size", [True, False])
def test_ddp_join_uneven_inputs(divide_by_initial_world_size, rank, size):
    # Rank r has one batch fewer than rank r - 1, and a BatchNorm buffer-free model.
    steps_of = [size + 1 - r for r in range(size)]
    model = hvd.DistributedDataParallel(perturbed_model(rank))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with model.join(divide_by_initial_world_size=divide_by_initial_world_size):
        for step in range(steps_of[rank]):
            optimizer.zero_grad()
            loss_of(model, *batch(step, rank)).backward()
            optimizer.step()
    # The joined ranks stopped stepping: only the longest-running replica has seen every step.
    params = flat(model.parameters())
    gathered = hvd.allgather(params.unsqueeze(0), name="ddp.join.params")
    active = lambda step: [r for r in range(size) if steps_of[r] > step]
    divisor = (lambda s, n: size) if divide_by_initial_world_size else (lambda s, n: n)
    want = reference(size, steps_of[0], active, divisor)
    assert torch.allclose(gathered[0], want, atol=TOLERANCE, rtol=0)
    # Later collectives work normally.
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum, name="ddp.after_join").item() == size


def test_ddp_batched_steps_around_a_join(rank, size):
    """Steps through the batch, a join() with uneven inputs (DDP's buckets), then the batch
    again: the ranks agree throughout and end where one process on the full batch would."""
    steps_of = [3 - min(r, 1) for r in range(size)]  # rank 0 joins last
    model = hvd.DistributedDataParallel(perturbed_model(rank))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(index):
        optimizer.zero_grad()
        loss_of(model, *batch(index, rank)).backward()
        optimizer.step()

    for index in range(2):
        step(index)
    with model.join():
        for index in range(2, 2 + steps_of[rank]):
            step(index)
    # The ranks that joined early did not step meanwhile: take rank 0's parameters and momenta,
    # as a training loop that broadcasts after an uneven epoch would.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    for index in range(5, 7):
        step(index)
    params = flat(model.parameters())
    assert_replicas_equal(params)
    active = lambda s: [r for r in range(size) if s < 2 or s >= 5 or steps_of[r] > s - 2]
    want = reference(size, 7, active, lambda s, n: size)
    assert torch.allclose(params, want, atol=TOLERANCE, rtol=0)


def test_ddp_join_throw_on_early_termination(rank, size):
    if size == 1:
        pytest.skip("needs a rank that runs out first")
    model = hvd.DistributedDataParallel(make_model())
    batches = 2 if rank == 0 else 4
    with pytest.raises(RuntimeError, match="exhausted inputs"):
        with model.join(throw_on_early_termination=True):
            for step in range(batches):
                loss_of(model, *batch(step, rank)).backward()


class Branchy(torch.nn.Module):
    """``used_on`` decides per rank whether the side branch takes part in the loss."""

    def __init__(self, used_on):
        super().__init__()
        torch.manual_seed(7)
        self.trunk = torch.nn.Linear(8, 4).double()
        self.side = torch.nn.Linear(8, 4).double()
        self.never = torch.nn.Linear(8, 4).double()
        self.used_on = used_on

    def forward(self, x):
        out = self.trunk(x)
        if self.used_on(hvd.rank()):
            out = out + self.side(x)
        return out


@pytest.mark.parametrize("views", [False, True])
@pytest.mark.parametrize("find_unused", [True, False])
def test_ddp_unused_parameters_never_hang(find_unused, views, rank, size):
    inner = Branchy(lambda r: r == 0)
    model = hvd.DistributedDataParallel(inner, find_unused_parameters=find_unused,
                                        gradient_as_bucket_view=views)
    x, y = batch(0, rank)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss_of(model, x, y).backward()
    # Used on rank 0 only: its gradient is rank 0's over the number of ranks, everywhere.
    side = inner.side.weight.grad
    assert side is not None
    assert_replicas_equal(side)
    rank0 = Branchy(lambda r: True)
    loss_of(rank0, *batch(0, 0)).backward()
    assert torch.allclose(side, rank0.side.weight.grad / size, atol=TOLERANCE, rtol=0)
    if find_unused:
        assert inner.never.weight.grad is None
    else:
        assert torch.count_nonzero(inner.never.weight.grad) == 0
        assert any("got no gradient" in str(w.message) and "never.weight" in str(w.message)
                   for w in caught)
    # Named once: the next backward leaves the same parameters unused without a warning.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss_of(model, x, y).backward()
    assert not any("got no gradient" in str(w.message) for w in caught)


class WithBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 2)
        self.register_buffer("scale", torch.ones(2))

    def forward(self, x):
        return self.linear(x) * self.scale


@pytest.mark.parametrize("broadcast_buffers", [True, False])
def test_ddp_broadcast_buffers_before_forward(broadcast_buffers, rank, size):
    inner = WithBuffer()
    model = hvd.DistributedDataParallel(inner, broadcast_buffers=broadcast_buffers)
    inner.scale.fill_(rank + 1)
    with torch.no_grad():
        model(torch.ones(1, 2))
    assert inner.scale[0].item() == rank + 1  # no backward follows: nothing is synchronized
    model(torch.ones(1, 2)).sum().backward()
    assert inner.scale[0].item() == (1 if broadcast_buffers else rank + 1)


def test_ddp_broadcasts_buffers_coalesced_by_dtype(rank, size, monkeypatch):
    """BatchNorm's buffers (float statistics, an int64 counter) reach every rank from rank 0 in
    one broadcast per dtype, as PyTorch DDP coalesces them, not one per buffer."""
    import gradsync.torch.ddp_buffers as ddp_module
    inner = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4),
                                torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    model = hvd.DistributedDataParallel(inner)
    for name, b in inner.named_buffers():
        b.fill_(rank + 1 if b.is_floating_point() else 7 * (rank + 1))
    sent = []
    real = ddp_module.broadcast_async_

    def counting(tensor, root_rank, **kwargs):
        sent.append(tensor.dtype)
        return real(tensor, root_rank, **kwargs)

    monkeypatch.setattr(ddp_module, "broadcast_async_", counting)
    model.eval()  # the statistics stay as broadcast
    model(torch.ones(2, 3)).sum().backward()
    # Alone, a rank has no one to broadcast to, and sends nothing.
    assert sorted(map(str, sent)) == ([] if size == 1 else ["torch.float32", "torch.int64"])
    for name, b in inner.named_buffers():
        want = 1 if b.is_floating_point() else 7
        assert torch.equal(b, torch.full_like(b, want)), name


def test_ddp_buffers_follow_the_lowest_running_rank_while_joined(rank, size):
    inner = WithBuffer()
    model = hvd.DistributedDataParallel(inner)
    seen = []
    with model.join():
        for step in range(1 if rank == 0 else 3):
            inner.scale.fill_(10 * step + rank)
            model(torch.ones(1, 2)).sum().backward()
            seen.append(inner.scale[0].item())
    if rank == 0:
        assert seen == [0.0]
    else:
        assert seen == [0.0] + [10 * step + 1 for step in range(1, 3)]


def test_ddp_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="group of the gradsync backend"):
        hvd.DistributedDataParallel(make_model(), process_group=object())
    with pytest.raises(ValueError, match="bucket_cap_mb"):
        hvd.DistributedDataParallel(make_model(), bucket_cap_mb=0)
    if hvd.size() == 1:
        return  # a set of rank 0 alone would be the global set
    subset = hvd.ProcessSet([0])
    hvd.add_process_set(subset)
    try:
        if hvd.rank() == 0:
            model = hvd.DistributedDataParallel(make_model(), process_set=subset)
            with pytest.raises(ValueError, match="global process set"):
                with model.join():
                    pass
    finally:
        hvd.remove_process_set(subset)


def test_ddp_gradients_start_during_backward(monkeypatch):
    """Every gradient's reduction starts from its hook, before backward ends."""
    from gradsync.torch import ddp, gradient_batch

    started = []
    at_finish = []
    original_start = gradient_batch.GradientBatch.start
    original_finish = ddp.DistributedDataParallel._finish_backward
    monkeypatch.setattr(gradient_batch.GradientBatch, "start",
                        lambda self, p, g: (started.append(id(p)), original_start(self, p, g)))
    monkeypatch.setattr(ddp.DistributedDataParallel, "_finish_backward",
                        lambda self: (at_finish.append(len(started)), original_finish(self)))
    model = hvd.DistributedDataParallel(make_model())
    loss_of(model, *batch(0, hvd.rank())).backward()
    params = list(model.parameters())
    assert sorted(started) == sorted(id(p) for p in params)
    assert at_finish == [len(params)]


def test_ddp_reduces_a_strided_gradient_through_a_contiguous_copy(rank, size):
    """A gradient accumulated into a non-contiguous tensor on rank 0 only is reduced from a
    contiguous copy, and the average is written back into its own storage."""
    model = hvd.DistributedDataParallel(make_model())
    last_bias = model.module[2].bias
    storage = None
    if rank == 0:
        storage = torch.full((last_bias.numel(), 2), 7.0, dtype=torch.float64)
        storage[:, 0] = 0.0
        last_bias.grad = storage[:, 0]  # backward accumulates into it, strided
    x, y = batch(0, rank)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyTorch's note on the gradient's layout
        loss_of(model, x, y).backward()
    assert_replicas_equal(last_bias.grad.contiguous())
    plain = make_model()
    (sum(loss_of(plain, *batch(0, r)) for r in range(size)) / size).backward()
    assert torch.allclose(last_bias.grad, plain[2].bias.grad, atol=TOLERANCE, rtol=0)
    if rank == 0:
        assert last_bias.grad.data_ptr() == storage.data_ptr()
        assert torch.equal(storage[:, 1], torch.full_like(last_bias, 7.0))


class WithEmbedding(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.linear = torch.nn.Linear(4, 1)
        self.embedding = torch.nn.Embedding(10, 4, sparse=True)

    def forward(self, x):
        return self.linear(self.embedding(x))


def test_ddp_refuses_a_sparse_gradient_and_then_its_unfinished_step(rank, size):
    """A sparse gradient fails backward with its reason; the wrapper then refuses to go on with
    the reductions of that step half started, rather than mixing them into the next."""
    model = hvd.DistributedDataParallel(WithEmbedding())
    x = torch.tensor([[1, 2], [3, 4]])
    with pytest.raises(ValueError, match="sparse"):
        model(x).sum().backward()
    with pytest.raises(RuntimeError, match="did not finish"):
        model(x)


def test_gradient_batch_refuses_a_gradient_of_another_size():
    """A parameter replaced by one of another shape after the batch was made: its gradient is
    refused before anything starts, not reduced over memory it does not have."""
    from gradsync.torch.gradient_batch import GradientBatch

    p = torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))
    batch_of_one = GradientBatch([p], ["ddp.test.refused"], 1, 1.0, 1.0, 0)
    with pytest.raises(ValueError, match="4 elements"):
        batch_of_one.start(p, torch.zeros(6, dtype=torch.float64))
    assert batch_of_one.in_flight() == 0
    batch_of_one.finish()  # nothing to wait for


def test_gradient_batch_interrupted_before_its_wait_can_take_the_next_step(rank, size,
                                                                            monkeypatch):
    """A KeyboardInterrupt in finish() before the runtime's wait: the step's reductions are
    waited for (they still write into the gradients), and the next step starts and finishes."""
    import time
    from gradsync.torch import gradient_batch

    p = torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))
    batch = gradient_batch.GradientBatch([p], ["ddp.test.interrupted"], 0, 1.0, 1.0, 0)  # a sum
    if rank == 1:
        time.sleep(0.3)  # rank 0's reduction is still in flight when it is interrupted
    grad = torch.full((4,), float(rank + 1), dtype=torch.float64)
    batch.start(p, grad)

    def interrupted(_):
        raise KeyboardInterrupt

    monkeypatch.setattr(batch, "_consumer", "cuda:0")
    monkeypatch.setattr(gradient_batch, "_stream_of", interrupted)
    with pytest.raises(KeyboardInterrupt):
        batch.finish()
    assert batch.in_flight() == 0
    assert torch.equal(grad, torch.full((4,), size * (size + 1) / 2, dtype=torch.float64))
    monkeypatch.undo()
    again = torch.ones(4, dtype=torch.float64)
    batch.start(p, again)
    batch.finish()
    assert torch.equal(again, torch.full((4,), float(size), dtype=torch.float64))


def test_ddp_buckets_leave_during_backward(monkeypatch):
    """With compression gradients go in DDP's buckets: with small buckets, most allreduces are
    enqueued before backward ends, not after."""
    from gradsync.torch import ddp

    launched = []
    at_finish = []
    original_launch = ddp.DistributedDataParallel._launch
    original_finish = ddp.DistributedDataParallel._finish_backward
    monkeypatch.setattr(ddp.DistributedDataParallel, "_launch",
                        lambda self, b: (launched.append(b.index), original_launch(self, b)))
    monkeypatch.setattr(ddp.DistributedDataParallel, "_finish_backward",
                        lambda self: (at_finish.append(len(launched)), original_finish(self)))
    model = hvd.DistributedDataParallel(make_model(), bucket_cap_mb=0.0001,
                                        compression=hvd.Compression.fp16)
    loss_of(model, *batch(0, hvd.rank())).backward()
    buckets = len(model._buckets)
    assert buckets >= 3
    assert sorted(launched) == list(range(buckets))
    assert at_finish == [buckets]  # every bucket was complete, and enqueued, before the end


def test_ddp_hooks_do_not_keep_the_wrapper_alive(rank, size):
    """Autograd keeps the gradient hooks: they must hold the wrapper weakly, or a wrapper dropped
    on every rank would live on until the garbage collector ran, at another moment on each."""
    inner = make_model()
    model = hvd.DistributedDataParallel(inner)
    gone = weakref.ref(model)
    del model
    assert gone() is None
    loss_of(inner, *batch(0, rank)).backward()  # the orphaned hooks do nothing
    assert all(p.grad is not None for p in inner.parameters())


class WithExtraState(torch.nn.Linear):
    def get_extra_state(self):
        return {"version": 1}

    def set_extra_state(self, state):
        pass


def test_ddp_takes_a_module_with_extra_state(rank, size):
    torch.manual_seed(rank)
    module = WithExtraState(2, 2)
    hvd.DistributedDataParallel(module)
    root = hvd.broadcast(module.weight.detach().clone(), 0, name="extra.weight")
    assert torch.equal(module.weight.detach(), root)


def test_ddp_broadcasts_non_persistent_buffers_when_made(rank, size):
    module = torch.nn.Linear(2, 2)
    module.register_buffer("projection", torch.full((3,), float(rank)), persistent=False)
    hvd.DistributedDataParallel(module, broadcast_buffers=False)
    assert torch.equal(module.projection, torch.zeros(3))
