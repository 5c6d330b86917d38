"""How gradsync.torch names a CUDA stream to the runtime, checked without a GPU."""

import types

import torch

from gradsync.torch import wire


def test_stream_of_reads_the_raw_current_stream(monkeypatch):
    """Where PyTorch hands out the current stream's raw handle, that handle is passed on for the
    device's index, the default stream (0) as the legacy stream's handle, never as 0."""
    asked = []
    handles = {0: 0, 1: 0x7F00}

    def raw(index):
        asked.append(index)
        return handles[index]

    monkeypatch.setattr(wire, "_raw_current_stream", raw)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert wire._stream_of(torch.device("cuda", 1)) == 0x7F00
    assert wire._stream_of(torch.device("cuda", 0)) == wire._CUDA_STREAM_LEGACY
    assert wire._stream_of(torch.device("cuda")) == 0x7F00  # the current device's
    assert asked == [1, 0, 1]


def test_stream_of_falls_back_to_the_stream_object(monkeypatch):
    monkeypatch.setattr(wire, "_raw_current_stream", None)
    streams = {None: 0, 2: 0x5000}
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device: types.SimpleNamespace(cuda_stream=streams[device.index]))
    assert wire._stream_of(torch.device("cuda", 2)) == 0x5000
    assert wire._stream_of(torch.device("cuda")) == wire._CUDA_STREAM_LEGACY
