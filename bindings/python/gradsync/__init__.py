"""gradsync: negotiated, fused gradient synchronization over MPI.

The framework integrations live in submodules; ``gradsync.torch`` offers the API of
``horovod.torch`` and a DDP-style module wrapper.
"""

from gradsync._core import GradsyncError, GradsyncInternalError, GradsyncValueError

__version__ = "0.1.0"

__all__ = ["GradsyncError", "GradsyncInternalError", "GradsyncValueError", "__version__"]
