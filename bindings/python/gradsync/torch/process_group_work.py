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


def _outcome(wait, finish, on_error):
    """``finish(wait())``, or a _Failure of what either raised. ``on_error`` is told what
    ``wait`` raised, the runtime's error, which every rank of the operation gets alike (not what
    ``finish`` raised on this rank alone)."""
    try:
        result = wait()
    except Exception as error:  # the runtime's error goes to the future's consumers
        if on_error is not None:
            try:
                on_error(error)
            except Exception:  # noqa: S110 (the future still gets the error)
                pass
        return _Failure(error)
    try:
        return finish(result)
    except Exception as error:
        return _Failure(error)


def _deliver(future, value):
    """Completes ``future`` with ``value``, which runs its callbacks; never raises."""
    try:
        future.set_result(value)
    except Exception as error:  # a value the future refuses: its consumers must still wake
        try:
            future.set_result(_Failure(error))
        except Exception:  # noqa: S110 (completed by the first call after all)
            pass


def complete(wait, finish, future, on_error=None):
    """Completes ``future`` with ``_outcome(wait, finish, on_error)``, here, on the calling
    thread."""
    _deliver(future, _outcome(wait, finish, on_error))


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


def caller_modes():
    """The calling thread's grad and inference modes, which are per thread."""
    return torch.is_grad_enabled(), torch.is_inference_mode_enabled()


def _under_modes(modes):
    """Enters ``modes`` (from ``caller_modes``) on this thread: the results' copies into the
    caller's tensors (a leaf that requires grad, written under ``no_grad``; a tensor made under
    ``inference_mode``) run here as they would have on the caller's thread."""
    grad, inference = modes
    if inference:
        return torch.inference_mode()
    if not grad:
        return torch.no_grad()
    return contextlib.nullcontext()


_END = object()  # what _Completer._take gives a thread that is to end


class _Completer:
    """The threads that complete the backend's futures.

    Operations of one order (a process set's) complete in the order they started: none waits
    for a later one of its order to make progress. So one thread at a time waits for an order's
    operations, oldest first, and the order's later operations wait for it, not for threads of
    their own. Once its operation is done the thread passes the order on (to an idle thread, or
    to one it starts when none is idle) and runs the future's callbacks, which may wait for
    later operations (PyTorch's PowerSGD hook does) without waiting for the thread they run on.
    Threads are as many as orders in flight and callbacks running at once; one idle for
    IDLE_SECONDS ends while another is left."""

    IDLE_SECONDS = 5.0

    def __init__(self):
        lock = threading.Lock()
        self._available = threading.Condition(lock)  # an order to take, for idle threads
        self._finished = threading.Condition(lock)  # a future completed, for drain()
        self._orders = {}  # order -> deque of (wait, finish, future, on_error, devices, modes)
        self._ready = collections.deque()  # orders with operations and no thread waiting on them
        self._unfinished = 0
        self._threads = 0
        self._idle = 0

    def submit(self, wait, finish, future, on_error=None, devices=(), order=None,
               modes=(True, False)):
        """Completes ``future`` with ``_outcome(wait, finish, on_error)`` after the operations
        submitted before it in ``order``, under the grad and inference ``modes`` (the
        submitter's, from ``caller_modes``). On CUDA ``devices`` the three run with the backend's
        own stream of each device current: the results are ordered there, and the future's
        consumers wait for that stream when they wait, not before."""
        with self._available:
            queue = self._orders.get(order)
            self._unfinished += 1
            job = (wait, finish, future, on_error, tuple(devices), modes)
            if queue is not None:  # a thread has the order, and takes this in turn
                queue.append(job)
                return
            self._orders[order] = collections.deque([job])
            self._offer(order)

    def drain(self):
        """Returns once every future submitted so far is complete, its callbacks run."""
        with self._finished:
            while self._unfinished:
                self._finished.wait()

    def _offer(self, order):
        """Hands ``order`` to an idle thread, or to a new one. Called with the lock held."""
        self._ready.append(order)
        if self._idle > len(self._ready) - 1:
            self._available.notify()
            return
        self._threads += 1
        self._idle += 1  # the new thread's, counted before it runs
        threading.Thread(target=self._run, name="gradsync-futures", daemon=True).start()

    def _take(self):
        """The next ready order, or _END when this thread is to end (idle, and not the last)."""
        with self._available:
            while not self._ready:
                if (not self._available.wait(self.IDLE_SECONDS) and not self._ready
                        and self._threads > 1):
                    self._threads -= 1
                    self._idle -= 1
                    return _END
            self._idle -= 1
            return self._ready.popleft()

    def _pass_on(self, order):
        """The order's operation is done: its next one (if any) goes to another thread."""
        with self._available:
            queue = self._orders[order]
            queue.popleft()
            if queue:
                self._offer(order)
            else:
                del self._orders[order]

    def _run(self):
        while True:
            order = self._take()
            if order is _END:
                return
            with self._available:
                wait, finish, future, on_error, devices, modes = self._orders[order][0]
            passed_on = False
            try:
                with _streams_of_the_backend(devices), _under_modes(modes):
                    value = _outcome(wait, finish, on_error)
                    self._pass_on(order)
                    passed_on = True
                    _deliver(future, value)
            except Exception as error:  # the backend's streams could not be made current
                if not passed_on:
                    self._pass_on(order)
                _deliver(future, _Failure(error))
            finally:
                with self._available:
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
