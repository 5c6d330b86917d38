// HwlocNode: the node's topology as hwloc reads it, and the binding calls placement needs.
//
// Owns one loaded hwloc topology. Load on the caller thread at init; afterwards every method may
// be called from any thread (hwloc topologies are safe to read concurrently once loaded).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "gradsync/status.h"
#include "runtime/cpu_list.h"
#include "runtime/placement.h"

struct hwloc_topology;

namespace gradsync {

class HwlocNode {
 public:
  // `with_pci`: also discover PCI devices, which CpusNearPciDevice needs (slower; only with GPUs).
  static Status Load(bool with_pci, std::unique_ptr<HwlocNode>* out);
  ~HwlocNode();

  HwlocNode(const HwlocNode&) = delete;
  HwlocNode& operator=(const HwlocNode&) = delete;

  NodeLayout Layout() const;
  // The size of the largest cache level hwloc finds (L3, else L2), in bytes; 0 when it finds none.
  int64_t LastLevelCacheBytes() const;
  // The CPUs the calling thread may run on now.
  Status ThreadBinding(CpuList* out) const;
  // The CPUs nearest the PCI device "domain:bus:device.function"; empty when it is not found.
  CpuList CpusNearPciDevice(const std::string& bus_id) const;

  // Every thread of the process, and those it starts later.
  Status BindProcess(const CpuList& cpus) const;
  Status BindCallingThread(const CpuList& cpus) const;

 private:
  explicit HwlocNode(hwloc_topology* topology) : topology_(topology) {}
  Status Bind(const CpuList& cpus, int flags, const char* what) const;

  hwloc_topology* topology_;
};

}  // namespace gradsync
