#include "runtime/hwloc_node.h"

#include <hwloc.h>

#include <cerrno>
#include <cstring>

namespace gradsync {
namespace {

// Frees an hwloc bitmap on every path out.
class Bitmap {
 public:
  Bitmap() : bitmap_(hwloc_bitmap_alloc()) {}
  explicit Bitmap(const CpuList& cpus) : Bitmap() {
    for (int cpu : cpus.cpus()) hwloc_bitmap_set(bitmap_, static_cast<unsigned>(cpu));
  }
  ~Bitmap() { hwloc_bitmap_free(bitmap_); }
  Bitmap(const Bitmap&) = delete;
  Bitmap& operator=(const Bitmap&) = delete;
  hwloc_bitmap_t get() const { return bitmap_; }

 private:
  hwloc_bitmap_t bitmap_;
};

CpuList ToCpuList(hwloc_const_bitmap_t bitmap) {
  std::vector<int> cpus;
  if (bitmap == nullptr || hwloc_bitmap_weight(bitmap) <= 0) {  // empty or infinite
    return CpuList();
  }
  for (int cpu = hwloc_bitmap_first(bitmap); cpu != -1; cpu = hwloc_bitmap_next(bitmap, cpu)) {
    cpus.push_back(cpu);
  }
  return CpuList(std::move(cpus));
}

Status HwlocFailure(const char* call, const std::string& detail) {
  return Status::Internal(std::string(call) + " failed" + (detail.empty() ? "" : " " + detail) +
                          ": " + std::strerror(errno));
}

}  // namespace

Status HwlocNode::Load(bool with_pci, std::unique_ptr<HwlocNode>* out) {
  hwloc_topology_t topology = nullptr;
  if (hwloc_topology_init(&topology) != 0) return HwlocFailure("hwloc_topology_init", "");
  if (with_pci) hwloc_topology_set_io_types_filter(topology, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (hwloc_topology_load(topology) != 0) {
    hwloc_topology_destroy(topology);
    return HwlocFailure("hwloc_topology_load", "");
  }
  out->reset(new HwlocNode(topology));
  return Status::OK();
}

HwlocNode::~HwlocNode() { hwloc_topology_destroy(topology_); }

int64_t HwlocNode::LastLevelCacheBytes() const {
  for (hwloc_obj_type_t level : {HWLOC_OBJ_L3CACHE, HWLOC_OBJ_L2CACHE}) {
    hwloc_obj_t cache = hwloc_get_obj_by_type(topology_, level, 0);
    if (cache != nullptr && cache->attr != nullptr && cache->attr->cache.size > 0) {
      return static_cast<int64_t>(cache->attr->cache.size);
    }
  }
  return 0;
}

NodeLayout HwlocNode::Layout() const {
  NodeLayout layout;
  layout.allowed = ToCpuList(hwloc_topology_get_allowed_cpuset(topology_));
  const int cores = hwloc_get_nbobjs_by_type(topology_, HWLOC_OBJ_CORE);
  for (int i = 0; i < cores; ++i) {
    const CpuList core = ToCpuList(hwloc_get_obj_by_type(topology_, HWLOC_OBJ_CORE, i)->cpuset);
    if (!core.empty()) layout.cores.push_back(core);
  }
  if (layout.cores.empty()) {  // some virtual machines report no cores: one per processor
    for (int cpu : layout.allowed.cpus()) layout.cores.push_back(CpuList({cpu}));
  }
  const int numa = hwloc_get_nbobjs_by_type(topology_, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < numa; ++i) {
    layout.numa_nodes.push_back(
        ToCpuList(hwloc_get_obj_by_type(topology_, HWLOC_OBJ_NUMANODE, i)->cpuset));
  }
  return layout;
}

Status HwlocNode::ThreadBinding(CpuList* out) const {
  Bitmap set;
  if (hwloc_get_cpubind(topology_, set.get(), HWLOC_CPUBIND_THREAD) != 0) {
    return HwlocFailure("hwloc_get_cpubind", "for the calling thread");
  }
  *out = ToCpuList(set.get());
  return Status::OK();
}

CpuList HwlocNode::CpusNearPciDevice(const std::string& bus_id) const {
  hwloc_obj_t device = hwloc_get_pcidev_by_busidstring(topology_, bus_id.c_str());
  if (device == nullptr) return CpuList();
  hwloc_obj_t ancestor = hwloc_get_non_io_ancestor_obj(topology_, device);
  return ancestor == nullptr ? CpuList() : ToCpuList(ancestor->cpuset);
}

Status HwlocNode::Bind(const CpuList& cpus, int flags, const char* what) const {
  Bitmap set(cpus);
  if (hwloc_set_cpubind(topology_, set.get(), flags) != 0) {
    return HwlocFailure("hwloc_set_cpubind",
                        std::string("binding ") + what + " to CPUs " + cpus.ToString());
  }
  return Status::OK();
}

Status HwlocNode::BindProcess(const CpuList& cpus) const {
  return Bind(cpus, HWLOC_CPUBIND_PROCESS, "the process");
}

Status HwlocNode::BindCallingThread(const CpuList& cpus) const {
  return Bind(cpus, HWLOC_CPUBIND_THREAD, "gradsync's background thread");
}

}  // namespace gradsync
