#include "runtime/stream.h"

#include <algorithm>

namespace gradsync {

// Quadratic in the sources, which are few: a bucket's producers are one stream per device, or one
// per framework stream at most.
std::vector<StreamEvent*> LatestPerSource(const std::vector<StreamEvent*>& events) {
  std::vector<StreamEvent*> latest;
  for (StreamEvent* event : events) {
    if (event == nullptr) continue;
    if (event->source() == nullptr) {
      latest.push_back(event);
      continue;
    }
    auto same = std::find_if(latest.begin(), latest.end(), [&](const StreamEvent* kept) {
      return kept->source() == event->source();
    });
    if (same == latest.end()) {
      latest.push_back(event);
    } else if (event->sequence() > (*same)->sequence()) {
      *same = event;
    }
  }
  return latest;
}

}  // namespace gradsync
