"""Post-local SGD (gradsync.torch.local_sgd) with gradsync's DistributedDataParallel: every rank's
parameters are those of a simulation of every replica in one process (gradients averaged over all
ranks for the first steps, then within each rank's subgroup or not at all; parameters averaged
over all ranks every period), with gradsync's state and hook, PyTorch's own registered in their
place, and PyTorch's PostLocalSGDOptimizer around gradsync's averager."""

import pytest
import torch

import gradsync.torch as hvd
from gradsync.torch import local_sgd
from test_ddp import flat

STEPS = 7
START = 2  # start_localSGD_iter
PERIOD = 2
WARMUP = 3

dist = pytest.importorskip("torch.distributed")
torch_local_sgd = pytest.importorskip(
    "torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook")
torch_optim = pytest.importorskip("torch.distributed.optim")


def make_model():
    torch.manual_seed(99)
    return torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Tanh(),
                               torch.nn.Linear(10, 3)).double()


def batch(step, rank):
    gen = torch.Generator().manual_seed(500 * step + rank)
    return (torch.randn(5, 6, generator=gen, dtype=torch.float64),
            torch.randn(5, 3, generator=gen, dtype=torch.float64))


def loss_of(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


def halves(size):
    """Each rank's subgroup: the lower or the upper half of the ranks (itself alone at 2)."""
    return [list(range(size // 2)), list(range(size // 2, size))]


def simulated(size, groups, post_local_gradient_allreduce=True):
    """Every replica in this process: rank r's parameters after STEPS steps."""
    models = [make_model() for _ in range(size)]
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in models]
    group_of = {r: g for g in groups for r in g}
    for step in range(STEPS):
        grads = []
        for r, model in enumerate(models):
            model.zero_grad()
            loss_of(model, *batch(step, r)).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for r, model in enumerate(models):
            if step < START:
                over = range(size)
            elif post_local_gradient_allreduce:
                over = group_of[r]
            else:
                over = [r]
            for i, p in enumerate(model.parameters()):
                p.grad = sum(grads[k][i] for k in over) / len(over)
        for optimizer in optimizers:
            optimizer.step()
        if step >= WARMUP and (step - WARMUP) % PERIOD == 0:
            with torch.no_grad():
                for params in zip(*(m.parameters() for m in models)):
                    mean = sum(p.clone() for p in params) / size
                    for p in params:
                        p.copy_(mean)
    return [flat(m.parameters()) for m in models]


def trained(rank, state, hook, averager):
    model = hvd.DistributedDataParallel(make_model())
    model.register_comm_hook(state, hook)
    optimizer = torch_optim.PostLocalSGDOptimizer(
        optim=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), averager=averager)
    for step in range(STEPS):
        optimizer.zero_grad()
        loss_of(model, *batch(step, rank)).backward()
        optimizer.step()
    assert optimizer.state_dict()["step"] == STEPS  # the averager's, saved with the optimizer
    return flat(model.parameters())


@pytest.fixture(scope="module")
def subgroups():
    """Each rank's half as a gradsync process set (every rank adds both), or None at 1 rank."""
    if hvd.size() < 2:
        yield None
        return
    sets = [hvd.add_process_set(g) for g in halves(hvd.size())]
    yield next(s for s in sets if s.included())
    for s in sets:
        hvd.remove_process_set(s)


@pytest.mark.parametrize("theirs", [False, True])
def test_trains_as_the_simulation(theirs, subgroups, rank, size):
    """gradsync's state and hook, or PyTorch's registered in their place."""
    module = torch_local_sgd if theirs else local_sgd
    state = module.PostLocalSGDState(process_group=None, subgroup=subgroups,
                                     start_localSGD_iter=START)
    averager = local_sgd.PeriodicModelAverager(period=PERIOD, warmup_steps=WARMUP)
    params = trained(rank, state, module.post_localSGD_hook, averager)
    groups = halves(size) if size > 1 else [[0]]
    assert torch.allclose(params, simulated(size, groups)[rank], rtol=0, atol=1e-12)
    assert state.iter == START


def test_without_the_gradients_allreduce_after_the_start(subgroups, rank, size):
    state = local_sgd.PostLocalSGDState(process_group=None, subgroup=subgroups,
                                        start_localSGD_iter=START,
                                        post_local_gradient_allreduce=False)
    averager = local_sgd.PeriodicModelAverager(period=PERIOD, warmup_steps=WARMUP)
    params = trained(rank, state, local_sgd.post_localSGD_hook, averager)
    expected = simulated(size, [[r] for r in range(size)], post_local_gradient_allreduce=False)
    assert torch.allclose(params, expected[rank], rtol=0, atol=1e-12)


def test_the_default_subgroup_is_the_node(rank, size):
    """On one node every rank is in the node's set: the global one, which nothing adds."""
    state = local_sgd.PostLocalSGDState(process_group=None, subgroup=None,
                                        start_localSGD_iter=START)
    averager = local_sgd.PeriodicModelAverager(period=PERIOD, warmup_steps=WARMUP)
    params = trained(rank, state, local_sgd.post_localSGD_hook, averager)
    assert state.subgroup is hvd.global_process_set
    assert torch.allclose(params, simulated(size, [list(range(size))])[rank], rtol=0, atol=1e-12)


def test_what_it_cannot_take_is_refused():
    with pytest.raises(ValueError, match="period"):
        local_sgd.PeriodicModelAverager(period=0)
    with pytest.raises(ValueError, match="warmup_steps"):
        local_sgd.PeriodicModelAverager(period=2, warmup_steps=-1)
    with pytest.raises(ValueError, match="gradsync ProcessSet or a torch.distributed group"):
        local_sgd.PeriodicModelAverager(period=2, process_group=object())
    model = hvd.DistributedDataParallel(make_model())
    model.register_comm_hook(
        local_sgd.PostLocalSGDState(process_group=object(), subgroup=None, start_localSGD_iter=1),
        local_sgd.post_localSGD_hook)
    with pytest.raises(ValueError, match="gradsync ProcessSet or a torch.distributed group"):
        loss_of(model, *batch(0, 0)).backward()


def test_a_wrapper_over_a_process_set_needs_the_subgroup(subgroups, size):
    """The default subgroup, this node's ranks, is for a wrapper over every rank."""
    if size < 2:
        pytest.skip("needs a process set that is not every rank")
    model = hvd.DistributedDataParallel(make_model(), process_set=subgroups)
    model.register_comm_hook(
        local_sgd.PostLocalSGDState(process_group=None, subgroup=None, start_localSGD_iter=0),
        local_sgd.post_localSGD_hook)
    with pytest.raises(ValueError, match="subgroup given"):
        loss_of(model, *batch(0, 0)).backward()
