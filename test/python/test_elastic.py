"""gradsync.torch.elastic's pieces on one machine: durable commits, the sampler's division of an
epoch across restarts with other numbers of ranks, and the state's commit, restore and resume.
The launcher's scenarios (hosts failing and coming back) are in test/elastic/."""

import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy
import pytest
import torch

import gradsync.torch as hvd
from gradsync.torch.elastic import _resume, notices, store
from gradsync.torch.elastic.sampler import ElasticSampler


def test_commits_are_numbered_pruned_and_read_back(tmp_path):
    directory = str(tmp_path / "commits")
    assert store.latest(directory) == -1
    for number in (1, 2, 3):
        store.write(directory, number, {"step": number, "w": torch.full((3,), float(number))})
    assert store.commits(directory) == [2, 3]  # the newest two are kept
    assert store.latest(directory) == 3
    assert store.read(directory, 3)["step"] == 3


def test_a_killed_writers_temporary_file_is_removed_by_the_next_commit(tmp_path):
    """This host's leftovers of a writer that is gone go; another host's and a live one's stay."""
    directory = str(tmp_path / "commits")
    store.write(directory, 1, {"step": 1})
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid no process has now
    host = socket.gethostname()
    stem = os.path.join(directory, "commit-0000000002.pt.")
    dead = "%s%s.%d.tmp" % (stem, host, gone.pid)
    live = "%s%s.%d.tmp" % (stem, host, os.getppid())
    elsewhere = "%sanother-host.%d.tmp" % (stem, gone.pid)
    for path in (dead, live, elsewhere):
        with open(path, "w") as f:
            f.write("half")
    store.write(directory, 2, {"step": 2})
    assert not os.path.exists(dead)
    assert os.path.exists(live) and os.path.exists(elsewhere)


class Progress:
    """A value of the script's own class, which a state keeps as it is."""

    def __init__(self, seen):
        self.seen = seen


def test_a_commit_holds_what_a_state_keeps_beside_tensors(tmp_path):
    """A module's and an optimizer's state, a numpy scalar and an object of the script's: read
    back whole under PyTorch 2.6 and later too, whose torch.load takes only tensors by default."""
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    directory = str(tmp_path / "commits")
    store.write(directory, 1, {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                               "loss": numpy.float64(0.25), "progress": Progress([1, 2])})
    back = store.read(directory, 1)
    assert torch.equal(back["model"]["weight"], model.weight.detach())
    assert back["optimizer"]["state"][0]["momentum_buffer"] is not None
    assert back["loss"] == 0.25 and back["progress"].seen == [1, 2]


# Run in a process of its own (not forked from this one, which MPI has started): it begins commit
# 2, and is killed in the middle of writing its bytes, as a host going down would be.
_KILLED_MID_COMMIT = """
import os, signal, sys, torch
from gradsync.torch.elastic import store
def half_then_die(payload, f):
    f.write(b"\\x80" * 4096)
    f.flush()
    os.kill(os.getpid(), signal.SIGKILL)
torch.save = half_then_die
store.write(sys.argv[1], 2, {"w": torch.zeros(1 << 20)})
"""


def test_a_commit_killed_halfway_leaves_the_previous_one_whole(tmp_path):
    directory = str(tmp_path / "commits")
    store.write(directory, 1, {"w": torch.arange(4.0)})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_"))}
    killed = subprocess.run([sys.executable, "-c", _KILLED_MID_COMMIT, directory], env=env)
    assert killed.returncode == -signal.SIGKILL
    leftovers = os.listdir(directory)
    assert any(name.endswith(".tmp") for name in leftovers), leftovers
    assert store.latest(directory) == 1
    assert torch.equal(store.read(directory, 1)["w"], torch.arange(4.0))


def test_the_writer_keeps_the_newest_and_reports_failures(tmp_path):
    writer = store.Writer(str(tmp_path / "commits"))
    for number in range(1, 6):
        writer.submit(number, {"n": number})
    writer.flush()
    assert writer.written == 5 and store.latest(str(tmp_path / "commits")) == 5
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    failing = store.Writer(str(blocked))
    failing.submit(1, {"n": 1})
    with pytest.raises(RuntimeError, match="writing a commit"):
        failing.flush()


def _replica(dataset, epoch, processed_num):
    sampler = ElasticSampler.undivided(dataset, shuffle=True, seed=9)
    sampler.epoch, sampler.processed_num = epoch, processed_num
    return sampler


@pytest.mark.parametrize("sizes", [(3, 2, 3), (4, 1), (1, 4, 2), (2,)])
def test_each_sample_of_an_epoch_is_processed_once_across_resizes(sizes):
    # An epoch of 101 samples in batches of 2, the job restarting with sizes[k] ranks after
    # 3 steps of each world but the last: every sample is processed, and only the last batch's
    # padding repeats any (fewer than one per rank).
    dataset = list(range(101))
    seen = []
    processed = 0
    for k, size in enumerate(sizes):
        shares = []
        for r in range(size):
            replica = _replica(dataset, 0, processed)
            replica.partition(size, r)
            shares.append(replica.indices)
        steps = 3 if k + 1 < len(sizes) else -(-len(shares[0]) // 2)
        for step in range(steps):
            for share in shares:
                seen += share[step * 2:step * 2 + 2]
            replica.record_batch(step, 2)
        processed = replica.processed_num
    assert sorted(set(seen)) == dataset
    assert len(seen) - len(dataset) < sizes[-1]


@pytest.mark.parametrize("left", [0, 1, 2, 3, 5, 9])
@pytest.mark.parametrize("size", [1, 2, 3, 4, 8])
def test_every_rank_gets_as_many_samples_however_few_are_left(left, size):
    # With fewer samples left in the epoch than ranks to pad, each rank still runs as many steps
    # (a rank with none would skip the step's collectives the others wait in).
    dataset = list(range(16))
    shares = []
    for r in range(size):
        replica = _replica(dataset, 1, len(dataset) - left)
        replica.partition(size, r)
        shares.append(replica.indices)
    assert {len(share) for share in shares} == {-(-left // size)}
    assert sorted(set(sum(shares, []))) == sorted(replica.remaining_indices)


def test_ranks_wait_for_a_slow_writer_in_rounds(monkeypatch, rank, size):
    # Rank 0's commits reach the disk in the third round: every rank goes round as often, each
    # round a collective that completes, and they leave together.
    monkeypatch.setattr(hvd.elastic, "_ROUND_SECONDS", 0.01)
    calls = []

    def flush(seconds):
        calls.append(seconds)
        return rank != 0 or len(calls) >= 3

    hvd.elastic._until_every_rank(flush, "test.elastic.rounds")
    assert calls == [0.01] * 3


def test_state_commits_restores_and_resumes_from_disk(tmp_path, monkeypatch, rank, size):
    directory = hvd.broadcast_object(str(tmp_path / "commits"), root_rank=0,
                                     name="test.elastic.dir")
    monkeypatch.setenv("GRADSYNC_ELASTIC_CHECKPOINT_DIR", directory)
    model = torch.nn.Linear(3, 1).double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)
    _resume(state)
    with torch.no_grad():
        model.weight.fill_(1.0)
    state.epoch, state.batch = 2, 7
    state.commit()
    with torch.no_grad():
        model.weight.fill_(5.0)
    state.batch = 9
    state.restore()
    assert state.batch == 7 and torch.equal(model.weight, torch.ones(1, 3, dtype=torch.float64))
    state.flush()
    hvd.barrier()

    # A new world: different values everywhere, rank 0's commit on disk.
    fresh_model = torch.nn.Linear(3, 1).double()
    with torch.no_grad():
        fresh_model.weight.fill_(float(rank + 10))
    fresh = hvd.elastic.TorchState(fresh_model, torch.optim.SGD(fresh_model.parameters(), lr=0.5),
                                   epoch=0, batch=0)
    _resume(fresh)
    assert (fresh.epoch, fresh.batch) == (2, 7)
    assert torch.equal(fresh_model.weight, torch.ones(1, 3, dtype=torch.float64))
    assert fresh.optimizer.param_groups[0]["lr"] == 0.1
    hvd.barrier()


def test_the_writer_releases_what_it_wrote_or_dropped(tmp_path, monkeypatch):
    started, go = threading.Event(), threading.Event()

    def slow_write(directory, number, payload):
        started.set()
        go.wait(30)

    monkeypatch.setattr(store, "write", slow_write)
    released = []
    writer = store.Writer(str(tmp_path))
    writer.submit(1, {}, lambda _: released.append(1))
    assert started.wait(30)
    writer.submit(2, {}, lambda _: released.append(2))
    writer.submit(3, {}, lambda _: released.append(3))  # replaces 2, never written
    assert released == [2]
    go.set()
    writer.flush()
    assert released == [2, 1, 3]


class _KeepingSGD(torch.optim.SGD):
    """SGD whose load_state_dict keeps the tensors it is given, as PyTorch 2's optimizers do
    where dtype and device fit (1.13's copied them)."""

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        params = [p for group in self.param_groups for p in group["params"]]
        for index, values in state_dict["state"].items():
            self.state[params[index]].update(values)


def _momentum_model(optimizer_class=torch.optim.SGD):
    model = torch.nn.Linear(64, 8).double()
    optimizer = optimizer_class(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(2, 64, dtype=torch.float64)).sum().backward()
    optimizer.step()  # momentum buffers exist
    return model, optimizer


@pytest.mark.parametrize("optimizer_class", [torch.optim.SGD, _KeepingSGD])
def test_commits_reuse_snapshots_nothing_reads_and_restore_the_last(optimizer_class, monkeypatch):
    monkeypatch.delenv("GRADSYNC_ELASTIC_CHECKPOINT_DIR", raising=False)
    model, optimizer = _momentum_model(optimizer_class)
    state = hvd.elastic.TorchState(model, optimizer, step=0)
    copies = []
    for step in range(1, 5):
        with torch.no_grad():
            model.weight.fill_(float(step))
        state.step = step
        state.commit()
        copies.append(state._saved["model"]["weight"])
    # The state holds one snapshot; the one before it is free again for the next commit.
    assert copies[2] is copies[0] and copies[3] is copies[1] and copies[1] is not copies[0]
    with torch.no_grad():
        model.weight.fill_(-1.0)
    momentum = optimizer.state[model.weight]["momentum_buffer"]
    momentum.add_(100.0)
    state.restore()
    assert torch.equal(model.weight, torch.full((8, 64), 4.0, dtype=torch.float64))
    assert state.step == 4
    restored = optimizer.state[model.weight]["momentum_buffer"]
    assert restored.max().item() < 100.0
    saved = state._saved["optimizer"]["state"][0]["momentum_buffer"]
    assert restored.data_ptr() != saved.data_ptr()


def test_a_model_assigned_anew_is_the_one_saved_and_restored(monkeypatch):
    monkeypatch.delenv("GRADSYNC_ELASTIC_CHECKPOINT_DIR", raising=False)
    model, optimizer = _momentum_model()
    state = hvd.elastic.TorchState(model, optimizer)
    replacement = torch.nn.Linear(64, 8).double()
    state.model = replacement
    with torch.no_grad():
        replacement.weight.fill_(3.0)
    state.commit()
    with torch.no_grad():
        replacement.weight.fill_(-1.0)
    state.restore()
    assert state.model is replacement
    assert torch.equal(replacement.weight, torch.full((8, 64), 3.0, dtype=torch.float64))
    with pytest.raises(ValueError, match="state_dict"):
        state.optimizer = None


@pytest.mark.parametrize("optimizer_class", [torch.optim.SGD, _KeepingSGD])
def test_training_after_a_restore_leaves_the_commit_as_it_was(optimizer_class, monkeypatch):
    """Steps after a restore, then a failure before the next commit: the second restore gives the
    committed momentum again, not the one those steps left, whether or not the optimizer's
    load_state_dict copies what it is given."""
    monkeypatch.delenv("GRADSYNC_ELASTIC_CHECKPOINT_DIR", raising=False)
    model, optimizer = _momentum_model(optimizer_class)
    state = hvd.elastic.TorchState(model, optimizer)
    state.commit()
    committed = optimizer.state[model.weight]["momentum_buffer"].clone()
    for _ in range(2):
        state.restore()
        for _ in range(3):
            optimizer.zero_grad()
            model(torch.ones(2, 64, dtype=torch.float64)).sum().backward()
            optimizer.step()
        assert not torch.equal(optimizer.state[model.weight]["momentum_buffer"], committed)
    state.restore()
    assert torch.equal(optimizer.state[model.weight]["momentum_buffer"], committed)


def test_a_snapshot_the_writer_still_reads_is_never_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADSYNC_ELASTIC_CHECKPOINT_DIR", str(tmp_path / "commits"))
    started, go = threading.Event(), threading.Event()
    seen = []

    def slow_write(directory, number, payload):
        weight = payload["state_dicts"]["model"]["weight"]
        before = weight.clone()
        started.set()
        go.wait(30)
        seen.append((number, torch.equal(weight, before), before[0, 0].item()))

    monkeypatch.setattr(store, "write", slow_write)
    model, optimizer = _momentum_model()
    state = hvd.elastic.TorchState(model, optimizer)
    writes = hvd.local_rank() == 0  # one rank a host writes
    for step in range(1, 6):
        with torch.no_grad():
            model.weight.fill_(float(step))
        state.commit()
        if step == 1 and writes:
            assert started.wait(30)  # commit 1 is being written while 2 to 5 are made
    go.set()
    state.flush()
    if writes:
        # Commit 1 was read unchanged throughout; 2 to 4 were replaced unwritten; 5 was written.
        assert seen == [(1, True, 1.0), (5, True, 5.0)]


def test_the_hosts_watch_reaches_the_launcher_past_a_proxy(monkeypatch):
    """Rank 0 polls the launcher directly: an http_proxy set for the hosts' traffic is not used."""
    class Launcher(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"version": 1}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Launcher)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")  # nothing listens there
    try:
        watch = notices._HostWatch("127.0.0.1:%d" % server.server_address[1], 0)
        deadline = time.monotonic() + 10
        while not watch.changed() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert watch.changed()
    finally:
        server.shutdown()
        server.server_close()
