"""The Work and futures of gradsync's torch.distributed backend (gradsync.torch.process_group).

A collective's future is completed by a thread of this module, which takes the operations in the
order they started, with its result or its error; torch's Work around it is what its callers
wait for.

Thread safety: ``submit`` and ``wait_for_pending`` may be called from any thread.
"""

import collections
import contextlib
import threading

import torch
import torch.distributed as dist


class _Work(dist.Work):
    """What a collective returns under PyTorch 2, whose C++ callers (DDP's reducer) call a Python
    Work's methods: ``wait`` raises the runtime's error, as gloo's and NCCL's do."""

    def __init__(self, future):
        super().__init__()
        self._future = future

    def wait(self, timeout=None):
        del timeout  # gradsync's stall inspector bounds every wait
        self._future.wait()
        return True

    def get_future(self):
        return self._future

    def is_completed(self):
        return self._future.done()

    def is_success(self):
        return self._future.done() and self.exception() is None

    def exception(self):
        if not self._future.done():
            return None
        try:
            self._future.value()
        except Exception as error:
            return error
        return None

    def result(self):
        return self._future.value()


# PyTorch 1.13's C++ callers cannot call a Python Work's methods: there a collective returns
# torch's Work around its future, whose wait() does not raise (its future's does).
PYTHON_WORK = int(torch.__version__.split(".")[0]) >= 2


def work_of(future):
    if PYTHON_WORK:
        return _Work(future)
    return torch._C._distributed_c10d._create_work_from_future(future)


def complete(wait, finish, future, on_error=None):
    """Completes ``future`` with ``finish(wait())``, or with a _Failure of what either raised,
    which ``on_error`` is told first; here, on the calling thread."""
    try:
        value = finish(wait())
    except Exception as error:  # the runtime's error goes to the future's consumers
        if on_error is not None:
            on_error(error)
        value = _Failure(error)
    try:
        future.set_result(value)
    except Exception as error:  # a value the future refuses: its consumers must still wake
        future.set_result(_Failure(error))


_side_streams = {}  # CUDA device -> the backend's stream there


def _streams_of_the_backend(devices):
    """Makes the backend's stream of each CUDA device current. Not the device's default stream,
    which the trainer's kernels run on: ordering that after an operation as it completes would
    hold back the backward's later kernels until the operation is done."""
    stack = contextlib.ExitStack()
    for device in devices:
        stream = _side_streams.get(device)
        if stream is None:
            stream = _side_streams.setdefault(device, torch.cuda.Stream(device))
        stack.enter_context(torch.cuda.stream(stream))
    return stack


class _Completer:
    """The threads that complete the backend's futures. Each waits for one operation at a time,
    oldest first, and runs its future's callbacks; a new thread starts when every one is busy,
    so that a callback that waits for a later operation (PyTorch's PowerSGD hook waits inside
    its callbacks) never waits for the thread it runs on."""

    def __init__(self):
        lock = threading.Lock()
        self._queued = threading.Condition(lock)  # an operation added, for idle threads
        self._finished = threading.Condition(lock)  # one completed, for drain()
        self._queue = collections.deque()  # (wait, finish, future, on_error, devices)
        self._unfinished = 0
        self._idle = 0  # threads waiting for an operation

    def submit(self, wait, finish, future, on_error=None, devices=()):
        """Completes ``future`` with ``finish(wait())``, or with a _Failure of what either
        raised, which ``on_error`` is told first. On CUDA ``devices`` the three run with the
        backend's own stream of each device current: the results are ordered there, and the
        future's consumers wait for that stream when they wait, not before."""
        with self._queued:
            self._queue.append((wait, finish, future, on_error, tuple(devices)))
            self._unfinished += 1
            if self._idle > len(self._queue) - 1:
                self._queued.notify()
                return
            self._idle += 1  # the new thread's, counted before it runs
        threading.Thread(target=self._run, name="gradsync-futures", daemon=True).start()

    def drain(self):
        """Returns once every future submitted so far is complete, its callbacks run."""
        with self._finished:
            while self._unfinished:
                self._finished.wait()

    def _run(self):
        while True:
            with self._queued:
                while not self._queue:
                    self._queued.wait()
                self._idle -= 1
                wait, finish, future, on_error, devices = self._queue.popleft()
            try:
                with _streams_of_the_backend(devices):
                    complete(wait, finish, future, on_error)
            finally:
                with self._queued:
                    self._unfinished -= 1
                    self._idle += 1
                    self._finished.notify_all()


class _Failure:
    """A failed operation's error, as its source future's value."""

    def __init__(self, error):
        self.error = error


def _raise_failure(source):
    value = source.value()
    if isinstance(value, _Failure):
        raise value.error
    return value


def future_of(source):
    """The future a collective's consumers get: its source's value, or the source's _Failure
    raised. torch's own set_exception reaches only the Python object it is called on, not the
    copies torch's Work and C++ callers (DDP's reducer) hold, while an error raised in a callback
    reaches every consumer."""
    return source.then(_raise_failure)


completer = _Completer()


def wait_for_pending():
    """Returns once the futures of every operation started through the backend are complete."""
    completer.drain()
