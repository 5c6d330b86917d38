"""CUDA tensors through gradsync.torch: results on the tensor's device, every collective, and
DistributedOptimizer training a model on the GPU to identical replicas that match one process on
the full batch. Skipped where this build has no CUDA or the machine has no GPU."""

import json
import os

import pytest
import torch

import gradsync.torch as hvd

pytestmark = pytest.mark.skipif(
    not (hvd.cuda_built() and torch.cuda.is_available()),
    reason="needs a CUDA build of gradsync and a GPU")


@pytest.fixture
def device():
    index = hvd.gpu_device()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16,
                                   torch.int32])
def test_cuda_allreduce_stays_on_the_device(dtype, device, rank, size):
    t = torch.full((1000,), rank + 1, dtype=dtype, device=device)
    summed = hvd.allreduce(t, op=hvd.Sum, name="cuda.sum.%s" % dtype)
    assert summed.device == device and summed.dtype == dtype
    assert torch.equal(summed.cpu(), torch.full((1000,), size * (size + 1) // 2, dtype=dtype))
    hvd.allreduce_(t, op=hvd.Max, name="cuda.max.%s" % dtype)
    assert torch.equal(t.cpu(), torch.full((1000,), size, dtype=dtype))


def test_cuda_average_with_scales_and_grouped(device, rank, size):
    tensors = [torch.full((n,), float(rank + 1), device=device) for n in (1, 7, 300000)]
    averaged = hvd.grouped_allreduce(tensors, op=hvd.Average, prescale_factor=2.0,
                                     postscale_factor=0.5, name="cuda.grouped")
    expected = (size + 1) / 2.0
    for t in averaged:
        assert t.device == device
        assert torch.allclose(t.cpu(), torch.full_like(t.cpu(), expected))


def test_cuda_allgather_output_on_the_device(device, rank, size):
    mine = torch.full((rank + 1, 3), float(rank), device=device)
    gathered = hvd.allgather(mine, name="cuda.allgather")
    assert gathered.device == device
    assert gathered.shape == (size * (size + 1) // 2, 3)
    expected = torch.cat([torch.full((r + 1, 3), float(r)) for r in range(size)])
    assert torch.equal(gathered.cpu(), expected)
    # Ranks whose rows are empty still take part, and get the others' rows on the device.
    empty_or_not = torch.ones((1 if rank == 0 else 0, 2), device=device)
    rows = hvd.allgather(empty_or_not, name="cuda.allgather.uneven")
    assert rows.device == device and rows.shape == (1, 2)


def test_cuda_broadcast_alltoall_reducescatter(device, rank, size):
    t = torch.full((5,), float(rank), device=device)
    hvd.broadcast_(t, root_rank=0, name="cuda.broadcast")
    assert torch.equal(t.cpu(), torch.zeros(5))

    sent = torch.arange(size, dtype=torch.float32, device=device) + 100 * rank
    received = hvd.alltoall(sent, name="cuda.alltoall")
    assert received.device == device
    assert torch.equal(received.cpu(), torch.tensor([100.0 * r + rank for r in range(size)]))

    rows = torch.ones((size * 2, 3), device=device)
    mine = hvd.reducescatter(rows, op=hvd.Sum, name="cuda.reducescatter")
    assert mine.device == device
    assert torch.equal(mine.cpu(), torch.full((2, 3), float(size)))


def make_model(device):
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(),
                               torch.nn.Linear(32, 4)).double().to(device)


def full_batch(step, size, device, per_rank=4):
    gen = torch.Generator().manual_seed(step)
    x = torch.randn(size * per_rank, 8, generator=gen, dtype=torch.float64)
    y = torch.randn(size * per_rank, 4, generator=gen, dtype=torch.float64)
    return x.to(device), y.to(device)


def reference_parameters(steps, size, device):
    """One process's parameters after ``steps`` steps on the full batch of ``size`` ranks."""
    reference = make_model(device)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        x, y = full_batch(step, size, device)
        reference_optimizer.zero_grad()
        torch.nn.functional.mse_loss(reference(x), y).backward()
        reference_optimizer.step()
    return torch.cat([p.detach().flatten() for p in reference.parameters()])


def train_on_my_share(module, optimizer, steps, rank, size, device):
    """``steps`` steps, each on this rank's 4 rows of full_batch."""
    for step in range(steps):
        x, y = full_batch(step, size, device)
        mine = slice(rank * 4, (rank + 1) * 4)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(module(x[mine]), y[mine]).backward()
        optimizer.step()


# Compressed and grouped gradients are reduced in calls of their own, outside the optimizer's
# batch, and synchronized together.
@pytest.mark.parametrize("form", ["batch", "fp16", "groups"])
def test_cuda_distributed_optimizer_matches_full_batch(form, device, rank, size):
    steps = 5

    model = make_model(device)
    if rank != 0:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    # Names of this form's own: the forms run one after another in one process.
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=[(form + "." + n, p) for n, p in model.named_parameters()],
        compression=hvd.Compression.fp16 if form == "fp16" else hvd.Compression.none,
        groups=2 if form == "groups" else None)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    train_on_my_share(model, optimizer, steps, rank, size, device)

    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert params.device == device
    gathered = hvd.allgather(params.unsqueeze(0), name="cuda.replicas")
    for row in gathered:
        assert torch.equal(row, gathered[0])
    # fp16 gradients keep 11 bits of each.
    rtol, atol = (1e-2, 1e-3) if form == "fp16" else (1e-5, 1e-7)
    assert torch.allclose(params, reference_parameters(steps, size, device), rtol=rtol, atol=atol)


# About 1.5 s of spinning at 2 GHz: far longer than any enqueue or launch takes.
SPIN_CYCLES = 3_000_000_000


def staged_through_host():
    """The MPI backend copies through host memory, so its completion waits for the producer."""
    return os.environ.get("GRADSYNC_GPU_BACKEND") == "mpi"


def test_cuda_allreduce_never_waits_for_the_producer_on_the_host(device, rank, size):
    t = torch.zeros(1 << 20, device=device)
    torch.cuda.synchronize()
    torch.cuda._sleep(SPIN_CYCLES)
    t.fill_(rank + 1)
    produced = torch.cuda.Event()
    produced.record()
    h = hvd.allreduce_async_(t, op=hvd.Sum, name="cuda.slow.producer")
    assert not produced.query(), "the enqueue waited for the producer"
    hvd.synchronize(h)
    if not staged_through_host():
        assert not produced.query(), "synchronize() waited for the producer"
    assert torch.equal(t.cpu(), torch.full((1 << 20,), float(size * (size + 1) // 2)))


def record_streams(monkeypatch):
    """Every ``Tensor.record_stream`` call from now on, as (the tensor's address, the stream)."""
    recorded = []
    record = torch.Tensor.record_stream

    def recording(tensor, stream):
        recorded.append((tensor.data_ptr(), stream))
        record(tensor, stream)

    monkeypatch.setattr(torch.Tensor, "record_stream", recording)
    return recorded


def test_cuda_a_tensor_consumed_on_another_stream_is_not_reused_before_it(device, rank, size):
    """A tensor made, reduced and let go of on one stream while the result is waited for on
    another: the caching allocator hands its memory out again on the first stream only after the
    second stream's wait, which is after gradsync's stream, which is after the producer still
    spinning on the first stream."""
    n = 1 << 20
    t = torch.full((n,), float(rank + 1), device=device)
    address = t.data_ptr()
    torch.cuda._sleep(SPIN_CYCLES)
    h = hvd.allreduce_async_(t, op=hvd.Sum, name="cuda.consumer.elsewhere")
    side = torch.cuda.Stream(device)
    with torch.cuda.stream(side):
        hvd.synchronize(h)
        head = t[:4].clone()
    del t
    reused = torch.empty(n, device=device)
    if not staged_through_host():  # there the host waited for the producer
        assert reused.data_ptr() != address, "memory the collective may still write was reused"
    torch.cuda.synchronize()
    assert head.cpu().tolist() == [float(size * (size + 1) // 2)] * 4


def test_cuda_gradients_consumed_on_another_stream_are_recorded_there(monkeypatch, device, rank,
                                                                      size):
    """Backward makes the gradients on the default stream and the optimizer's step runs on a side
    stream: every gradient reduced in place is recorded on the side stream, whose kernels the
    allocator must wait for before it hands the gradient's memory out on the default one."""
    model = make_model(device)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=[("elsewhere." + n, p) for n, p in model.named_parameters()])
    recorded = record_streams(monkeypatch)
    x, y = full_batch(0, size, device)
    mine = slice(rank * 4, (rank + 1) * 4)
    torch.nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        optimizer.step()
    torch.cuda.current_stream(device).wait_stream(side)
    on_side = {ptr for ptr, stream in recorded if stream == side}
    assert {p.grad.data_ptr() for p in model.parameters()} <= on_side
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert torch.allclose(params, reference_parameters(1, size, device), rtol=1e-5, atol=1e-7)


def test_cuda_converted_copies_outlive_a_consumer_on_another_stream(monkeypatch, device, rank,
                                                                    size):
    """A bool or int16 tensor travels as a converted copy made on the enqueuing stream. Waited for
    on another stream, the copy is handed to the caching allocator only once told to wait for that
    stream, which copies the result out of it after the collective has read and written it; so
    are the caller's own tensors."""
    recorded = record_streams(monkeypatch)
    flags = torch.tensor([rank == 0, False, True], device=device)
    counts = torch.full((4,), rank + 1, dtype=torch.int16, device=device)
    rooted = torch.full((3,), rank, dtype=torch.int16, device=device)
    handles = [hvd.allreduce_async_(flags, op=hvd.Max, name="cuda.converted.bool"),
               hvd.grouped_allreduce_async_([counts], op=hvd.Sum, name="cuda.converted.group"),
               hvd.broadcast_async_(rooted, 0, name="cuda.converted.broadcast")]
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for h in handles:
            hvd.synchronize(h)
    # Each handle records its converted copy and the caller's tensor.
    assert len(recorded) >= 6 and {stream for _, stream in recorded} == {side}
    assert {t.data_ptr() for t in (flags, counts, rooted)} <= {ptr for ptr, _ in recorded}
    torch.cuda.current_stream(device).wait_stream(side)
    assert flags.cpu().tolist() == [True, False, True]
    assert counts.cpu().tolist() == [size * (size + 1) // 2] * 4
    assert rooted.cpu().tolist() == [0] * 3


@pytest.mark.parametrize("wrapper", ["optimizer", "ddp", "ddp-views"])
def test_cuda_backward_hooks_never_wait_for_the_gpu(wrapper, device, rank, size):
    """Backward returns while the GPU still runs the step's first kernels, as with PyTorch DDP,
    and training still matches one process on the full batch."""
    steps = 3
    model = make_model(device)
    if wrapper.startswith("ddp"):
        module = hvd.DistributedDataParallel(model,
                                             gradient_as_bucket_view=wrapper == "ddp-views")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    else:
        module = model
        optimizer = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
            named_parameters=[("hooks." + n, p) for n, p in model.named_parameters()])
    for step in range(steps):
        x, y = full_batch(step, size, device)
        mine = slice(rank * 4, (rank + 1) * 4)
        optimizer.zero_grad()
        torch.cuda.synchronize()
        torch.cuda._sleep(SPIN_CYCLES)
        torch.nn.functional.mse_loss(module(x[mine]), y[mine]).backward()
        after_backward = torch.cuda.Event()
        after_backward.record()
        still_running = not after_backward.query()
        optimizer.step()
        # DDP's wrapper finishes its reductions as backward ends, which the MPI backend does on
        # the host. The first step sets up device buffers, whose growth may synchronize the
        # device (cudaFree), as DDP's first step does.
        if step > 0 and not (wrapper.startswith("ddp") and staged_through_host()):
            assert still_running, "a hook waited for the GPU (step %d)" % step
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert torch.allclose(params, reference_parameters(steps, size, device), rtol=1e-5, atol=1e-7)


class TwoStreamModel(torch.nn.Module):
    """make_model's layers, the first run on a side stream: backward makes the last layer's
    gradients on the default stream and the first layer's, the bucket's last, on the side one."""

    def __init__(self, device):
        super().__init__()
        self.body = make_model(device)
        self.side = torch.cuda.Stream(device)

    def forward(self, x):
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            hidden = self.body[1](self.body[0](x))
        torch.cuda.current_stream().wait_stream(self.side)
        hidden.record_stream(torch.cuda.current_stream())
        return self.body[2](hidden)


# Each form launches the last bucket or group from the side stream's hook: the views, the DDP
# wrapper's compressed buckets, and the optimizer's compressed gradients and groups, whose copies
# are made on the side stream and let go of after the step.
@pytest.mark.parametrize("form", ["ddp-views", "ddp-fp16", "optimizer-fp16", "optimizer-groups"])
def test_cuda_gradients_from_two_streams(form, device, rank, size):
    """A bucket started on the side stream waits for the default stream's gradients too (which
    PyTorch names 0 and gradsync cudaStreamLegacy), and training matches one process on the full
    batch."""
    steps = 3
    model = TwoStreamModel(device)
    fp16 = form.endswith("fp16")
    compression = hvd.Compression.fp16 if fp16 else hvd.Compression.none
    if form.startswith("ddp"):
        module = hvd.DistributedDataParallel(model, gradient_as_bucket_view=form == "ddp-views",
                                             compression=compression)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    else:
        module = model
        optimizer = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
            named_parameters=[(form + "." + n, p) for n, p in model.named_parameters()],
            compression=compression, groups=2 if form == "optimizer-groups" else None)
    train_on_my_share(module, optimizer, steps, rank, size, device)
    params = torch.cat([p.detach().flatten() for p in model.body.parameters()])
    rtol, atol = (1e-2, 1e-3) if fp16 else (1e-5, 1e-7)
    assert torch.allclose(params, reference_parameters(steps, size, device), rtol=rtol, atol=atol)


def test_cuda_bucket_views_are_reduced_where_they_lie(device, rank, size, tmp_path):
    """The DDP wrapper's bucket views, a bucket a parameter: whether the runtime reduces them
    alone or fuses several (adjacent slices of one allocation) into one bucket of its own, no copy
    kernel runs at 1 rank (no DEVICE_COPY_IN in the timeline; with more, a fused bucket's order
    is the negotiated one, which may differ from memory's, and then is copied), and training
    matches one process on the full batch at any number of ranks."""
    steps = 3
    model = make_model(device)
    module = hvd.DistributedDataParallel(model, gradient_as_bucket_view=True, bucket_cap_mb=1e-6)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    path = tmp_path / "views.json"
    hvd.start_timeline(str(path))
    train_on_my_share(module, optimizer, steps, rank, size, device)
    hvd.stop_timeline()
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert torch.allclose(params, reference_parameters(steps, size, device), rtol=1e-5, atol=1e-7)
    if size == 1:
        with open(path) as trace:
            names = {event.get("name") for event in json.load(trace)["traceEvents"]}
        assert "DEVICE_ALLREDUCE" in names
        assert "DEVICE_COPY_IN" not in names


@pytest.mark.parametrize("batched", [False, True])
def test_cuda_powersgd_trains_as_on_the_host(batched, device, rank, size):
    """The DDP wrapper with PowerSGD on the GPU: the parameters of the same training on the
    host (float64; test_powersgd.py ties the host's to PyTorch DDP's own hook)."""
    from gradsync.torch import powersgd
    from test_powersgd import batch, loss_of, make_model

    def trained(on):
        model = hvd.DistributedDataParallel(make_model().to(on))
        model.register_comm_hook(
            powersgd.PowerSGDState(matrix_approximation_rank=2, start_powerSGD_iter=2,
                                   batch_tensors_with_same_shape=batched),
            powersgd.batched_powerSGD_hook if batched else powersgd.powerSGD_hook)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        for step in range(5):
            optimizer.zero_grad()
            x, y = batch(step, rank)
            loss_of(model, x.to(on), y.to(on)).backward()
            optimizer.step()
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    on_gpu = trained(device)
    assert on_gpu.device == device
    assert torch.allclose(on_gpu.cpu(), trained(torch.device("cpu")), rtol=0, atol=1e-9)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16])
def test_cuda_adasum_gets_the_host_tensors_bits(dtype, device, rank, size):
    """op=Adasum on CUDA tensors, which the runtime combines on the host side (no collective
    library has Adasum), packs each bucket as host tensors' are packed: the same bits, grouped and
    alone."""
    if size & (size - 1):
        pytest.skip("Adasum needs a power-of-two number of ranks")
    gen = torch.Generator().manual_seed(rank)
    tensors = [torch.randn(n, generator=gen, dtype=torch.float64).to(dtype)
               for n in (1, 7, 1000, 0, 4099)]
    on_host = hvd.grouped_allreduce(tensors, op=hvd.Adasum, name="cuda.adasum.host.%s" % dtype)
    on_gpu = hvd.grouped_allreduce([t.to(device) for t in tensors], op=hvd.Adasum,
                                   name="cuda.adasum.gpu.%s" % dtype)
    for host, gpu in zip(on_host, on_gpu):
        assert gpu.device == device
        assert torch.equal(gpu.cpu(), host)
    alone = hvd.allreduce(tensors[2].to(device), op=hvd.Adasum, prescale_factor=2.0,
                          name="cuda.adasum.alone.%s" % dtype)
    assert torch.equal(alone.cpu(), hvd.allreduce(tensors[2], op=hvd.Adasum, prescale_factor=2.0,
                                                  name="cuda.adasum.alone.host.%s" % dtype))


def test_cuda_adasum_optimizer_trains_as_on_the_host(device, rank, size):
    """DistributedOptimizer(op=Adasum) with the parameters on the GPU: the host's training."""
    if size & (size - 1):
        pytest.skip("Adasum needs a power-of-two number of ranks")
    from test_adasum import batch, make_model

    def trained(on):
        model = make_model().to(on)
        optimizer = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
            named_parameters=[("%s.%s" % (on.type, n), p) for n, p in model.named_parameters()],
            op=hvd.Adasum)
        for step in range(4):
            x, y = batch(step, rank)
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x.to(on)), y.to(on)).backward()
            optimizer.step()
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    on_gpu = trained(device)
    assert on_gpu.device == device
    assert torch.allclose(on_gpu.cpu(), trained(torch.device("cpu")), rtol=0, atol=1e-9)


def test_cuda_pytorch_ddp_over_the_gradsync_backend(device, rank, size):
    """torch.distributed over the gradsync backend with CUDA tensors: a collective's result on
    the device, ordered on the caller's stream, and PyTorch's own DDP on the GPU training as it
    does on the host."""
    from gradsync.torch import process_group
    from test_process_group import batch, make_model
    dist = torch.distributed
    process_group.init_process_group()
    try:
        t = torch.full((1000,), float(rank + 1), device=device)
        dist.all_reduce(t)
        assert torch.equal(t.cpu(), torch.full((1000,), size * (size + 1) / 2.0))

        def trained(on):
            model = torch.nn.parallel.DistributedDataParallel(
                make_model().to(on), device_ids=[on.index] if on.type == "cuda" else None)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            for step in range(4):
                optimizer.zero_grad()
                x, y = batch(step, rank)
                torch.nn.functional.mse_loss(model(x.to(on)), y.to(on)).backward()
                optimizer.step()
            return torch.cat([p.detach().flatten() for p in model.parameters()])

        on_gpu = trained(device)
        assert on_gpu.device == device
        assert torch.allclose(on_gpu.cpu(), trained(torch.device("cpu")), rtol=0, atol=1e-9)
    finally:
        dist.destroy_process_group()
