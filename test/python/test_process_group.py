"""gradsync as a torch.distributed backend (gradsync.torch.process_group): torch.distributed's
collectives against the values every rank can compute, PyTorch's own DistributedDataParallel
against a simulation of every replica, hooks written against torch.distributed on gradsync's
wrapper, groups over some of the ranks, and errors that reach every rank instead of a hang."""

import types

import pytest
import torch

import gradsync.torch as hvd
from gradsync.torch import process_group, process_group_work

dist = pytest.importorskip("torch.distributed")

STEPS = 4


@pytest.fixture(scope="module", autouse=True)
def gradsync_default_group():
    process_group.init_process_group()
    yield
    dist.destroy_process_group()


def values(rank, count=5, dtype=torch.float32):
    return torch.arange(count, dtype=dtype) + 10 * rank


def test_the_default_group_is_gradsync_over_every_rank(rank, size):
    assert dist.get_backend() == "gradsync"
    assert (dist.get_rank(), dist.get_world_size()) == (rank, size)


@pytest.mark.parametrize("op, expected", [
    ("SUM", lambda ranks: sum(values(r) for r in ranks)),
    ("MAX", lambda ranks: values(max(ranks))),
    ("MIN", lambda ranks: values(min(ranks))),
    ("PRODUCT", lambda ranks: torch.stack([values(r) for r in ranks]).prod(0)),
])
def test_all_reduce(rank, size, op, expected):
    tensor = values(rank)
    dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op))
    assert torch.equal(tensor, expected(range(size)))


def test_all_reduce_async_future_holds_the_reduced_tensor(rank, size):
    tensor = values(rank, dtype=torch.float64)
    work = dist.all_reduce(tensor, async_op=True)
    result = work.get_future().wait()
    work.wait()
    assert torch.equal(result[0], sum(values(r, dtype=torch.float64) for r in range(size)))
    assert result[0].data_ptr() == tensor.data_ptr()


def test_broadcast_from_every_root(rank, size):
    for root in range(size):
        tensor = values(rank, 7, torch.int64)
        dist.broadcast(tensor, src=root)
        assert torch.equal(tensor, values(root, 7, torch.int64))


def test_all_gather_and_gather_into_one_tensor(rank, size):
    mine = values(rank).reshape(1, 5)
    gathered = [torch.zeros(1, 5) for _ in range(size)]
    dist.all_gather(gathered, mine)
    assert all(torch.equal(g, values(r).reshape(1, 5)) for r, g in enumerate(gathered))
    into = getattr(dist, "all_gather_into_tensor", getattr(dist, "_all_gather_base", None))
    output = torch.zeros(size, 5)
    into(output, values(rank))
    assert torch.equal(output, torch.stack([values(r) for r in range(size)]))


@pytest.mark.filterwarnings("ignore:.*all_gather_coalesced.* will be deprecated")
def test_all_gather_coalesced_and_gather_single(rank, size):
    outputs = [[torch.zeros(5), torch.zeros(2)] for _ in range(size)]
    dist.all_gather_coalesced(outputs, [values(rank), values(rank, 2) * 2])
    for r, (first, second) in enumerate(outputs):
        assert torch.equal(first, values(r)) and torch.equal(second, values(r, 2) * 2)
    gather_single = getattr(dist, "gather_single", None)
    if gather_single is not None:  # PyTorch 2's, which PyTorch 1.13 lacks
        root = size - 1
        output = torch.zeros(size * 5) if rank == root else None
        gather_single(values(rank), output, dst=root)
        if rank == root:
            assert torch.equal(output, torch.cat([values(r) for r in range(size)]))


def test_lists_without_a_tensor_for_each_rank_are_refused_before_anything_starts(rank, size):
    with pytest.raises(ValueError, match="one tensor for each"):
        dist.all_gather([torch.zeros(5)] * (size + 1), values(rank))
    with pytest.raises(ValueError, match="one tensor for each"):
        dist.reduce_scatter(torch.zeros(5), [values(rank)] * (size + 1))
    dist.barrier()  # nothing started above: every rank is still in step


def test_outputs_of_another_size_are_refused_before_anything_starts(rank, size):
    # What arrives could not be copied into them; PyTorch 1.13's wait() would not say so.
    tensor = values(rank)
    with pytest.raises(ValueError, match="an output of 4 elements for 5"):
        dist.all_gather([torch.zeros(4) for _ in range(size)], tensor)
    with pytest.raises(ValueError, match="all_gather_into_tensor"):
        dist.all_gather_into_tensor(torch.zeros(5 * size + 1), tensor)
    with pytest.raises(ValueError, match="reduce_scatter"):
        dist.reduce_scatter(torch.zeros(4), [values(rank) for _ in range(size)])
    with pytest.raises(ValueError, match="all_to_all_single"):
        dist.all_to_all_single(torch.zeros(5 * size + 1), torch.zeros(5 * size))
    dist.barrier()  # nothing started: the group still runs


def test_results_are_written_under_the_callers_grad_and_inference_modes(rank, size):
    # The backend's threads copy results into the caller's tensors, under the caller's modes:
    # outputs made under inference_mode, a non-contiguous leaf parameter under no_grad.
    with torch.inference_mode():
        outputs = [torch.zeros(5) for _ in range(size)]
        dist.all_gather(outputs, values(rank))
    assert all(torch.equal(o, values(r)) for r, o in enumerate(outputs))
    parameter = torch.nn.Parameter(torch.zeros(3, 4).t())
    assert not parameter.is_contiguous()
    with torch.no_grad():
        parameter.fill_(float(rank + 1))
        dist.broadcast(parameter, src=0)
    assert torch.equal(parameter.detach(), torch.ones(4, 3))
    assert parameter.requires_grad


def test_a_group_torch_numbers_otherwise_than_gradsync_is_refused(rank, size):
    """Its collectives would follow gradsync's numbering: roots and outputs would be another
    rank's. The members' first collective raises, not the group's making (as for a group
    without a process set)."""
    reversed_ranks = list(reversed(range(size)))
    options = types.SimpleNamespace(global_ranks_in_group=reversed_ranks,
                                    group_rank=reversed_ranks.index(rank), group_size=size)
    misnumbered = types.SimpleNamespace(global_ranks_in_group=[], group_rank=(rank + 1) % size,
                                        group_size=size)
    if size > 1:
        with pytest.raises(ValueError, match="ascending order"):
            process_group._create(options).process_set
        with pytest.raises(ValueError, match="torch's ranks must be MPI's"):
            process_group._create(misnumbered).process_set
    assert process_group._create(types.SimpleNamespace(
        global_ranks_in_group=[], group_rank=rank, group_size=size)).process_set is \
        hvd.global_process_set


def test_objects_travel_through_the_backend(rank, size):
    gathered = [None] * size
    dist.all_gather_object(gathered, {"rank": rank, "name": "r%d" % rank})
    assert gathered == [{"rank": r, "name": "r%d" % r} for r in range(size)]
    objects = [["from", rank]]
    dist.broadcast_object_list(objects, src=size - 1)
    assert objects == [["from", size - 1]]


def test_reduce_scatter(rank, size):
    inputs = [values(rank) * (r + 1) for r in range(size)]
    output = torch.zeros(5)
    dist.reduce_scatter(output, inputs)
    assert torch.equal(output, sum(values(r) for r in range(size)) * (rank + 1))
    scatter_tensor = getattr(dist, "reduce_scatter_tensor", getattr(dist, "_reduce_scatter_base"))
    whole = torch.cat(inputs)
    output = torch.zeros(5)
    scatter_tensor(output, whole)
    assert torch.equal(output, sum(values(r) for r in range(size)) * (rank + 1))


def test_all_to_all_single_even_and_uneven(rank, size):
    sent = torch.arange(size * 2, dtype=torch.float32) + 100 * rank
    received = torch.zeros(size * 2)
    dist.all_to_all_single(received, sent)
    assert torch.equal(received, torch.tensor(
        [100 * r + 2 * rank + i for r in range(size) for i in range(2)], dtype=torch.float32))
    # rank r sends r + 1 rows to every rank
    sent = torch.full((size * (rank + 1), 2), float(rank))
    received = torch.zeros(sum(r + 1 for r in range(size)), 2)
    dist.all_to_all_single(received, sent, [r + 1 for r in range(size)],
                           [rank + 1] * size)
    assert torch.equal(received, torch.cat([torch.full((r + 1, 2), float(r))
                                            for r in range(size)]))


def test_all_to_all_of_lists(rank, size):
    inputs = [torch.full((j + 1,), float(10 * rank + j)) for j in range(size)]
    outputs = [torch.zeros(rank + 1) for _ in range(size)]
    dist.all_to_all(outputs, inputs)
    assert all(torch.equal(o, torch.full((rank + 1,), float(10 * r + rank)))
               for r, o in enumerate(outputs))


def test_reduce_gather_scatter_at_a_root(rank, size):
    root = size - 1
    tensor = values(rank)
    dist.reduce(tensor, dst=root)
    if rank == root:
        assert torch.equal(tensor, sum(values(r) for r in range(size)))
    gathered = [torch.zeros(5) for _ in range(size)] if rank == root else None
    dist.gather(values(rank), gather_list=gathered, dst=root)
    if rank == root:
        assert all(torch.equal(g, values(r)) for r, g in enumerate(gathered))
    output = torch.zeros(5)
    dist.scatter(output, [values(r) * 3 for r in range(size)] if rank == root else None, src=root)
    assert torch.equal(output, values(rank) * 3)


def test_barrier_and_point_to_point_refused(size):
    dist.barrier()
    if size > 1:  # torch refuses a send to this rank itself
        with pytest.raises(RuntimeError, match="point-to-point"):
            dist.send(torch.zeros(1), dst=(dist.get_rank() + 1) % size)


def test_a_mismatch_fails_every_rank_instead_of_hanging(rank, size):
    if size == 1:
        pytest.skip("needs two ranks to differ")
    work = dist.all_reduce(torch.zeros(3 + rank), async_op=True)
    with pytest.raises(RuntimeError, match="shape"):
        work.get_future().wait()
    if process_group_work.PYTHON_WORK:
        with pytest.raises(RuntimeError, match="shape"):
            work.wait()
        with pytest.raises(RuntimeError, match="shape"):  # waited for on the caller's thread
            dist.all_reduce(torch.zeros(5 + rank))
    else:  # PyTorch 1.13's Work.wait() cannot raise: the group's next operation does
        work.wait()
        with pytest.raises(RuntimeError, match="earlier operation of this gradsync group"):
            dist.barrier()
    dist.barrier()  # the group still runs


def make_model():
    torch.manual_seed(5)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(),
                               torch.nn.Linear(8, 2)).double()


def batch(step, rank):
    gen = torch.Generator().manual_seed(100 * step + rank)
    return (torch.randn(3, 4, generator=gen, dtype=torch.float64),
            torch.randn(3, 2, generator=gen, dtype=torch.float64))


def train(model, rank, steps=STEPS):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        optimizer.zero_grad()
        x, y = batch(step, rank)
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def simulated(ranks):
    """The replicas of ``ranks`` in this process, gradients averaged over them each step."""
    ranks = list(ranks)
    size = len(ranks)
    models = [make_model() for _ in ranks]
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in models]
    for step in range(STEPS):
        for r, m in zip(ranks, models):
            m.zero_grad()
            x, y = batch(step, r)
            torch.nn.functional.mse_loss(m(x), y).backward()
        for params in zip(*(m.parameters() for m in models)):
            mean = sum(p.grad for p in params) / size
            for p in params:
                p.grad.copy_(mean)
        for o in optimizers:
            o.step()
    return torch.cat([p.detach().reshape(-1) for p in models[0].parameters()])


def test_pytorch_ddp_over_gradsync_trains_as_the_replicas_would(rank, size):
    model = torch.nn.parallel.DistributedDataParallel(make_model(), bucket_cap_mb=0.0001)
    assert torch.allclose(train(model, rank), simulated(range(size)), rtol=0, atol=1e-12)


def torch_distributed_hook(state, bucket):
    """A hook as a DDP user writes one: it calls torch.distributed itself."""
    buffer = bucket.buffer().div_(dist.get_world_size())
    return dist.all_reduce(buffer, async_op=True).get_future().then(lambda f: f.value()[0])


def test_hooks_written_against_torch_distributed_run_on_gradsync_ddp(rank, size):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    for hook, state in ((torch_distributed_hook, None), (default_hooks.allreduce_hook, None)):
        model = hvd.DistributedDataParallel(make_model(), bucket_cap_mb=0.0001)
        model.register_comm_hook(state, hook)
        assert torch.allclose(train(model, rank), simulated(range(size)), rtol=0, atol=1e-12)


def test_groups_over_some_ranks_run_on_their_process_set(rank, size):
    if size < 2:
        pytest.skip("needs a group smaller than the world")
    halves = [list(range(size // 2)), list(range(size // 2, size))]
    without_set = dist.new_group(halves[0])  # every rank makes every group, as torch asks
    if rank in halves[0]:
        with pytest.raises(ValueError, match="add_process_set"):
            dist.all_reduce(torch.zeros(1), group=without_set)
    sets = [hvd.add_process_set(h) for h in halves]
    groups = [dist.new_group(h) for h in halves]
    mine = 0 if rank in halves[0] else 1
    tensor = values(rank)
    dist.all_reduce(tensor, group=groups[mine])
    assert torch.equal(tensor, sum(values(r) for r in halves[mine]))
    tensor = values(rank)
    dist.broadcast(tensor, src=halves[mine][-1], group=groups[mine])
    assert torch.equal(tensor, values(halves[mine][-1]))
    dist.destroy_process_group(groups[mine])
    for s in sets:
        hvd.remove_process_set(s)


def parameters_with_gradients(*tensors):
    """What the averagers average: parameters that have a gradient."""
    params = [torch.nn.Parameter(t) for t in tensors]
    for p in params:
        p.grad = torch.zeros_like(p)
    return params


def test_pytorch_model_averagers_over_gradsync(rank, size):
    """PyTorch's periodic and hierarchical model averagers, which call torch.distributed
    themselves (the hierarchical one over subgroups made with dist.new_subgroups)."""
    from torch.distributed.algorithms.model_averaging import averagers
    params = parameters_with_gradients(torch.full((3,), float(rank)),
                                       torch.full((2, 2), float(2 * rank)))
    averagers.PeriodicModelAverager(period=2, warmup_steps=0).average_parameters(params)
    mean = (size - 1) / 2.0
    assert torch.equal(params[0].data, torch.full((3,), mean))
    assert torch.equal(params[1].data, torch.full((2, 2), 2 * mean))


def test_pytorch_hierarchical_model_averager_over_process_sets(rank, size):
    if size < 4:
        pytest.skip("needs pairs of ranks smaller than the world")
    hierarchical = pytest.importorskip(
        "torch.distributed.algorithms.model_averaging.hierarchical_model_averager")
    pairs = [hvd.add_process_set([r, r + 1]) for r in range(0, size, 2)]
    try:
        averager = hierarchical.HierarchicalModelAverager({1: 2, 2: size}, warmup_steps=0)
    except ValueError as error:
        if "CUDA" not in str(error):  # PyTorch 1.13's dist.new_subgroups
            raise
        pytest.skip(str(error))
    mean = (size - 1) / 2.0
    params = parameters_with_gradients(torch.full((3,), float(rank)))
    averager.average_parameters(params)  # step 0: every period divides it, the whole world's
    assert torch.equal(params[0].data, torch.full((3,), mean))
    params = parameters_with_gradients(torch.full((3,), float(rank)))
    averager.step = 1
    averager.average_parameters(params)  # step 1: within each pair
    assert torch.equal(params[0].data, torch.full((3,), float(rank - rank % 2) + 0.5))
    for s in pairs:
        hvd.remove_process_set(s)


def test_zero_redundancy_optimizer_over_gradsync(rank, size):
    """PyTorch's ZeroRedundancyOptimizer (each rank steps its share, then broadcasts it) with
    PyTorch's DDP: the replicas' training."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    model = torch.nn.parallel.DistributedDataParallel(make_model())
    optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD,
                                        lr=0.1, momentum=0.9)
    for step in range(STEPS):
        optimizer.zero_grad()
        x, y = batch(step, rank)
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    trained = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert torch.allclose(trained, simulated(range(size)), rtol=0, atol=1e-12)


def test_gradsync_ddp_takes_a_group_of_the_backend_for_its_process_set(rank, size):
    model = hvd.DistributedDataParallel(make_model(), bucket_cap_mb=0.0001,
                                        process_group=dist.group.WORLD)
    assert torch.allclose(train(model, rank), simulated(range(size)), rtol=0, atol=1e-12)
    if size < 2:
        return
    halves = [list(range(size // 2)), list(range(size // 2, size))]
    sets = [hvd.add_process_set(h) for h in halves]
    groups = [dist.new_group(h) for h in halves]
    mine = 0 if rank in halves[0] else 1
    model = hvd.DistributedDataParallel(make_model(), process_group=groups[mine])
    assert model.process_set.ranks == halves[mine]
    assert torch.allclose(train(model, rank), simulated(halves[mine]), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="not both"):
        hvd.DistributedDataParallel(make_model(), process_group=groups[mine],
                                    process_set=sets[mine])
    dist.destroy_process_group(groups[mine])
    for s in sets:
        hvd.remove_process_set(s)


def test_pytorch_powersgd_on_pytorch_ddp_over_gradsync(rank, size):
    """PyTorch's PowerSGD hook, whose callbacks start allreduces and wait for them (on the
    backend's completing thread), on PyTorch's DDP over the backend: gradsync's own PowerSGD's
    training on its wrapper (which test_powersgd.py ties to PyTorch's on the full batch)."""
    from gradsync.torch import powersgd
    from test_powersgd import make_model as matrices, batch as rows, train as train_with_hook
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as theirs

    def mine(step):
        return [rows(step, rank)]

    ours = train_with_hook(hvd.DistributedDataParallel(matrices()), powersgd.powerSGD_hook,
                           powersgd.PowerSGDState(start_powerSGD_iter=2), mine)
    pytorch = train_with_hook(torch.nn.parallel.DistributedDataParallel(matrices()),
                              theirs.powerSGD_hook,
                              theirs.PowerSGDState(process_group=None, start_powerSGD_iter=2), mine)
    assert torch.allclose(pytorch, ours, rtol=0, atol=1e-9)


def test_a_result_the_future_refuses_still_wakes_its_consumers():
    """A value the future's set_result raises on (a tensor on a device it was not made for)
    becomes the consumers' error rather than a future that never completes."""

    class Refusing(torch.futures.Future):
        def set_result(self, value):
            if not isinstance(value, process_group_work._Failure):
                raise RuntimeError("refused")
            super().set_result(value)

    source = Refusing()
    process_group_work.complete(lambda: [1], lambda results: results, source)
    with pytest.raises(RuntimeError, match="refused"):
        process_group_work.future_of(source).wait()
