"""Start, stop and describe the job: init, shutdown, ranks, sizes and what this build has."""

import atexit
import os

from gradsync import _core

# HOROVOD_* variables that mean the same as a GRADSYNC_* one: a script moved from Horovod keeps
# its launch environment. A GRADSYNC_* variable that is set wins.
_HOROVOD_FALLBACKS = {
    "GRADSYNC_FUSION_THRESHOLD": "HOROVOD_FUSION_THRESHOLD",
    "GRADSYNC_CYCLE_TIME_MS": "HOROVOD_CYCLE_TIME",
    "GRADSYNC_CACHE_CAPACITY": "HOROVOD_CACHE_CAPACITY",
    "GRADSYNC_TIMELINE": "HOROVOD_TIMELINE",
    "GRADSYNC_STALL_WARNING_SECONDS": "HOROVOD_STALL_CHECK_TIME_SECONDS",
    "GRADSYNC_STALL_SHUTDOWN_SECONDS": "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
    "GRADSYNC_LOG_LEVEL": "HOROVOD_LOG_LEVEL",
}

# Horovod's log levels with gradsync's name for each.
_HOROVOD_LOG_LEVELS = {"trace": "trace", "debug": "debug", "info": "info", "warning": "warning",
                       "error": "error", "fatal": "error"}


def _apply_horovod_environment():
    for ours, theirs in _HOROVOD_FALLBACKS.items():
        if ours in os.environ or theirs not in os.environ:
            continue
        value = os.environ[theirs]
        if ours == "GRADSYNC_LOG_LEVEL":
            value = _HOROVOD_LOG_LEVELS.get(value.strip().lower(), value)
        os.environ[ours] = value


# The communicator init(comm=[ranks]) made, kept for as long as gradsync runs on it.
_ranks_comm = None


def _comm_to_fint(comm):
    """An mpi4py communicator, or a list of ranks of MPI_COMM_WORLD (as Horovod takes them: only
    those ranks call init), as a Fortran handle."""
    global _ranks_comm
    if comm is None or (isinstance(comm, (list, tuple)) and not comm):
        return -1  # no ranks named: all of MPI_COMM_WORLD
    if hasattr(comm, "py2f"):
        return comm.py2f()
    if isinstance(comm, (list, tuple)) and all(isinstance(r, int) for r in comm):
        if len(set(comm)) != len(comm):
            raise ValueError("init(comm=%r) names a rank twice" % (list(comm),))
        try:
            from mpi4py import MPI
        except ImportError:
            raise ValueError("init(comm=[ranks]) makes its communicator with mpi4py, which is not "
                             "installed; pass an mpi4py communicator, or process_sets=[...]")
        world = MPI.COMM_WORLD
        if world.Get_rank() not in comm:
            raise ValueError("init(comm=%r): this rank (%d of MPI_COMM_WORLD) is not among them; "
                             "only the listed ranks call init" % (list(comm), world.Get_rank()))
        # Collective over the listed ranks only, which MPI_Comm_create_group allows; they are
        # numbered in the list's order, as MPI_Group_incl numbers them.
        _ranks_comm = world.Create_group(world.Get_group().Incl(list(comm)))
        return _ranks_comm.py2f()
    raise ValueError("init(comm=...) takes an mpi4py communicator or a list of ranks of "
                     "MPI_COMM_WORLD, not %r" % (comm,))


# How many times init() has started gradsync in this process: what is cached per job (process sets
# made from the ranks' layout) is cached per start, since a restart renumbers the sets.
_starts = 0


def starts():
    """How many times ``init`` has started gradsync in this process."""
    return _starts


def init(comm=None, process_sets=None):
    """Starts gradsync on ``comm`` (MPI_COMM_WORLD by default): collective over its ranks.

    ``process_sets`` is a list of ``ProcessSet`` objects (or lists of global ranks) to create at
    init; every rank must pass the same list. Initializing twice is a no-op, as in Horovod.
    """
    from gradsync.torch import process_sets as _sets

    global _starts
    if _core.is_initialized():
        return
    _apply_horovod_environment()
    requested = list(process_sets or [])
    rank_lists = [_sets._ranks_of(s) for s in requested]
    try:
        _core.init(_comm_to_fint(comm), rank_lists)
    except BaseException:
        _free_ranks_comm()
        raise
    _starts += 1
    _sets._after_init(requested)
    _learn_homogeneity()


@atexit.register
def _shut_down_at_exit():
    """The interpreter's exit shuts a running gradsync down, as Horovod's does, while MPI and CUDA
    still work: a script that ends without shutdown() otherwise leaves the background thread
    running into MPI_Finalize (mpi4py's, which runs after the interpreter's exit handlers) and
    into the interpreter's teardown."""
    if _core.is_initialized():
        shutdown()


def shutdown():
    """Fails what is still pending, stops the background thread and frees gradsync's MPI state.
    Handles already returned stay valid: ``synchronize`` gives the result of an operation that
    completed and raises the shutdown error for one that did not."""
    _core.shutdown()
    _core.settle_handles()
    _free_ranks_comm()


def _free_ranks_comm():
    global _ranks_comm
    if _ranks_comm is not None:
        _ranks_comm.Free()
        _ranks_comm = None


is_initialized = _core.is_initialized
rank = _core.rank
size = _core.size
local_rank = _core.local_rank
local_size = _core.local_size
cross_rank = _core.cross_rank
cross_size = _core.cross_size
# The GPU init() picked for this rank (local rank modulo the visible GPUs, or
# GRADSYNC_GPU_DEVICE); -1 without one: torch.cuda.set_device(hvd.gpu_device()).
gpu_device = _core.gpu_device
mpi_threads_supported = _core.mpi_threads_supported
stop_timeline = _core.stop_timeline


def start_timeline(file_path, mark_cycles=False):
    """Writes a Chrome-trace timeline to ``file_path`` on rank 0; cycles are always marked."""
    del mark_cycles
    _core.start_timeline(file_path)


# Whether every node runs as many ranks as every other, as init found: a job-wide answer, the
# same on every rank, which a rank's own local and cross sizes cannot give. On nodes of 3, 2 and
# 1 ranks, local size * cross size is 3 * 3 at local rank 0 but 3 * 2, the job's 6, at local
# rank 1.
_homogeneous = True


def _same_ranks_per_node(local_sizes):
    """Whether the ranks whose local sizes these are all run on nodes of one size."""
    return len(set(local_sizes)) <= 1


def _learn_homogeneity():
    """Gathers every rank's local size once per start: a collective, so it is not left to the
    first is_homogeneous() call, which some ranks may make and others not."""
    import torch

    from gradsync.torch.allgather import allgather

    global _homogeneous
    local_sizes = allgather(torch.tensor([local_size()], dtype=torch.int32),
                            name="gradsync.init.local_sizes")
    _homogeneous = _same_ranks_per_node(local_sizes.tolist())


def is_homogeneous():
    """True when every node runs the same number of ranks; the same on every rank."""
    size()  # raises, as every other query does, outside init and shutdown
    return _homogeneous


def mpi_enabled():
    return True


def mpi_built():
    return True


def gloo_enabled():
    return False


def gloo_built():
    return False


def nccl_built():
    """NCCL's version code (as Horovod reports it) when this build reduces CUDA tensors, else 0."""
    return _core.nccl_version()


def cuda_built():
    return bool(_core.built_with_cuda())


def rocm_built():
    return False


def ddl_built():
    return False


def ccl_built():
    return False
