"""The threads that complete the torch.distributed backend's futures (process_group_work's
_Completer), with operations that are events this test sets: one order's operations complete in
turn on few threads, callbacks may wait for later operations, orders do not wait for each other,
failures still complete their futures, and idle threads end."""

import threading
import time

import torch

from gradsync.torch import process_group_work

TIMEOUT = 20.0


class Operation:
    """An operation whose wait() blocks until the test sets it done."""

    def __init__(self, value):
        self.value = value
        self.done = threading.Event()

    def wait(self):
        assert self.done.wait(TIMEOUT), "an operation was never set done"
        return self.value


def submitted(completer, operations, order=None):
    futures = []
    for op in operations:
        future = torch.futures.Future()
        completer.submit(op.wait, lambda value: value, future, order=order)
        futures.append(future)
    return futures


def settled(future):
    return future.wait()  # torch's wait() of a done future returns at once


def test_an_orders_operations_share_one_waiting_thread():
    completer = process_group_work._Completer()
    operations = [Operation(i) for i in range(200)]
    futures = submitted(completer, operations, order=0)
    time.sleep(0.2)
    assert completer._threads == 1  # one thread waits for the oldest; the others queue
    deadline = time.monotonic() + TIMEOUT
    for op, future in zip(operations, futures):
        op.done.set()
        future.wait()
        # Settled: one thread waits for the next operation, the others are idle, and the
        # thread that completes it hands the order to one of them rather than start one.
        while ((completer._idle < completer._threads - 1 or completer._ready)
               and time.monotonic() < deadline):
            time.sleep(0.001)
    completer.drain()
    assert [settled(f) for f in futures] == list(range(200))
    assert completer._threads == 2


def test_a_callback_may_wait_for_a_later_operation_of_its_order():
    completer = process_group_work._Completer()
    first, second = Operation("first"), Operation("second")
    futures = submitted(completer, [first, second], order=0)
    seen = []
    chained = futures[0].then(lambda f: seen.append((f.value(), futures[1].wait())))
    first.done.set()
    second.done.set()
    chained.wait()
    assert seen == [("first", "second")]
    completer.drain()


def test_a_callback_may_submit_and_wait_for_an_operation_of_its_order():
    """As PyTorch's PowerSGD hook does: a callback starts another collective and waits for it."""
    completer = process_group_work._Completer()
    first, inner = Operation(1), Operation(2)
    (future,) = submitted(completer, [first], order=0)

    def callback(done):
        (later,) = submitted(completer, [inner], order=0)
        inner.done.set()
        return done.value() + later.wait()

    chained = future.then(callback)
    first.done.set()
    assert chained.wait() == 3
    completer.drain()


def test_orders_complete_apart():
    completer = process_group_work._Completer()
    stuck, free = Operation("stuck"), Operation("free")
    (blocked,) = submitted(completer, [stuck], order="a")
    (other,) = submitted(completer, [free], order="b")
    free.done.set()
    assert other.wait() == "free"
    assert not blocked.done()
    stuck.done.set()
    completer.drain()
    assert settled(blocked) == "stuck"


def test_failures_complete_their_futures_and_the_thread_goes_on(monkeypatch):
    completer = process_group_work._Completer()
    errors = []

    def failing_wait():
        raise RuntimeError("the runtime's error")

    def failing_on_error(error):
        errors.append(error)
        raise ValueError("a broken error handler")

    failed = torch.futures.Future()
    completer.submit(failing_wait, lambda value: value, failed, on_error=failing_on_error)
    completer.drain()
    assert isinstance(failed.value(), process_group_work._Failure)
    assert str(failed.value().error) == "the runtime's error" and len(errors) == 1

    def no_streams(devices):
        raise RuntimeError("no stream on %s" % (devices,))

    monkeypatch.setattr(process_group_work, "_streams_of_the_backend", no_streams)
    op = Operation("never waited")
    (refused,) = submitted(completer, [op], order=0)
    completer.drain()
    assert "no stream" in str(refused.value().error)
    monkeypatch.undo()
    later = Operation("later")
    later.done.set()
    (after,) = submitted(completer, [later], order=0)
    completer.drain()
    assert settled(after) == "later"


def test_idle_threads_end_but_one():
    completer = process_group_work._Completer()
    completer.IDLE_SECONDS = 0.05
    operations = [Operation(i) for i in range(6)]
    for i, op in enumerate(operations):
        submitted(completer, [op], order=i)  # six orders: six threads
    for op in operations:
        op.done.set()
    completer.drain()
    assert completer._threads == 6
    deadline = time.monotonic() + TIMEOUT
    while completer._threads > 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert completer._threads == 1
    op = Operation("again")
    op.done.set()
    (future,) = submitted(completer, [op])
    completer.drain()
    assert settled(future) == "again"



def test_only_the_runtimes_errors_are_reported_beside_the_future():
    """What ``finish`` raises on one rank is that rank's alone: reported to ``on_error`` (which
    makes PyTorch 1.13's next collective raise) it would keep that rank out of a collective the
    others start."""
    told = []
    refused = process_group_work._outcome(lambda: 1, lambda value: 1 / 0, told.append)
    assert isinstance(refused.error, ZeroDivisionError) and told == []

    def runtime_error():
        raise RuntimeError("the runtime's error")

    failed = process_group_work._outcome(runtime_error, lambda value: value, told.append)
    assert told == [failed.error]
