"""DistributedOptimizer: replicas stay identical and match one process on the full batch."""

import gc
import os
import weakref

import pytest
import torch

import gradsync.torch as hvd

TOLERANCE = 1e-5  # float64 training; differences come only from summation order


def make_model():
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 4)).double()


def full_batch(step, size, per_rank=4):
    gen = torch.Generator().manual_seed(step)
    x = torch.randn(size * per_rank, 8, generator=gen, dtype=torch.float64)
    y = torch.randn(size * per_rank, 4, generator=gen, dtype=torch.float64)
    return x, y


def reference_training(size, steps, optimizer_class, **kwargs):
    model = make_model()
    optimizer = optimizer_class(model.parameters(), **kwargs)
    for step in range(steps):
        x, y = full_batch(step, size)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def assert_replicas_equal(params):
    gathered = hvd.allgather(params.unsqueeze(0), name="replicas")
    for row in gathered:
        assert torch.equal(row, gathered[0])


@pytest.mark.parametrize("optimizer_class,kwargs", [
    (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
    (torch.optim.Adam, {"lr": 0.01}),
])
@pytest.mark.parametrize("passes", [1, 2])
@pytest.mark.parametrize("set_to_none", [False, True])  # True: PyTorch 2's zero_grad() default
def test_distributed_optimizer_matches_full_batch(optimizer_class, kwargs, passes, set_to_none,
                                                  rank, size):
    steps = 5
    model = make_model()
    # Rank 0's weights win; perturb the others' first to prove the broadcast.
    if rank != 0:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    optimizer = optimizer_class(model.parameters(), **kwargs)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         backward_passes_per_step=passes)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    for step in range(steps):
        x, y = full_batch(step, size)
        mine = slice(rank * 4, rank * 4 + 4)
        optimizer.zero_grad(set_to_none=set_to_none)
        # The local batch is split into `passes` parts whose gradients accumulate; the loss is
        # scaled so the sum over parts and the average over ranks give the full-batch mean.
        for part in torch.chunk(torch.arange(4), passes):
            xs, ys = x[mine][part], y[mine][part]
            loss = torch.nn.functional.mse_loss(model(xs), ys) * len(part) / 4
            loss.backward()
        optimizer.step()
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert_replicas_equal(params)
    want = reference_training(size, steps, optimizer_class, **kwargs)
    assert torch.allclose(params, want, atol=TOLERANCE, rtol=0)


def test_skip_synchronize_and_groups(rank, size):
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(),
                                         num_groups=2)
    x, y = full_batch(0, size)
    torch.nn.functional.mse_loss(model(x[rank * 4:rank * 4 + 4]), y[rank * 4:rank * 4 + 4]) \
        .backward()
    optimizer.synchronize()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert_replicas_equal(grads)
    with optimizer.skip_synchronize():
        optimizer.step()
    assert_replicas_equal(torch.cat([p.detach().flatten() for p in model.parameters()]))


def test_broadcast_object_and_allgather_object(rank, size):
    assert hvd.broadcast_object({"epoch": rank}, root_rank=0) == {"epoch": 0}
    assert hvd.allgather_object(("rank", rank)) == [("rank", r) for r in range(size)]


def test_distributed_optimizer_uneven_inputs_with_join(rank, size):
    """Rank r runs out one step before rank r - 1; hvd.join() lets the others finish, its
    allreduces seeing zeros from joined ranks and dividing by every rank, as Horovod's do."""
    steps_of = [size + 1 - r for r in range(size)]
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    for step in range(steps_of[rank]):
        x, y = full_batch(step, size)
        mine = slice(rank * 4, rank * 4 + 4)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
        optimizer.step()
    last = hvd.join()
    assert last == 0  # rank 0 has the most steps
    hvd.broadcast_parameters(model.state_dict(), root_rank=last)
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert_replicas_equal(params)

    reference = make_model()
    sgd = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(steps_of[0]):
        x, y = full_batch(step, size)
        sgd.zero_grad()
        active = [r for r in range(size) if steps_of[r] > step]
        loss = sum(torch.nn.functional.mse_loss(reference(x[r * 4:r * 4 + 4]), y[r * 4:r * 4 + 4])
                   for r in active) / size
        loss.backward()
        sgd.step()
    want = torch.cat([p.detach().flatten() for p in reference.parameters()])
    assert torch.allclose(params, want, atol=TOLERANCE, rtol=0)


def test_dropped_wrappers_go_at_once_on_every_rank(rank, size):
    """An optimizer or DDP wrapper the script drops is freed then, not when the garbage collector
    runs (at another moment on every rank): its batch and its caller-reduced lane go with it, so
    a later join() never takes part in a lane only some ranks still hold."""
    model = make_model()
    x, y = full_batch(0, size)
    gc.disable()
    try:
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                             named_parameters=model.named_parameters())
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        dropped = weakref.ref(optimizer)
        del optimizer
        assert dropped() is None
        wrapped = hvd.DistributedDataParallel(model)
        torch.nn.functional.mse_loss(wrapped(x), y).backward()
        dropped = weakref.ref(wrapped)
        del wrapped
        assert dropped() is None
        # The model's hooks outlive their wrappers and do nothing.
        model.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
    finally:
        gc.enable()


def test_optimizer_hooks_start_reductions_through_the_batch(rank, size):
    """Every plain gradient leaves from its hook through the optimizer's AllreduceBatch, and the
    batch is empty again once step() has waited for it."""
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    params = list(model.parameters())
    x, y = full_batch(0, size)
    torch.nn.functional.mse_loss(model(x[rank * 4:rank * 4 + 4]), y[rank * 4:rank * 4 + 4]) \
        .backward()
    assert len(optimizer._batch) == len(params)
    assert optimizer._batch.in_flight() == len(params)
    optimizer.step()
    assert optimizer._batch.in_flight() == 0
    assert_replicas_equal(torch.cat([p.detach().flatten() for p in params]))
    # From the second step on, the batch's last bucket is reduced on this thread.
    for step in range(1, 3):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x[rank * 4:rank * 4 + 4]), y[rank * 4:rank * 4 + 4]) \
            .backward()
        optimizer.step()
    # Past two ranks of one node the bucket goes through node shared memory, negotiated.
    caller_reduces = os.environ.get("GRADSYNC_CALLER_REDUCE", "1") != "0" and (
        size <= 2 or os.environ.get("GRADSYNC_SHM_THRESHOLD") == "0")
    assert optimizer._batch.caller_reductions() == (2 if caller_reduces else 0)
    assert_replicas_equal(torch.cat([p.detach().flatten() for p in params]))


def test_optimizer_batch_and_general_path_meet_under_one_name(rank, size):
    """A parameter that backward left without a gradient on rank 0 only is reduced as zeros there,
    through its slot in the batch as on the other ranks, so that its bucket matches theirs."""
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    last_bias = model[2].bias
    out = model(torch.ones(2, 8, dtype=torch.float64))
    if rank == 0:
        out = out - last_bias  # leaves the last bias out of the graph on this rank only
    out.sum().backward()
    optimizer.synchronize()
    # Every other rank contributed 2 per element (two rows of ones through d(sum)/d(bias)).
    assert torch.allclose(last_bias.grad, torch.full_like(last_bias, 2.0 * (size - 1) / size))
    with optimizer.skip_synchronize():
        optimizer.step()


class _PartlyTrained(torch.nn.Module):
    """A layer in use, one never used, and a frozen one."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.used = torch.nn.Linear(4, 2)
        self.unused = torch.nn.Linear(4, 2)
        self.frozen = torch.nn.Linear(4, 2)
        self.frozen.requires_grad_(False)

    def forward(self, x):
        return self.used(x) + self.frozen(x)


def _state_of(optimizer):
    return {pid: {k: v.clone() if torch.is_tensor(v) else v for k, v in entries.items()}
            for pid, entries in optimizer.state_dict()["state"].items()}


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    lambda ps: torch.optim.Adam(ps, lr=0.1),
    lambda ps: torch.optim.Adagrad(ps, lr=0.1)], ids=["sgd", "adam", "adagrad"])
@pytest.mark.parametrize("stepped", ["all", "root", "others", "none"])
def test_broadcast_optimizer_state_with_parameters_that_had_no_gradient(make, stepped, rank,
                                                                        size):
    """Ranks whose states differ in which parameters have any (some stepped, with a frozen and
    an unused layer) all end with the root's, and can step on."""
    model = _PartlyTrained()
    optimizer = make(model.parameters())
    model(torch.ones(3, 4) * (rank + 1)).sum().backward()
    if stepped == "all" or (stepped == "root") == (rank == 0) and stepped != "none":
        optimizer.step()
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    root = hvd.broadcast_object(_state_of(optimizer), root_rank=0, name="root.state")
    mine = _state_of(optimizer)
    assert mine.keys() == root.keys()
    for pid, entries in root.items():
        assert mine[pid].keys() == entries.keys()
        for key, value in entries.items():
            if torch.is_tensor(value):
                assert torch.equal(mine[pid][key], value), (pid, key)
            else:
                assert mine[pid][key] == value, (pid, key)
    optimizer.step()


def test_optimizer_of_a_process_set_steps_alone_outside_it(rank, size):
    """Members average among themselves; a rank outside the set takes a local step."""
    if size < 2:
        pytest.skip("needs a set smaller than the world")
    evens = hvd.add_process_set([r for r in range(size) if r % 2 == 0])
    try:
        model = torch.nn.Linear(2, 1, bias=False)
        with torch.no_grad():
            model.weight.fill_(1.0)
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                             named_parameters=model.named_parameters(),
                                             process_set=evens)
        # d(sum(w . x))/dw = x: each rank's gradient is (rank + 1) in both elements.
        model(torch.full((1, 2), float(rank + 1))).sum().backward()
        optimizer.step()
        members = [r for r in range(size) if r % 2 == 0]
        if rank in members:
            grad = sum(r + 1 for r in members) / len(members)
        else:
            grad = rank + 1.0
        assert torch.allclose(model.weight, torch.full((1, 2), 1.0 - grad))
    finally:
        hvd.remove_process_set(evens)


def test_sparse_allreduce_async_gathers_every_ranks_entries(rank, size):
    dense = torch.zeros(6, 2)
    dense[rank % 6] = float(rank + 1)
    dense[5] = 1.0
    for op in (hvd.Sum, hvd.Average):
        handle = hvd.sparse_allreduce_async(dense.to_sparse(), name="sparse.%s" % op, op=op)
        result = hvd.synchronize(handle)
        assert result.is_sparse and result.size() == dense.size()
        want = torch.zeros(6, 2)
        for r in range(size):
            want[r % 6] += float(r + 1)
        want[5] += size
        if op == hvd.Average:
            want /= size
        assert torch.allclose(result.to_dense(), want)
    # A rank with no entries at all takes part too.
    empty = torch.zeros(3).to_sparse() if rank == 0 else torch.ones(3).to_sparse()
    result = hvd.synchronize(hvd.sparse_allreduce_async(empty, name="sparse.empty", op=hvd.Sum))
    assert torch.equal(result.to_dense(), torch.full((3,), float(size - 1)))


class _SparseModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(11)
        self.embedding = torch.nn.Embedding(20, 4, sparse=True)
        self.head = torch.nn.Linear(4, 1)

    def forward(self, ids):
        return self.head(self.embedding(ids)).sum(dim=1)


def test_sparse_embedding_trains_as_one_process_on_the_full_batch(rank, size):
    """Sparse gradients reduced as they are (not densified): the replicas stay identical and
    follow a single process that sees every rank's batch."""
    model = _SparseModel()
    reference = _SparseModel()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                         named_parameters=model.named_parameters())
    single = torch.optim.SGD(reference.parameters(), lr=0.05)
    for step in range(4):
        batches = [torch.tensor([[(3 * r + step) % 20, (7 * r + 2 * step) % 20]])
                   for r in range(size)]
        targets = [torch.tensor([float(r - step)]) for r in range(size)]
        optimizer.zero_grad()
        loss = ((model(batches[rank]) - targets[rank]) ** 2).mean()
        loss.backward()
        assert model.embedding.weight.grad.is_sparse
        optimizer.step()
        # One process: the mean of the ranks' losses, whose gradient is the ranks' average.
        single.zero_grad()
        full = sum(((reference(b) - t) ** 2).mean() for b, t in zip(batches, targets)) / size
        full.backward()
        single.step()
    for mine, want in zip(model.parameters(), reference.parameters()):
        # The same sums in another order: equal to float32's rounding.
        assert torch.allclose(mine.detach(), want.detach(), rtol=1e-5, atol=1e-6)
    gathered = hvd.allgather(model.embedding.weight.detach().unsqueeze(0), name="sparse.replicas")
    assert all(torch.equal(gathered[0], g) for g in gathered)


def test_horovods_signatures(rank, size):
    """Arguments scripts pass positionally or by Horovod's names."""
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hvd.broadcast_optimizer_state(optimizer, 0, model)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0, model=model)
    t = torch.ones(2, 1).to_sparse()
    assert hvd.synchronize(hvd.sparse_allreduce_async(t, "sig.sparse", hvd.Sum)).to_dense() \
        .sum().item() == 2 * size


def test_optimizer_exposes_parameter_names_as_horovod(rank, size):
    model = make_model()
    named = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters())
    assert named._parameter_names == {p: n for n, p in model.named_parameters()}
    unnamed = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    names = [unnamed._parameter_names[p] for p in model.parameters()]
    assert len(set(names)) == len(names) == len(list(model.parameters()))


def test_step_after_a_manual_synchronize_warns_as_horovod(rank, size):
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    model(torch.ones(2, 8, dtype=torch.float64)).sum().backward()
    optimizer.synchronize()
    with pytest.warns(UserWarning,
                      match=r"optimizer\.step\(\) called without optimizer\.skip_synchronize\(\)"):
        optimizer.step()


def test_optimizer_refits_a_gradient_that_no_longer_fits_its_slot(rank, size):
    """A non-contiguous gradient on rank 0 only is reduced through its slot from a contiguous copy,
    and the result is copied back into it."""
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    last_bias = model[2].bias
    hidden = model[1](model[0](torch.ones(2, 8, dtype=torch.float64)))
    # Rank 0 leaves the last bias out of the graph: no hook starts it there.
    out = torch.nn.functional.linear(hidden, model[2].weight) if rank == 0 else model[2](hidden)
    out.sum().backward()
    if rank == 0:
        assert last_bias.grad is None
        strided = torch.full((last_bias.numel(), 2), 7.0, dtype=torch.float64)
        strided[:, 0] = 2.0
        last_bias.grad = strided[:, 0]  # read as if contiguous, its 7s would show up
        assert not last_bias.grad.is_contiguous()
    optimizer.synchronize()
    assert torch.equal(last_bias.grad, torch.full_like(last_bias, 2.0)), last_bias.grad
    with optimizer.skip_synchronize():
        optimizer.step()


def test_optimizer_batch_reports_a_mismatch_at_step(rank, size):
    if size == 1:
        pytest.skip("a mismatch needs two ranks")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3 if rank == 0 else 5).double()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    model(torch.ones(1, 4, dtype=torch.float64)).sum().backward()
    with pytest.raises(hvd.HorovodInternalError, match="Mismatch"):
        optimizer.step()
    assert optimizer._batch.in_flight() == 0


@pytest.mark.parametrize("passes", [1, 2])
def test_a_param_group_added_after_wrapping_is_averaged(passes, rank, size):
    # Progressive unfreezing: the backbone's group joins the head's after a step.
    head = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    backbone = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD([head], lr=1.0),
                                         backward_passes_per_step=passes)
    for _ in range(passes):
        (head * (rank + 1)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    optimizer.add_param_group({"params": [backbone]})  # the wrapped optimizer's lr, 1.0
    assert optimizer.param_groups[-1]["lr"] == 1.0
    for _ in range(passes):
        ((head + backbone) * (rank + 1)).sum().backward()
    optimizer.step()
    mean = passes * (size + 1) / 2
    assert torch.allclose(backbone.detach(), torch.full((3,), -mean, dtype=torch.float64))
    assert torch.allclose(head.detach(), torch.full((3,), -2 * mean, dtype=torch.float64))


def test_a_param_group_is_refused_while_gradients_are_reduced(rank, size):
    a = torch.nn.Parameter(torch.ones(2, dtype=torch.float64))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD([a], lr=1.0))
    a.sum().backward()
    with pytest.raises(RuntimeError, match="between steps"):
        optimizer.add_param_group({"params": [torch.nn.Parameter(torch.ones(2))]})
    assert len(optimizer.param_groups) == 1
    optimizer.step()


def test_wrapping_keeps_the_optimizers_state(rank, size):
    a = torch.nn.Parameter(torch.ones(2, dtype=torch.float64))
    plain = torch.optim.SGD([a], lr=1.0, momentum=0.9)
    a.sum().backward()
    plain.step()  # momentum, as a checkpoint loaded before wrapping would hold
    momentum = plain.state[a]["momentum_buffer"].clone()
    optimizer = hvd.DistributedOptimizer(plain)
    assert torch.equal(optimizer.state[a]["momentum_buffer"], momentum)
