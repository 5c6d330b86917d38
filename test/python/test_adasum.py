"""op=Adasum: the allreduce against a tree of pairwise combinations, and DistributedOptimizer's
Adasum form, which combines the ranks' optimizer steps."""

import pytest
import torch

import gradsync.torch as hvd
from test_training import assert_replicas_equal


def combine(a, b):
    dot, aa, bb = float(a @ b), float(a @ a), float(b @ b)
    ca = 1 - dot / (2 * aa) if aa > 0 else 1.0
    cb = 1 - dot / (2 * bb) if bb > 0 else 1.0
    return ca * a + cb * b


def tree(vectors):
    """Every rank's vector combined up the tree: at level d, the block of d ranks from g meets
    the block from g + d."""
    vectors = list(vectors)
    d = 1
    while d < len(vectors):
        for g in range(0, len(vectors), 2 * d):
            vectors[g] = combine(vectors[g], vectors[g + d])
        d *= 2
    return vectors[0]


def rank_vector(r, n, salt):
    gen = torch.Generator().manual_seed(1000 * salt + r)
    return torch.randn(n, generator=gen, dtype=torch.float64)


@pytest.mark.parametrize("dtype,tolerance", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_allreduce_matches_the_tree(dtype, tolerance, rank, size):
    tensors = [rank_vector(rank, n, salt).to(dtype) for salt, n in enumerate([5, 1000, 1])]
    results = [hvd.allreduce(t, op=hvd.Adasum, name="adasum.py.%s.%d" % (dtype, i))
               for i, t in enumerate(tensors)]
    for salt, (n, result) in enumerate(zip([5, 1000, 1], results)):
        want = tree([rank_vector(r, n, salt).to(dtype).double() for r in range(size)])
        assert torch.allclose(result.double(), want, rtol=tolerance, atol=tolerance)


def test_equal_tensors_stay_as_they_are():
    tensor = torch.linspace(-1, 1, 17, dtype=torch.float64)
    result = hvd.allreduce(tensor, op=hvd.Adasum, name="adasum.py.equal")
    assert torch.allclose(result, tensor, atol=1e-12)


def test_integer_tensors_and_reducescatter_are_refused():
    with pytest.raises(ValueError, match="floating-point"):
        hvd.allreduce(torch.ones(4, dtype=torch.int32), op=hvd.Adasum)
    with pytest.raises(ValueError, match="allreduce op"):
        hvd.reducescatter(torch.ones(4), op=hvd.Adasum)


def make_model():
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(),
                               torch.nn.Linear(8, 3)).double()


def batch(step, who):
    gen = torch.Generator().manual_seed(100 * step + who)
    return (torch.randn(5, 6, generator=gen, dtype=torch.float64),
            torch.randn(5, 3, generator=gen, dtype=torch.float64))


def flat(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def gradients(model, x, y):
    model.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


def test_optimizer_combines_the_ranks_steps(rank, size):
    """Plain SGD steps are -lr times the gradient: the combined step is the tree of every rank's,
    parameter by parameter, which every rank can compute from every rank's batch."""
    lr, steps = 0.1, 3
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr),
                                         named_parameters=model.named_parameters(),
                                         op=hvd.Adasum)
    reference = make_model()
    for step in range(steps):
        x, y = batch(step, rank)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        per_rank = [gradients(reference, *batch(step, r)) for r in range(size)]
        with torch.no_grad():
            for i, p in enumerate(reference.parameters()):
                change = tree([-lr * g[i].flatten() for g in per_rank])
                p.add_(change.view_as(p))
        assert torch.allclose(flat(model), flat(reference), atol=1e-12), "step %d" % step
    assert_replicas_equal(flat(model))


@pytest.mark.parametrize("optimizer_class,kwargs", [
    (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
    (torch.optim.Adam, {"lr": 0.01}),
])
@pytest.mark.parametrize("passes", [1, 2])
def test_same_batch_everywhere_trains_as_one_process(optimizer_class, kwargs, passes):
    """Equal steps combine into that step, so ranks that all see the same batch train as one
    process does, momentum and Adam's moments included."""
    model, alone = make_model(), make_model()
    optimizer = hvd.DistributedOptimizer(optimizer_class(model.parameters(), **kwargs),
                                         named_parameters=model.named_parameters(),
                                         op=hvd.Adasum, backward_passes_per_step=passes)
    local = optimizer_class(alone.parameters(), **kwargs)
    for step in range(4):
        optimizer.zero_grad()
        local.zero_grad()
        for p in range(passes):
            x, y = batch(10 * step + p, 0)
            torch.nn.functional.mse_loss(model(x), y).backward()
            torch.nn.functional.mse_loss(alone(x), y).backward()
        optimizer.step()
        local.step()
        assert torch.allclose(flat(model), flat(alone), atol=1e-10), "step %d" % step


def test_a_param_group_added_after_wrapping_is_combined():
    """Equal steps everywhere: the added group's parameters step as in one process."""
    head = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))
    backbone = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD([head], lr=0.5), op=hvd.Adasum)
    optimizer.add_param_group({"params": [backbone]})
    (2 * (head + backbone)).sum().backward()
    optimizer.step()
    assert torch.equal(backbone.detach(), torch.zeros(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="floating-point"):
        optimizer.add_param_group({"params": [torch.zeros(2, dtype=torch.int64)]})
    assert len(optimizer.param_groups) == 2


def test_optimizer_refuses_groups():
    model = make_model()
    with pytest.raises(ValueError, match="Adasum"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Adasum,
                                 num_groups=2)


def test_synchronize_before_step_steps_once_and_skipping_it_is_refused():
    """As Horovod's: the step applies the changes, so synchronize() does nothing and a step after
    it is still one step; skip_synchronize() cannot be honoured and says so."""
    model, alone = make_model(), make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                         named_parameters=model.named_parameters(), op=hvd.Adasum)
    local = torch.optim.SGD(alone.parameters(), lr=0.1, momentum=0.9)
    for step in range(2):
        x, y = batch(step, 0)
        for m, opt in ((model, optimizer), (alone, local)):
            opt.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
        optimizer.synchronize()
        optimizer.step()
        local.step()
        assert torch.allclose(flat(model), flat(alone), atol=1e-10), "step %d" % step
    with pytest.raises(AssertionError, match="Adasum"):
        with optimizer.skip_synchronize():
            pass


def test_what_adasum_cannot_do_is_refused():
    with pytest.raises(NotImplementedError, match="Sum and Average"):
        hvd.allreduce(torch.ones(3, requires_grad=True), op=hvd.Adasum)
    with pytest.raises(NotImplementedError, match="Sum and Average"):
        hvd.grouped_allreduce([torch.ones(3, requires_grad=True)], op=hvd.Adasum)
    model = make_model()
    with pytest.raises(ValueError, match="LBFGS"):
        hvd.DistributedOptimizer(torch.optim.LBFGS(model.parameters()), op=hvd.Adasum)
    with pytest.raises(ValueError, match="floating-point"):
        hvd.DistributedOptimizer(torch.optim.SGD([torch.zeros(2, dtype=torch.int64)], lr=1),
                                 op=hvd.Adasum)
