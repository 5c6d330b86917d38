// What init() does between starting MPI and starting the background thread: the launch checks
// (runtime/launch_check.h) and this rank's placement (runtime/placement.h) on its node.
//
// Thread safety: called by init() on the caller thread, before the background thread exists;
// the LaunchSetup it fills is read-only afterwards.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>

#include "gradsync/status.h"
#include "runtime/config.h"
#include "runtime/hwloc_node.h"
#include "runtime/mpi_context.h"
#include "runtime/placement.h"

namespace gradsync {

struct LaunchSetup {
  int gpu = -1;  // this rank's GPU among the visible ones; -1 without one
  Placement placement;
  std::shared_ptr<const HwlocNode> node;  // null where hwloc could not read the node
  // The smallest last-level cache of every rank's node, in bytes; 0 when some rank's is unknown.
  int64_t cache_bytes = 0;

  // For the background thread to call first thing: binds it where placement said (a failure is
  // logged, not fatal).
  void BindBackgroundThread() const;
};

// Collective over the ranks of `mpi`. A failed check returns the same InvalidArgument on every
// rank; placement problems that leave training possible (hwloc cannot read the node, a binding
// the system refuses) are logged and skipped.
Status SetUpLaunch(const Config& config, const MpiContext& mpi, MPI_Comm base, LaunchSetup* out);

}  // namespace gradsync
