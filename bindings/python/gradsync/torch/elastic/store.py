"""Durable commits: each commit is one file in the job's checkpoint directory, which the launcher
gives the workers (gradsyncrun --checkpoint-dir; node-local or shared).

A commit is written whole or not at all: serialized into a temporary file beside its final name,
flushed to disk, then renamed over it, and the directory entry is flushed too. A process killed
mid-commit leaves a temporary file, never a partial commit, and the previous commit stays
loadable. Commits are numbered; a writer keeps the newest two and removes older ones.

On a shared directory several hosts may write the same commit; each writes its own temporary file
and the renames replace one whole file with another, so readers see one of them, all equal.

Writing runs on a thread of its own, so a commit costs the training loop only the copy of its
state in memory: while one commit is written, a newer one waits, and one newer still replaces it
(only the newest matters after a failure). ``flush()`` waits for the writes to end.
"""

import os
import re
import socket
import threading

import torch

_NAME = re.compile(r"commit-(\d{10})\.pt\Z")
_LEFTOVER = re.compile(r"commit-\d{10}\.pt\.(.+)\.(\d+)\.tmp\Z")  # a writer's, by host and pid
_KEEP = 2


def _path(directory, number):
    return os.path.join(directory, "commit-%010d.pt" % number)


def _fsync_directory(directory):
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # some filesystems cannot open a directory: the rename is then as durable as it gets
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def commits(directory):
    """The numbers of the whole commits in ``directory``, ascending."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for m in map(_NAME.match, names) if m)


def latest(directory):
    """The newest commit's number, or -1 when there is none."""
    found = commits(directory)
    return found[-1] if found else -1


def write(directory, number, payload):
    """Writes commit ``number`` (any object torch.save takes) whole, then prunes old commits."""
    os.makedirs(directory, exist_ok=True)
    final = _path(directory, number)
    temporary = "%s.%s.%d.tmp" % (final, socket.gethostname(), os.getpid())
    try:
        with open(temporary, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, final)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    _fsync_directory(directory)
    for old in commits(directory)[:-_KEEP]:
        try:
            os.unlink(_path(directory, old))
        except OSError:
            pass  # another host pruned it first
    _prune_leftovers(directory)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's: it runs
    return True


def _prune_leftovers(directory):
    """Removes the temporary files of writers on this host whose process is gone (killed
    mid-commit): each is a commit's size, and a job that restarts often would fill the disk with
    them. Another host's, or a live writer's, are left alone."""
    host = socket.gethostname()
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        match = _LEFTOVER.match(name)
        if match is None or match.group(1) != host:
            continue
        pid = int(match.group(2))
        if pid == os.getpid() or _alive(pid):
            continue
        try:
            os.unlink(os.path.join(directory, name))
        except OSError:
            pass


def read(directory, number):
    """Commit ``number``'s payload, as ``write`` was given it (tensors on the host)."""
    with open(_path(directory, number), "rb") as f:
        # The job's own commit: whatever its state keeps beside tensors (numpy values, objects of
        # the script's), which PyTorch 2.6's default (weights_only) refuses.
        return torch.load(f, map_location="cpu", weights_only=False)


def _release(submitted):
    if submitted is not None and submitted[2] is not None:
        submitted[2](submitted[1])


class Writer:
    """Writes commits on a thread of its own, newest first: see the module's docstring.

    Threads: ``submit`` and ``flush`` from the training thread.
    """

    def __init__(self, directory):
        self.directory = directory
        self._cv = threading.Condition()
        self._next = None     # (number, payload, release) waiting to be written
        self._busy = False    # a write is under way
        self._error = None    # the first write that failed, raised by the next call
        self.written = -1     # the newest commit this writer completed
        self._thread = threading.Thread(target=self._run, name="gradsync-commit", daemon=True)
        self._thread.start()

    def submit(self, number, payload, release=None):
        """Queues commit ``number``. ``release(payload)``, when given, is called (on either
        thread) once the writer no longer reads ``payload``: written, or replaced unwritten."""
        with self._cv:
            self._raise_error()
            replaced, self._next = self._next, (number, payload, release)
            self._cv.notify_all()
        _release(replaced)

    def flush(self, timeout=None):
        """Waits until every submitted commit is written (or replaced by a newer one), for at most
        ``timeout`` seconds when given; returns whether they are. Raises a failed write's error."""
        with self._cv:
            flushed = self._cv.wait_for(lambda: self._next is None and not self._busy, timeout)
            self._raise_error()
            return flushed

    def _raise_error(self):
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError("writing a commit to %s failed: %s" % (self.directory, error))

    def _run(self):
        while True:
            with self._cv:
                while self._next is None:
                    self._cv.wait()
                taken, self._next = self._next, None
                number, payload, _ = taken
                self._busy = True
            try:
                write(self.directory, number, payload)
                failure = None
            except Exception as e:  # reported to the training thread, which can act on it
                failure = e
            _release(taken)
            with self._cv:
                self._busy = False
                if failure is None:
                    self.written = max(self.written, number)
                elif self._error is None:
                    self._error = failure
                self._cv.notify_all()
