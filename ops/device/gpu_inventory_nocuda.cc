#include "ops/device/gpu_inventory.h"

namespace gradsync {

std::vector<std::string> VisibleGpuBusIds() { return {}; }

}  // namespace gradsync
