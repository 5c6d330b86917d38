// The soak's result checks: every element of every output, output shapes, alltoall's received
// splits, and that a completion callback ran exactly once before the handle reported done.
#include <numeric>
#include <sstream>

#include "test/soak/soak_run.h"

namespace gradsync {
namespace soak {
namespace {

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? "," : "") << shape[i];
  out << ']';
  return out.str();
}

std::vector<int64_t> EvenRows(int64_t rows, int n) {
  std::vector<int64_t> parts(static_cast<size_t>(n), rows / n);
  for (int64_t i = 0; i < rows % n; ++i) ++parts[static_cast<size_t>(i)];
  return parts;
}

// Walks a buffer in order, comparing each element with the next expected value; remembers the
// first difference. Values are small integers (or exact binary fractions), so == is the check.
class Walker {
 public:
  Walker(const Buffer* buffer, const std::vector<int64_t>& shape) : buffer_(buffer) {
    const int64_t elements = Elements(shape);
    if (elements == 0) return;  // gradsync may give an allocator-less empty output
    if (buffer == nullptr) {
      why_ = "no output buffer for shape " + ShapeText(shape);
    } else if (buffer->shape() != shape) {
      why_ =
          "output buffer of shape " + ShapeText(buffer->shape()) + ", wanted " + ShapeText(shape);
    }
  }
  void Expect(double want) {
    if (why_.empty()) {
      const double got = buffer_->Get(at_);
      if (got != want) {
        std::ostringstream out;
        out << "element " << at_ << " is " << got << ", wanted " << want;
        why_ = out.str();
      }
    }
    ++at_;
  }
  const std::string& why() const { return why_; }

 private:
  const Buffer* buffer_;
  int64_t at_ = 0;
  std::string why_;
};

}  // namespace

std::vector<int64_t> WithRows(int64_t rows, const std::vector<int64_t>& rest) {
  std::vector<int64_t> shape{rows};
  shape.insert(shape.end(), rest.begin(), rest.end());
  return shape;
}

void StepRunner::Check(Live* live, const std::vector<int>& contributors, int divisor,
                       Failures* failures) {
  const OpPlan& op = *live->plan;
  const std::vector<int>& members = *live->members;
  const int n = static_cast<int>(members.size());
  const int me = live->me;
  if (live->callback && (live->callbacks.load() != 1 || live->failed_callbacks.load() != 0)) {
    failures->Add(Describe(*live, 0) + ": the completion callback ran " +
                  std::to_string(live->callbacks.load()) + " times (" +
                  std::to_string(live->failed_callbacks.load()) +
                  " with an error) before the handle completed; wanted once, OK");
  }
  for (size_t t = 0; t < op.tensors.size(); ++t) {
    const TensorPlan& tp = op.tensors[t];
    const Handle& handle = live->handles[t];
    if (!handle.poll() || !handle.status().ok()) {
      failures->Add(Describe(*live, t) +
                    ": after wait, poll() or status() disagrees: " + handle.status().ToString());
      continue;
    }
    std::string why;
    switch (op.kind) {
      case Kind::kAllreduce: {
        const Buffer* result = live->out_of_place ? live->outputs[t].get() : live->inputs[t].get();
        Walker walk(result, live->inputs[t]->shape());
        const int64_t elements = live->inputs[t]->elements();
        for (int64_t i = 0; i < elements; ++i) {
          walk.Expect(ExpectedReduction(op.op, tp.dtype, op.prescale, op.postscale, divisor,
                                        contributors, tp.salt, i));
        }
        why = walk.why();
        if (why.empty() && live->out_of_place) {
          Walker input(live->inputs[t].get(), live->inputs[t]->shape());
          for (int64_t i = 0; i < elements; ++i) {
            input.Expect(ReduceInput(op.op, tp.dtype, tp.salt, rank_, i));
          }
          if (!input.why().empty()) why = "the out-of-place input changed: " + input.why();
        }
        break;
      }
      case Kind::kAllgather: {
        const int64_t total = std::accumulate(tp.rows.begin(), tp.rows.end(), int64_t{0});
        const std::vector<int64_t> shape =
            tp.scalar ? std::vector<int64_t>{n} : WithRows(total, tp.shape);
        if (handle.output_shape() != shape) {
          why =
              "output_shape() " + ShapeText(handle.output_shape()) + ", wanted " + ShapeText(shape);
          break;
        }
        Walker walk(live->outputs[t].get(), shape);
        const int64_t width = Elements(tp.shape);
        for (int m = 0; m < n; ++m) {
          for (int64_t j = 0; j < tp.rows[static_cast<size_t>(m)] * width; ++j) {
            walk.Expect(MovedValue(tp.salt, members[static_cast<size_t>(m)], j));
          }
        }
        why = walk.why();
        break;
      }
      case Kind::kBroadcast: {
        Walker walk(live->inputs[t].get(), tp.shape);
        const int root = members[static_cast<size_t>(op.root)];
        for (int64_t i = 0; i < Elements(tp.shape); ++i) walk.Expect(MovedValue(tp.salt, root, i));
        why = walk.why();
        break;
      }
      case Kind::kReducescatter: {
        const std::vector<int64_t> rest(tp.shape.begin() + 1, tp.shape.end());
        const std::vector<int64_t> parts = EvenRows(tp.shape[0], n);
        const int64_t start = std::accumulate(parts.begin(), parts.begin() + me, int64_t{0});
        const std::vector<int64_t> shape = WithRows(parts[static_cast<size_t>(me)], rest);
        if (handle.output_shape() != shape) {
          why =
              "output_shape() " + ShapeText(handle.output_shape()) + ", wanted " + ShapeText(shape);
          break;
        }
        Walker walk(live->outputs[t].get(), shape);
        const int64_t width = Elements(rest);
        for (int64_t j = 0; j < Elements(shape); ++j) {
          walk.Expect(ExpectedReduction(op.op, tp.dtype, op.prescale, op.postscale, divisor,
                                        contributors, tp.salt, start * width + j));
        }
        why = walk.why();
        break;
      }
      case Kind::kAlltoall: {
        std::vector<int64_t> received;
        for (int s = 0; s < n; ++s) received.push_back(tp.splits[static_cast<size_t>(s)][me]);
        const int64_t total = std::accumulate(received.begin(), received.end(), int64_t{0});
        const std::vector<int64_t> shape = WithRows(total, tp.shape);
        if (handle.received_splits() != received) {
          why = "received_splits() " + ShapeText(handle.received_splits()) + ", wanted " +
                ShapeText(received);
          break;
        }
        if (handle.output_shape() != shape) {
          why =
              "output_shape() " + ShapeText(handle.output_shape()) + ", wanted " + ShapeText(shape);
          break;
        }
        Walker walk(live->outputs[t].get(), shape);
        const int64_t width = Elements(tp.shape);
        for (int s = 0; s < n; ++s) {
          const int sender = members[static_cast<size_t>(s)];
          for (int64_t j = 0; j < received[static_cast<size_t>(s)] * width; ++j) {
            walk.Expect(MovedValue(tp.salt, sender * 64 + me, j));
          }
        }
        why = walk.why();
        break;
      }
      case Kind::kBarrier:
        break;
    }
    if (!why.empty()) failures->Add(Describe(*live, t) + ": " + why);
  }
}

}  // namespace soak
}  // namespace gradsync
