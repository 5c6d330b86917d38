"""DistributedOptimizer's ``groups``: a group reduces only the parameters the optimizer updates.

A frozen parameter, or one the optimizer does not hold, never produces a gradient for the
optimizer; a group that waited for it was never reduced, and each rank stepped on its own
gradients. Each rank here trains on its own share of a batch, so only a reduction over every
rank brings the replicas to one process's result on the whole batch.
"""

import pytest
import torch

import gradsync.torch as hvd

STEPS = 3
PER_RANK = 4
LEARNING_RATE = 0.1
TOLERANCE = 1e-10  # float64: the reduction sums in another order than the reference


def make_model():
    torch.manual_seed(4321)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 4)).double()


class TwoHeads(torch.nn.Module):
    """A trunk and two heads; the second is used only when asked (a branch taken at times)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(4321)
        self.trunk = torch.nn.Linear(8, 16).double()
        self.head = torch.nn.Linear(16, 4).double()
        self.extra_head = torch.nn.Linear(16, 4).double()

    def forward(self, x, use_extra_head):
        hidden = torch.tanh(self.trunk(x))
        out = self.head(hidden)
        return out + self.extra_head(hidden) if use_extra_head else out


def whole_batch(step, size):
    gen = torch.Generator().manual_seed(step)
    x = torch.randn(size * PER_RANK, 8, generator=gen, dtype=torch.float64)
    y = torch.randn(size * PER_RANK, 4, generator=gen, dtype=torch.float64)
    return x, y


def share_of(rank, tensor):
    return tensor[rank * PER_RANK:(rank + 1) * PER_RANK]


def flat(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def gather_replicas(model):
    """Every rank's parameters, one row each (a collective: call it on every rank)."""
    return hvd.allgather(flat(model).unsqueeze(0), name="optimizer_groups.replicas")


def assert_replicas_match(replicas, reference):
    # Every rank reaches this point only after the collectives, so a failure cannot leave
    # another rank waiting in one.
    for row in replicas:
        assert torch.equal(row, replicas[0])
    assert torch.allclose(replicas[0], reference, atol=TOLERANCE, rtol=0)


def freeze(module):
    for p in module.parameters():
        p.requires_grad_(False)


def train_sequential(model, optimizer, rank, size):
    for step in range(STEPS):
        x, y = whole_batch(step, size)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(share_of(rank, x)), share_of(rank, y))
        loss.backward()
        optimizer.step()


def reference_sequential(size, prepare):
    """One process on the whole batch; ``prepare(model)`` freezes what the test freezes and
    returns the parameters its optimizer steps."""
    model = make_model()
    optimizer = torch.optim.SGD(prepare(model), lr=LEARNING_RATE)
    for step in range(STEPS):
        x, y = whole_batch(step, size)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return flat(model)


def all_parameters_of(model):
    return model.parameters()


def frozen_first_layer(model):
    freeze(model[0])
    return model.parameters()


@pytest.mark.parametrize("layout", ["one group", "one group from a generator",
                                    "a group of frozen parameters only"])
def test_group_with_a_frozen_parameter_is_reduced(layout, rank, size):
    model = make_model()
    frozen_first_layer(model)
    groups = {
        "one group": [list(model.parameters())],
        "one group from a generator": [model.parameters()],
        # Dropped, as it has nothing to reduce; the other group is reduced as usual.
        "a group of frozen parameters only": [list(model[0].parameters()),
                                              list(model[2].parameters())],
    }[layout]
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LEARNING_RATE),
                                         named_parameters=model.named_parameters(),
                                         groups=groups)
    train_sequential(model, optimizer, rank, size)
    replicas = gather_replicas(model)
    assert_replicas_match(replicas, reference_sequential(size, frozen_first_layer))


def last_layer_only(model):
    return model[2].parameters()


def test_group_with_parameters_the_optimizer_does_not_hold_is_reduced(rank, size):
    model = make_model()
    not_a_model_parameter = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    # The first layer trains (its gradients are computed) but this optimizer does not step it.
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model[2].parameters(), lr=LEARNING_RATE),
        named_parameters=model[2].named_parameters(),
        groups=[list(model.parameters()) + [not_a_model_parameter]])
    train_sequential(model, optimizer, rank, size)
    replicas = gather_replicas(model)
    assert_replicas_match(replicas, reference_sequential(size, last_layer_only))


@pytest.mark.parametrize("make_groups", [
    lambda model: [[model[0].weight, model[2].weight], [model[0].weight]],
    lambda model: [[model[0].weight, model[0].weight]],
    lambda model: [[model[0].bias], [model[2].bias, model[0].bias]],
], ids=["in two groups", "twice in one group", "in two groups, last in the second"])
def test_a_parameter_listed_twice_is_refused(make_groups):
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    with pytest.raises(ValueError, match="only once"):
        hvd.DistributedOptimizer(optimizer, groups=make_groups(model))


def test_a_frozen_parameter_listed_twice_is_refused():
    # Refused although it is left out of the groups: the list is wrong all the same.
    model = make_model()
    freeze(model[0])
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    with pytest.raises(ValueError, match="only once"):
        hvd.DistributedOptimizer(optimizer, groups=[[model[0].weight], [model[0].weight]])


@pytest.mark.parametrize("make_groups", [
    lambda model: list(model.parameters()),  # not a list of lists
    lambda model: [[model[0].weight, "bias"]],
], ids=["a flat list", "not a tensor"])
def test_groups_that_are_not_lists_of_parameters_are_refused(make_groups):
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    with pytest.raises(ValueError, match="groups must be"):
        hvd.DistributedOptimizer(optimizer, groups=make_groups(model))


def uses_extra_head(unused_on, rank, step):
    if unused_on == "every rank":
        return False
    if unused_on == "rank 0":
        return rank != 0
    return step % 2 == 1  # "every other step"


@pytest.mark.parametrize("unused_on", ["every rank", "rank 0", "every other step"])
def test_group_with_a_parameter_without_a_gradient_is_reduced(unused_on, rank, size):
    """A member that gets no gradient in a step (an unused branch) counts as zeros, and its group
    is still reduced, on the ranks that used it and the ranks that did not."""
    model = TwoHeads()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LEARNING_RATE),
                                         named_parameters=model.named_parameters(),
                                         groups=[list(model.parameters())])
    for step in range(STEPS):
        x, y = whole_batch(step, size)
        optimizer.zero_grad()
        out = model(share_of(rank, x), uses_extra_head(unused_on, rank, step))
        torch.nn.functional.mse_loss(out, share_of(rank, y)).backward()
        optimizer.step()
    replicas = gather_replicas(model)

    # One process: the mean of the ranks' losses, each on its share with its own branch.
    reference = TwoHeads()
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=LEARNING_RATE)
    for step in range(STEPS):
        x, y = whole_batch(step, size)
        reference_optimizer.zero_grad()
        losses = [torch.nn.functional.mse_loss(
                      reference(share_of(r, x), uses_extra_head(unused_on, r, step)),
                      share_of(r, y))
                  for r in range(size)]
        (sum(losses) / size).backward()
        reference_optimizer.step()
    assert_replicas_match(replicas, flat(reference))
