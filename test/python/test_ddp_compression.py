"""DistributedDataParallel's compressed buckets: ``compression=`` and DDP's built-in
communication hooks, which register as compressions (hooks of a script's own:
test_ddp_comm_hooks.py)."""

import pytest
import torch

import gradsync.torch as hvd
from test_ddp import assert_replicas_equal, batch, flat, loss_of, make_model, perturbed_model


def _default_comm_hooks():
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    return default_hooks


# DDP's fp16 and bf16 hooks, registered as under DDP, are compressions of their dtype.
@pytest.mark.parametrize("bucket_cap_mb", [25, 0.0001])
@pytest.mark.parametrize("how", ["compression", "fp16_compress_hook", "bf16_compress_hook"])
def test_ddp_compressed_buckets_average_gradients(how, bucket_cap_mb, rank, size):
    """The bucket path (compression) gives every replica the average within the wire dtype's
    precision."""
    model = hvd.DistributedDataParallel(
        perturbed_model(rank).float(), bucket_cap_mb=bucket_cap_mb,
        compression=hvd.Compression.fp16 if how == "compression" else hvd.Compression.none)
    tolerance = 2e-2 if how.startswith("bf16") else 2e-3
    if how != "compression":
        model.register_comm_hook(None, getattr(_default_comm_hooks(), how))
        assert model.compression is (hvd.Compression.bf16 if how.startswith("bf16") else
                                     hvd.Compression.fp16)
    plain = make_model().float()
    for step in range(2):
        model.zero_grad()
        plain.zero_grad()
        x, y = batch(step, rank)
        loss_of(model, x.float(), y.float()).backward()
        got = flat(p.grad for p in model.parameters())
        assert_replicas_equal(got)
        with torch.no_grad():
            for mine, theirs in zip(plain.parameters(), model.parameters()):
                mine.copy_(theirs)
        total = sum(loss_of(plain, *(t.float() for t in batch(step, r))) for r in range(size))
        (total / size).backward()
        want = flat(p.grad for p in plain.parameters())
        assert torch.allclose(got, want, atol=tolerance, rtol=tolerance)


def test_ddp_register_comm_hook_once_and_callable():
    model = hvd.DistributedDataParallel(make_model())
    with pytest.raises(TypeError, match="callable"):
        model.register_comm_hook(None, "fp16")
    model.register_comm_hook(None, _default_comm_hooks().allreduce_hook)
    assert model.compression is hvd.Compression.none
    with pytest.raises(RuntimeError, match="only be called once"):
        model.register_comm_hook(None, _default_comm_hooks().fp16_compress_hook)
