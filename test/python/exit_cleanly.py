"""A script's end, run under mpirun by ctest (not collected by pytest): it must exit with status 0.

  exit_cleanly.py mpi4py      mpi4py starts MPI first (it finalizes MPI at exit); gradsync is
                              started, reduces, leaves an operation unsynchronized and is never
                              shut down: the interpreter's exit must shut it down before mpi4py
                              finalizes MPI (before, the background thread met a finalized MPI)
  exit_cleanly.py owned       gradsync owns MPI and is shut down, which finalizes MPI: asking
                              mpi_threads_supported() afterwards answers False (before, it asked
                              MPI_Query_thread of a finalized MPI, which aborts)
"""

import sys

mode = sys.argv[1]
if mode == "mpi4py":
    from mpi4py import MPI  # noqa: F401  (MPI started, and finalized at exit, by mpi4py)

import torch

import gradsync.torch as hvd

hvd.init()
assert hvd.allreduce(torch.ones(4), op=hvd.Sum).tolist() == [float(hvd.size())] * 4
if mode == "mpi4py":
    hvd.allreduce_async(torch.ones(8), name="left.unsynchronized")
    print("exit_cleanly: rank %d leaves without shutdown()" % hvd.rank(), flush=True)
elif mode == "owned":
    rank = hvd.rank()
    hvd.shutdown()
    assert hvd.mpi_threads_supported() is False
    print("exit_cleanly: rank %d asked after shutdown()" % rank, flush=True)
else:
    sys.exit("exit_cleanly: unknown mode %r" % mode)
