// The conversions are inline in half.h so that element-wise kernels can vectorize them; this file
// only pins down the float layout their bit manipulation depends on.
#include "runtime/half.h"

#include <limits>

namespace gradsync {

static_assert(std::numeric_limits<float>::is_iec559 && sizeof(float) == 4,
              "the 16-bit conversions need IEEE 754 binary32 floats");
static_assert(std::numeric_limits<float>::round_style == std::round_to_nearest,
              "the binary16 conversion rounds through float addition");

}  // namespace gradsync
