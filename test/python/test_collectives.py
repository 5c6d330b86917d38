"""gradsync.torch's collectives across dtypes and ops, in and out of place, sync and async.

Values are small integers so that every dtype's result is exact.
"""

import pytest
import torch

import gradsync.torch as hvd

DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64]
SHAPES = [(), (0,), (1,), (17,), (3, 5), (2, 0, 3)]


def expected_reduction(op, size, rank_values):
    values = [float(v) for v in rank_values]
    if op == hvd.Sum:
        return sum(values)
    if op == hvd.Average:
        return sum(values) / size
    if op == hvd.Min:
        return min(values)
    if op == hvd.Max:
        return max(values)
    result = 1.0
    for v in values:
        result *= v
    return result


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", [hvd.Sum, hvd.Min, hvd.Max, hvd.Product])
@pytest.mark.parametrize("shape", SHAPES)
def test_allreduce_every_dtype_op_and_shape(dtype, op, shape, rank, size):
    value = rank % 2 + 1  # 1 or 2: products stay small
    tensor = torch.full(shape, value, dtype=dtype)
    result = hvd.allreduce(tensor, op=op, name="ar.%s.%d.%s" % (dtype, op, shape))
    want = expected_reduction(op, size, [r % 2 + 1 for r in range(size)])
    assert result.dtype == dtype and result.shape == tensor.shape
    assert torch.equal(result, torch.full(shape, want).to(dtype))
    assert torch.equal(tensor, torch.full(shape, value, dtype=dtype))  # input untouched


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_allreduce_average_and_scales(dtype, rank, size):
    tensor = torch.full((5,), float(rank + 1), dtype=dtype)
    mean = sum(range(1, size + 1)) / size
    assert torch.allclose(hvd.allreduce(tensor).double(), torch.full((5,), mean).double())
    assert torch.allclose(hvd.allreduce(tensor, average=True).double(),
                          torch.full((5,), mean).double())
    scaled = hvd.allreduce(tensor, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
    assert torch.allclose(scaled.double(), torch.full((5,), mean * size).double())


def test_average_flag_and_op_together_is_an_error():
    with pytest.raises(ValueError):
        hvd.allreduce(torch.ones(2), average=True, op=hvd.Sum)


@pytest.mark.parametrize("dtype", DTYPES)
def test_allreduce_in_place_and_async(dtype, rank, size):
    tensor = torch.full((4, 3), rank + 1, dtype=dtype)
    data_ptr = tensor.data_ptr()
    result = hvd.allreduce_(tensor, op=hvd.Sum, name="inplace.%s" % dtype)
    total = sum(range(1, size + 1))
    assert result is tensor and tensor.data_ptr() == data_ptr
    assert torch.equal(tensor, torch.full((4, 3), total).to(dtype))

    handle = hvd.allreduce_async_(tensor, op=hvd.Sum, name="inplace.async.%s" % dtype)
    hvd.synchronize(handle)
    assert torch.equal(tensor, torch.full((4, 3), total * size).to(dtype))

    source = torch.full((4, 3), rank + 1, dtype=dtype)
    handle = hvd.allreduce_async(source, op=hvd.Max, name="async.%s" % dtype)
    out = hvd.synchronize(handle)
    assert torch.equal(out, torch.full((4, 3), size).to(dtype))


def test_poll_becomes_true_and_handles_are_single_use(size):
    handle = hvd.allreduce_async(torch.ones(3), name="poll")
    while not hvd.poll(handle):
        pass
    assert torch.equal(hvd.synchronize(handle), torch.ones(3))
    assert hvd.synchronize(handle) is None  # as Horovod's: the handle was used up
    with pytest.raises(ValueError):
        hvd.poll(handle)


def test_handles_keep_their_tensors_until_synchronized(size):
    import gc
    import weakref
    from gradsync import _core
    before = _core.pending_handles()
    tensor = torch.ones(1000)
    alive = weakref.ref(tensor)
    handle = hvd.allreduce_async_(tensor, op=hvd.Sum, name="keep.alive")
    grouped = hvd.grouped_allreduce_async_([torch.ones(4), torch.ones(2, dtype=torch.int16)],
                                           op=hvd.Sum, name="keep.alive.group")
    del tensor
    gc.collect()
    assert alive() is not None, "the handle must hold the tensor its operation writes"
    assert _core.pending_handles() == before + 2
    result = hvd.synchronize(handle)
    assert result is alive() and torch.equal(result, torch.full((1000,), float(size)))
    del result
    gc.collect()
    assert alive() is None, "a synchronized handle must let its tensor go"
    # An int16 member travels as an int32 copy and comes back through the handle's finish.
    floats, shorts = hvd.synchronize(grouped)
    assert torch.equal(floats, torch.full((4,), float(size)))
    assert shorts.dtype == torch.int16 and torch.equal(shorts, torch.full((2,), size,
                                                                          dtype=torch.int16))
    assert _core.pending_handles() == before
    for unknown in (handle, -1, 2**70, "7", None):
        if isinstance(unknown, int):
            assert hvd.synchronize(unknown) is None  # as Horovod's, for a handle it does not hold
        else:
            with pytest.raises(ValueError, match="unknown handle"):
                hvd.synchronize(unknown)
        with pytest.raises(ValueError, match="unknown handle"):
            hvd.poll(unknown)


def test_handles_synchronized_together_as_one_at_a_time(size):
    from gradsync import _core
    from gradsync.torch.handles import _synchronize_all
    before = _core.pending_handles()
    handles = [hvd.allreduce_async_(torch.ones(3), op=hvd.Sum, name="together.%d" % i)
               for i in range(3)]
    handles.append(hvd.grouped_allreduce_async_([torch.ones(2), torch.ones(2, dtype=torch.int16)],
                                                op=hvd.Sum, name="together.group"))
    # Every handle is looked up before any is taken: one unknown leaves the rest pending.
    with pytest.raises(ValueError, match="unknown handle"):
        _synchronize_all(handles + [-1])
    assert _core.pending_handles() == before + 4
    *singles, (floats, shorts) = _synchronize_all(handles)
    for result in singles:
        assert torch.equal(result, torch.full((3,), float(size)))
    assert torch.equal(floats, torch.full((2,), float(size)))
    assert shorts.dtype == torch.int16 and torch.equal(shorts, torch.full((2,), size,
                                                                          dtype=torch.int16))
    assert _core.pending_handles() == before
    assert _synchronize_all([]) == []
    listed_twice = hvd.allreduce_async_(torch.ones(1), op=hvd.Sum, name="together.twice")
    with pytest.raises(ValueError, match="listed twice"):
        _synchronize_all([listed_twice, listed_twice])
    assert torch.equal(hvd.synchronize(listed_twice), torch.full((1,), float(size)))


def test_handles_synchronized_together_all_finish_before_a_failure_is_raised(rank, size):
    from gradsync import _core
    from gradsync.torch.handles import _synchronize_all
    if size == 1:
        pytest.skip("needs two ranks")
    before = _core.pending_handles()
    first = torch.ones(3)
    last = torch.ones(1 << 16)
    handles = [hvd.allreduce_async_(first, op=hvd.Sum, name="partway.first"),
               hvd.allreduce_async_(torch.ones(rank + 1), name="partway.mismatch"),
               hvd.allreduce_async_(last, op=hvd.Sum, name="partway.last")]
    with pytest.raises(hvd.HorovodInternalError, match="Mismatch"):
        _synchronize_all(handles)
    # Every handle was taken, and the one after the failure had finished writing its tensor.
    assert _core.pending_handles() == before
    assert torch.equal(first, torch.full((3,), float(size)))
    assert torch.equal(last, torch.full((1 << 16,), float(size)))


def test_non_contiguous_input_out_of_place(size):
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    view = base.t()
    result = hvd.allreduce(view, op=hvd.Sum, name="noncontig")
    assert torch.equal(result, view * size)
    # In place, such a tensor is reduced through a copy (test_layouts.py).


@pytest.mark.parametrize("compression", [hvd.Compression.none, hvd.Compression.fp16,
                                         hvd.Compression.bf16])
def test_allreduce_with_compression(compression, rank, size):
    tensor = torch.full((6,), float(rank + 1), dtype=torch.float32)
    result = hvd.allreduce(tensor, op=hvd.Sum, compression=compression,
                           name="compressed.%s" % compression.__name__)
    assert result.dtype == torch.float32
    assert torch.equal(result, torch.full((6,), float(sum(range(1, size + 1)))))


def test_grouped_allreduce_mixed_dtypes_in_and_out_of_place(rank, size):
    tensors = [torch.full((3,), rank + 1, dtype=torch.float32),
               torch.full((2, 2), rank + 1, dtype=torch.int64),
               torch.full((), rank + 1, dtype=torch.float64)]
    total = sum(range(1, size + 1))
    results = hvd.grouped_allreduce(tensors, op=hvd.Sum, name="group")
    for t, r in zip(tensors, results):
        assert torch.equal(r, torch.full(t.shape, total).to(t.dtype))
        assert torch.equal(t, torch.full(t.shape, rank + 1).to(t.dtype))
    hvd.grouped_allreduce_(tensors, op=hvd.Sum, name="group.inplace")
    for t in tensors:
        assert torch.equal(t, torch.full(t.shape, total).to(t.dtype))
    handle = hvd.grouped_allreduce_async([torch.ones(2)] * 2, name="group.async")
    assert all(torch.equal(r, torch.ones(2)) for r in hvd.synchronize(handle))
    assert hvd.grouped_allreduce([]) == []


@pytest.mark.parametrize("dtype", DTYPES)
def test_allgather_variable_first_dimension(dtype, rank, size):
    tensor = torch.full((rank + 1, 2), rank, dtype=dtype)
    result = hvd.allgather(tensor, name="ag.%s" % dtype)
    want = torch.cat([torch.full((r + 1, 2), r, dtype=dtype) for r in range(size)])
    assert torch.equal(result, want)
    scalar = hvd.allgather(torch.tensor(rank, dtype=dtype), name="ag.scalar.%s" % dtype)
    assert torch.equal(scalar, torch.arange(size).to(dtype))
    empty = hvd.allgather(torch.zeros((0, 3), dtype=dtype), name="ag.empty.%s" % dtype)
    assert empty.shape == (0, 3)


def test_host_output_buffers_are_host_memory(rank, size):
    # A host input's output is host memory behind the buffer protocol; only device outputs offer
    # __cuda_array_interface__, which torch.as_tensor would otherwise take for device memory.
    from gradsync import _core
    t = torch.full((2,), float(rank))
    h = _core.allgather(t.data_ptr(), 6, [2], 0, -1, "host.output.buffer", 0, 0, t)
    h.wait()
    assert h.output.device == -1 and h.output.nbytes == 8 * size
    assert not hasattr(h.output, "__cuda_array_interface__")
    assert torch.equal(torch.frombuffer(h.output, dtype=torch.float32),
                       torch.arange(size, dtype=torch.float32).repeat_interleave(2))


def test_a_handle_dropped_before_its_registration_keeps_its_tensors_until_done(rank, size):
    # A KeyboardInterrupt between an enqueue and its registration drops the runtime's handle: what
    # the operation reads or writes (here a marker beside the tensor) stays alive until it is
    # done, and goes once a later registration finds it done.
    import time
    import weakref
    from gradsync import _core

    class Marker:
        pass

    marker = Marker()
    alive = weakref.ref(marker)
    t = torch.full((2,), float(rank))
    if rank == 1:
        time.sleep(0.5)  # rank 0's operation waits for this rank's
    _core.allgather(t.data_ptr(), 6, [2], 0, -1, "dropped.handle", 0, 0, (t, marker))
    del marker
    if rank == 0 and size > 1:
        assert alive() is not None, "released while the operation may still run"
    hvd.barrier()  # every rank's allgather is done before this completes
    hvd.allreduce(torch.zeros(1), name="dropped.handle.after")  # a registration
    assert alive() is None


def test_grouped_allgather(rank, size):
    results = hvd.grouped_allgather([torch.full((1,), rank), torch.full((2, 1), float(rank))],
                                    name="gag")
    assert torch.equal(results[0], torch.arange(size))
    assert torch.equal(results[1], torch.arange(size).float().repeat_interleave(2).reshape(-1, 1))


@pytest.mark.parametrize("dtype", DTYPES)
def test_broadcast_every_root(dtype, rank, size):
    for root in range(size):
        tensor = torch.full((3,), rank, dtype=dtype)
        assert torch.equal(hvd.broadcast(tensor, root, name="bc.%s.%d" % (dtype, root)),
                           torch.full((3,), root, dtype=dtype))
        assert torch.equal(tensor, torch.full((3,), rank, dtype=dtype))
        hvd.broadcast_(tensor, root, name="bc_.%s.%d" % (dtype, root))
        assert torch.equal(tensor, torch.full((3,), root, dtype=dtype))


def test_broadcast_bad_root_fails_on_every_rank(size):
    with pytest.raises((hvd.HorovodInternalError, ValueError)):
        hvd.broadcast(torch.ones(1), size, name="bad.root")
    assert torch.equal(hvd.allreduce(torch.ones(1), op=hvd.Sum, name="after.bad.root"),
                       torch.full((1,), float(size)))


def test_alltoall_even_and_explicit_splits(rank, size):
    even = hvd.alltoall(torch.arange(size * 2, dtype=torch.int32) + 100 * rank, name="a2a")
    want = torch.cat([torch.arange(rank * 2, rank * 2 + 2, dtype=torch.int32) + 100 * r
                      for r in range(size)])
    assert torch.equal(even, want)
    # Rank r sends r + 1 rows to every rank.
    splits = [rank + 1] * size
    tensor = torch.full((sum(splits), 2), float(rank))
    output, received = hvd.alltoall(tensor, splits=splits, name="a2a.splits")
    assert received.tolist() == [r + 1 for r in range(size)]
    assert torch.equal(output, torch.cat([torch.full((r + 1, 2), float(r)) for r in range(size)]))


def test_alltoall_without_splits_needs_rows_that_divide(rank, size):
    if size == 1:
        pytest.skip("every count divides by one rank")
    for call in (hvd.alltoall, hvd.alltoall_async):
        with pytest.raises(ValueError, match="divisible by the %d ranks" % size):
            call(torch.ones(size + 1), name="a2a.indivisible")
    # With splits the same rows go: every rank sends rank 0 two rows and the others one.
    output, received = hvd.alltoall(torch.ones(size + 1), splits=[2] + [1] * (size - 1),
                                    name="a2a.indivisible")
    assert received.tolist() == [2 if rank == 0 else 1] * size
    assert output.shape == (sum(received.tolist()),)


def test_alltoall_bad_splits_is_refused(size):
    with pytest.raises(ValueError):
        hvd.alltoall(torch.ones(3), splits=[5] * size, name="a2a.bad")


@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average])
def test_reducescatter_shares_rows(op, rank, size):
    rows = 2 * size + 1
    tensor = torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 2) * (rank + 1)
    result = hvd.reducescatter(tensor, op=op, name="rs.%d" % op)
    total = torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 2) * sum(
        range(1, size + 1))
    if op == hvd.Average:
        total = total / size
    counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
    start = sum(counts[:rank])
    assert torch.allclose(result, total[start:start + counts[rank]])
    grouped = hvd.grouped_reducescatter([tensor, tensor.double()], op=op, name="grs.%d" % op)
    assert torch.allclose(grouped[1], total[start:start + counts[rank]].double())


def test_mismatched_shapes_fail_everywhere_and_later_collectives_work(rank, size):
    if size == 1:
        pytest.skip("needs two ranks")
    with pytest.raises(hvd.HorovodInternalError, match="Mismatch"):
        hvd.allreduce(torch.ones(rank + 1), name="mismatch.shape")
    with pytest.raises(hvd.HorovodInternalError, match="Mismatch"):
        hvd.allreduce(torch.ones(2, dtype=torch.float32 if rank == 0 else torch.float64),
                      name="mismatch.dtype")
    with pytest.raises(hvd.HorovodInternalError, match="Mismatch"):
        hvd.allreduce(torch.ones(2), op=hvd.Sum if rank == 0 else hvd.Max, name="mismatch.op")
    assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after.mismatch"),
                       torch.full((2,), float(size)))


def test_duplicate_name_in_flight_is_refused(rank, size):
    if size == 1:
        pytest.skip("one rank completes the first allreduce at once, so it is never in flight")
    # The other ranks submit "dup" only after the gate, which rank 0 reaches after its second
    # submission: rank 0's first "dup" is certainly still in flight when it submits the second.
    if rank == 0:
        first = hvd.allreduce_async(torch.ones(2), name="dup")
        with pytest.raises(ValueError, match="dup"):
            hvd.allreduce_async(torch.ones(2), name="dup")
        hvd.allreduce(torch.ones(1), name="dup.gate")
        hvd.synchronize(first)
    else:
        hvd.allreduce(torch.ones(1), name="dup.gate")
        hvd.allreduce(torch.ones(2), name="dup")


def test_unsupported_dtype_and_device():
    with pytest.raises(ValueError, match="not supported"):
        hvd.allreduce(torch.ones(2, dtype=torch.complex64))


def test_process_sets(rank, size):
    if size < 2:
        pytest.skip("needs two ranks")
    evens = hvd.add_process_set([r for r in range(size) if r % 2 == 0])
    try:
        if evens.included():
            result = hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=evens, name="ps")
            assert result.item() == evens.size()
            assert evens.rank() == rank // 2
        else:
            assert evens.rank() == -1
        hvd.barrier()
    finally:
        hvd.remove_process_set(evens)
    assert hvd.global_process_set.size() == size


def test_roots_in_a_process_set_are_global_ranks(rank, size):
    """As in Horovod: broadcast, broadcast_, broadcast_object, broadcast_parameters and
    broadcast_optimizer_state take the root's global rank, also with process_set=."""
    if size < 2:
        pytest.skip("needs a set smaller than the world")
    odd = hvd.add_process_set([r for r in range(size) if r % 2 == 1])
    try:
        if not odd.included():
            with pytest.raises(ValueError, match="not a member of process set"):
                hvd.broadcast(torch.ones(1), 1, name="roots.outside", process_set=odd)
            return
        assert hvd.broadcast_object("from %d" % rank, root_rank=1, name="roots.obj",
                                    process_set=odd) == "from 1"
        t = torch.full((2,), float(rank))
        assert torch.equal(hvd.broadcast(t, 1, name="roots.bc", process_set=odd),
                           torch.ones(2))
        hvd.broadcast_(t, 1, name="roots.bc_", process_set=odd)
        assert torch.equal(t, torch.ones(2))
        params = {"w": torch.full((3,), float(rank))}
        hvd.broadcast_parameters(params, root_rank=1, process_set=odd)
        assert torch.equal(params["w"], torch.ones(3))
        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * (rank + 1), momentum=0.9)
        hvd.broadcast_optimizer_state(optimizer, root_rank=1, process_set=odd)
        assert optimizer.param_groups[0]["lr"] == pytest.approx(0.2)
        if odd.size() > 1:
            # A member that is not the set's first is a root as well as any.
            last = max(r for r in range(size) if r % 2 == 1)
            assert hvd.broadcast_object(rank, root_rank=last, name="roots.last",
                                        process_set=odd) == last
        with pytest.raises(ValueError, match="not a member of process set"):
            hvd.broadcast(torch.ones(1), 0, name="roots.nonmember", process_set=odd)
    finally:
        hvd.remove_process_set(odd)


def test_join_with_uneven_steps(rank, size):
    # Rank r runs r + 1 steps; the others' allreduces see zeros from ranks that have joined.
    for step in range(rank + 1):
        result = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="join.step.%d" % step)
        assert result.item() == sum(1 for r in range(size) if r >= step)
    assert hvd.join() in range(size)


def test_barrier_and_basics(rank, size):
    hvd.barrier()
    assert hvd.is_initialized() and 0 <= hvd.local_rank() < hvd.local_size()
    # The GPU init() picked: by local rank where CUDA sees devices, -1 without one.
    gpus = torch.cuda.device_count() if hvd.cuda_built() else 0
    assert hvd.gpu_device() == (hvd.local_rank() % gpus if gpus else -1)
    assert hvd.mpi_built() and hvd.mpi_enabled() and not hvd.gloo_enabled()
    assert hvd.is_homogeneous()
    # A CUDA build reports NCCL's version; a CUDA-free one reports neither.
    assert hvd.cuda_built() == (hvd.nccl_built() > 0)
    assert hvd.nccl_built() == 0 or hvd.nccl_built() >= 20000


def test_allreduce_batch_slots(rank, size):
    from gradsync import _core
    tensors = [torch.full((3,), float(rank + 1)), torch.full((2, 2), float(rank + 1))]
    batch = _core.AllreduceBatch(["batch.a", "batch.b"], [6, 6], [[3], [2, 2]], [0, 0], [-1, -1],
                                 0, 1.0, 1.0, 0)
    assert len(batch) == 2 and batch.in_flight() == 0
    assert batch.bucket_count() == 1  # both small host tensors of one dtype
    expected = float(sum(range(1, size + 1)))
    for step in range(2):  # slots are reused step after step
        for t in tensors:
            t.fill_(float(rank + 1))
        batch.start(1, tensors[1].data_ptr())
        batch.start(0, tensors[0].data_ptr())
        with pytest.raises(ValueError, match="started twice"):
            batch.start(0, tensors[0].data_ptr())
        assert batch.in_flight() == 2
        batch.wait()
        assert batch.in_flight() == 0
        for t in tensors:
            assert torch.equal(t, torch.full_like(t, expected))
    with pytest.raises(ValueError, match="no tensor 2"):
        batch.start(2, tensors[0].data_ptr())
    with pytest.raises(ValueError, match="one name"):
        _core.AllreduceBatch(["x"], [6, 6], [[1]], [0], [-1], 0, 1.0, 1.0, 0)
