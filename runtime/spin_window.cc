#include "runtime/spin_window.h"

#include <algorithm>

namespace gradsync {

void SpinWindow::Arrived(Clock::time_point at, bool may_widen) {
  core_wanted_ = false;
  may_widen_ = may_widen;
  if (any_) {
    const Clock::duration gap = std::max(at - last_, Clock::duration::zero());
    gaps_[next_] = 2 * gap <= longest_ ? gap : Clock::duration::zero();
    next_ = (next_ + 1) % kRemembered;
    const Clock::duration widest = *std::max_element(gaps_.begin(), gaps_.end());
    window_ = std::clamp(2 * widest, shortest_, std::max(shortest_, longest_));
  }
  any_ = true;
  last_ = at;
}

}  // namespace gradsync
