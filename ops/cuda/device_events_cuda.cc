#include <cuda_runtime.h>

#include <chrono>

#include "ops/cuda/cuda_status.h"
#include "ops/cuda/cuda_stream.h"
#include "ops/device/device_events.h"

namespace gradsync {

Status ImportReadiness(void* cuda_event, void* cuda_stream, int device,
                       std::shared_ptr<StreamEvent>* ready) {
  *ready = nullptr;
  if (cuda_event != nullptr) {
    // The caller's event: waited on, never destroyed here.
    *ready = std::make_shared<CudaEvent>(cuda_event, device, std::make_shared<CudaStreamFailure>(),
                                         /*owned=*/false);
    return Status::OK();
  }
  if (cuda_stream == nullptr) return Status::OK();
  cudaEvent_t event = nullptr;
  GRADSYNC_CUDA_CALL(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), device);
  const Status recorded = CudaResult(cudaEventRecord(event, static_cast<cudaStream_t>(cuda_stream)),
                                     "cudaEventRecord", device);
  if (!recorded.ok()) {
    cudaEventDestroy(event);
    return recorded;
  }
  *ready = std::make_shared<CudaEvent>(event, device, std::make_shared<CudaStreamFailure>());
  return Status::OK();
}

Status OrderStreamAfter(const std::shared_ptr<StreamEvent>& done, void* cuda_stream) {
  if (done == nullptr) return Status::OK();
  auto* cuda_event = dynamic_cast<CudaEvent*>(done.get());
  if (cuda_event == nullptr || cuda_stream == nullptr) {
    return done->Wait(kWaitForever);
  }
  // An event that already failed (an aborted plane) is reported instead of waited for.
  if (cuda_event->Query()) {
    GRADSYNC_RETURN_IF_ERROR(done->Wait(std::chrono::nanoseconds(0)));
  }
  return CudaResult(cudaStreamWaitEvent(static_cast<cudaStream_t>(cuda_stream),
                                        static_cast<cudaEvent_t>(cuda_event->native()), 0),
                    "cudaStreamWaitEvent", cuda_event->device());
}

}  // namespace gradsync
