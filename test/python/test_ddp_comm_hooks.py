"""DistributedDataParallel's communication hooks of a script's own (gradsync.torch.comm_hooks):
the order and contents of the buckets a hook is given, futures completed on the backward's
thread, chained allreduces, the errors a wrong hook gets."""

import pytest
import torch

import gradsync.torch as hvd
from gradsync.torch.comm_hooks import allreduce_future, allreduce_hook
from test_ddp import assert_replicas_equal, batch, flat, loss_of, make_model

TOLERANCE = 1e-12


def local_and_average_gradients(step, rank, size):
    """This rank's own gradient of make_model() at ``step``, and the average over the ranks."""
    plain = make_model()
    loss_of(plain, *batch(step, rank)).backward()
    local = flat(p.grad for p in plain.parameters())
    plain.zero_grad()
    (sum(loss_of(plain, *batch(step, r)) for r in range(size)) / size).backward()
    return local, flat(p.grad for p in plain.parameters())


def gradients_after_backward(hook, step, rank, bucket_cap_mb=25, state=None):
    model = hvd.DistributedDataParallel(make_model(), bucket_cap_mb=bucket_cap_mb)
    model.register_comm_hook(state, hook)
    loss_of(model, *batch(step, rank)).backward()
    return flat(p.grad for p in model.parameters())


def completed(value):
    future = torch.futures.Future()
    future.set_result(value)
    return future


@pytest.mark.parametrize("bucket_cap_mb", [25, 0.0001])
def test_comm_hook_that_does_nothing_leaves_each_rank_its_own_gradient(bucket_cap_mb, rank, size):
    got = gradients_after_backward(lambda state, bucket: completed(bucket.buffer()), 0, rank,
                                   bucket_cap_mb)
    local, _ = local_and_average_gradients(0, rank, size)
    assert torch.allclose(got, local, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("bucket_cap_mb", [25, 0.0001])
def test_comm_hook_allreduce_hook_averages(bucket_cap_mb, rank, size):
    got = gradients_after_backward(allreduce_hook, 1, rank, bucket_cap_mb)
    assert_replicas_equal(got)
    _, average = local_and_average_gradients(1, rank, size)
    assert torch.allclose(got, average, atol=TOLERANCE, rtol=0)


def test_comm_hook_buckets_come_in_order_with_their_gradients(rank, size):
    seen = []

    def hook(state, bucket):
        grads = bucket.gradients()
        assert [g.shape for g in grads] == [p.shape for p in bucket.parameters()]
        assert bucket.buffer().numel() == sum(g.numel() for g in grads)
        if grads:
            assert grads[0].data_ptr() == bucket.buffer().data_ptr()  # views into the buffer
        seen.append((state, bucket.index(), bucket.is_last(), len(grads)))
        return allreduce_future(bucket.buffer())

    model = hvd.DistributedDataParallel(make_model(), bucket_cap_mb=0.0001)
    model.register_comm_hook("the state", hook)
    for step in range(2):
        seen.clear()
        loss_of(model, *batch(step, rank)).backward()
        count = len(model._buckets)
        assert count >= 3
        assert [s[1] for s in seen] == list(range(count))
        assert [s[2] for s in seen] == [False] * (count - 1) + [True]
        assert all(s[0] == "the state" for s in seen)
        assert sum(s[3] for s in seen) == len(list(model.parameters()))


def test_comm_hook_callbacks_start_allreduces_and_wait_for_them(rank, size):
    """A two-stage hook: a sum, then, from the sum's callback, an average of the sum over the
    ranks (unchanged, the same on every rank) waited for inside the callback; and a hook that
    waits for its own allreduce before returning."""

    def two_stages(state, bucket):
        def second(fut):
            total = fut.value()
            return allreduce_future(total / size).wait()
        return allreduce_future(bucket.buffer(), op=hvd.Sum).then(second)

    def waits_at_once(state, bucket):
        return completed(allreduce_future(bucket.buffer()).wait())

    _, average = local_and_average_gradients(2, rank, size)
    for hook in (two_stages, waits_at_once):
        got = gradients_after_backward(hook, 2, rank, bucket_cap_mb=0.0001)
        assert_replicas_equal(got)
        assert torch.allclose(got, average, atol=TOLERANCE, rtol=0)


def test_comm_hook_result_as_a_list_and_in_another_dtype(rank, size):
    """torch.distributed's futures hold lists; a hook that compresses may hand back another
    dtype, which the gradients are written in their own."""

    def as_list(state, bucket):
        return allreduce_future(bucket.buffer()).then(lambda fut: [fut.value()])

    def in_float32(state, bucket):
        return allreduce_future(bucket.buffer().float())

    _, average = local_and_average_gradients(0, rank, size)
    got = gradients_after_backward(as_list, 0, rank)
    assert torch.allclose(got, average, atol=TOLERANCE, rtol=0)
    got = gradients_after_backward(in_float32, 0, rank)
    assert got.dtype == torch.float64
    assert torch.allclose(got, average, atol=1e-6, rtol=0)


def test_comm_hook_that_returns_no_future_or_an_unfinished_one_raises(rank, size):
    with pytest.raises(TypeError, match="must return a torch.futures.Future"):
        gradients_after_backward(lambda state, bucket: bucket.buffer(), 0, rank)
    with pytest.raises(RuntimeError, match="was not complete at the end of backward"):
        gradients_after_backward(lambda state, bucket: torch.futures.Future(), 0, rank)

    def wrong_size(state, bucket):
        return completed(bucket.buffer()[:1])
    with pytest.raises(RuntimeError, match="must hold a tensor of the bucket's"):
        gradients_after_backward(wrong_size, 0, rank)


def test_comm_hook_error_in_a_callback_reaches_backward(rank, size):
    def broken(state, bucket):
        def fails(fut):
            raise ValueError("the hook's own error")
        return allreduce_future(bucket.buffer()).then(fails)

    with pytest.raises(RuntimeError, match="the hook's own error"):
        gradients_after_backward(broken, 0, rank)


def test_comm_hook_with_no_sync_and_accumulation(rank, size):
    """Steps inside no_sync() call no hook; the next synchronized step's buckets carry what
    accumulated."""
    calls = []

    def counting(state, bucket):
        calls.append(bucket.index())
        return allreduce_future(bucket.buffer())

    model = hvd.DistributedDataParallel(make_model())
    model.register_comm_hook(None, counting)
    with model.no_sync():
        loss_of(model, *batch(0, rank)).backward()
    assert calls == []
    loss_of(model, *batch(1, rank)).backward()
    assert calls == [0]
    got = flat(p.grad for p in model.parameters())
    plain = make_model()
    total = sum(loss_of(plain, *batch(0, r)) + loss_of(plain, *batch(1, r)) for r in range(size))
    (total / size).backward()
    assert torch.allclose(got, flat(p.grad for p in plain.parameters()), atol=TOLERANCE, rtol=0)


def test_comm_hook_whose_allreduce_fails_raises_the_runtimes_error(rank, size):
    """Ranks that reduce different shapes under one name: every rank's backward raises the
    runtime's error naming the difference, not the callback chain's."""
    if size == 1:
        pytest.skip("needs ranks that disagree")

    def disagreeing(state, bucket):
        return allreduce_future(bucket.buffer()[:rank + 1]).then(lambda fut: bucket.buffer())

    with pytest.raises(hvd.HorovodInternalError, match="shape"):
        gradients_after_backward(disagreeing, 0, rank)


def test_comm_hook_is_given_the_bucket_views_themselves(rank, size):
    """With gradient_as_bucket_view=True a hook's buffer is the flat bucket the gradients are
    views into (as under DDP), so a hook that reduces it in place leaves the gradients reduced
    with no copy; one that hands back another tensor has it copied into the bucket."""
    for copied in (False, True):
        buffers = []

        def hook(state, bucket):
            buffers.append(bucket.buffer())
            future = allreduce_future(bucket.buffer())
            return future.then(lambda fut: fut.value().clone()) if copied else future

        model = hvd.DistributedDataParallel(make_model(), gradient_as_bucket_view=True)
        model.register_comm_hook(None, hook)
        for step in range(2):
            model.zero_grad()
            buffers.clear()
            loss_of(model, *batch(step, rank)).backward()
            _, average = local_and_average_gradients(step, rank, size)
            assert torch.allclose(flat(p.grad for p in model.parameters()), average,
                                  atol=TOLERANCE, rtol=0)
            grads = [p.grad for p in model.parameters()]
            assert all(g._base is not None for g in grads)
            bases = {b.data_ptr() for b in buffers}
            assert all(any(b <= g.data_ptr() < b + (1 << 20) for b in bases) for g in grads)


def test_comm_hook_under_join_with_uneven_inputs(rank, size):
    """Joined ranks take part in the hooks' allreduces with zeros, so an averaging hook divides
    by every rank, as join()'s default does."""
    from test_ddp import TOLERANCE as DDP_TOLERANCE, perturbed_model, reference
    steps_of = [size + 1 - r for r in range(size)]
    model = hvd.DistributedDataParallel(perturbed_model(rank), bucket_cap_mb=0.0001)
    model.register_comm_hook(None, allreduce_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with model.join():
        for step in range(steps_of[rank]):
            optimizer.zero_grad()
            loss_of(model, *batch(step, rank)).backward()
            optimizer.step()
    gathered = hvd.allgather(flat(model.parameters()).unsqueeze(0), name="hooks.join.params")
    want = reference(size, steps_of[0], lambda step: [r for r in range(size) if steps_of[r] > step],
                     lambda s, n: size)
    assert torch.allclose(gathered[0], want, atol=DDP_TOLERANCE, rtol=0)
