// How soon gradsync hands back a device operation once its stream's work is done: one allreduce of
// a device tensor over the host device backend (host memory labelled cuda:0, whose stream is a
// thread), waited on, where each collective's work on the stream first sleeps `device_us`,
// standing in for a device that is busy without costing the host a core (the MPI backend's staged
// copies on a GPU shared by two ranks take 150-300 us). Raw: the same sleep, then MPI_Allreduce
// of the same bytes, on the caller's thread. `gs-raw` is what gradsync adds: its host path, and
// how late its finalizer sees the stream's completion.
//
//   mpirun -np N gradsync_bench_completion [--iters N] [--bytes B]
//
// Rows for device_us from 0 to 1600; columns are medians in microseconds (the slowest rank's,
// interleaved with the raw baseline).
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.h"
#include "gradsync/gradsync.h"
#include "ops/device/device_plane.h"
#include "ops/device/device_plane_factory.h"
#include "ops/device/host_device_backend.h"

namespace gradsync_bench {
namespace {

using gradsync::DataType;
using gradsync::Status;

// Read by the backend at each collective: the plane factory is a plain function.
std::atomic<int64_t> device_us{0};

void Sleep(int64_t us) {
  if (us > 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
}

// The host device backend, its collectives preceded on the stream by `device_us` of sleep.
class BusyDeviceBackend : public gradsync::DeviceBackend {
 public:
  explicit BusyDeviceBackend(std::unique_ptr<gradsync::HostDeviceBackend> host)
      : host_(std::move(host)) {}
  const char* name() const override { return "busy host"; }
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  gradsync::Stream* stream() override { return host_->stream(); }
  Status Allocate(size_t bytes, void** ptr) override { return host_->Allocate(bytes, ptr); }
  void FreeAfterWork(void* ptr) override { host_->FreeAfterWork(ptr); }
  Status Upload(const void* from, void* to, size_t bytes) override {
    return host_->Upload(from, to, bytes);
  }
  Status BatchedCopy(const std::vector<gradsync::CopySegment>& segments, DataType dtype) override {
    return host_->BatchedCopy(segments, dtype);
  }
  Status Allreduce(const void* send, void* recv, int64_t count, DataType dtype,
                   gradsync::ReduceOp op) override {
    Busy();
    return host_->Allreduce(send, recv, count, dtype, op);
  }
  Status Allgatherv(const void* send, void* recv, const std::vector<int64_t>& counts,
                    DataType dtype) override {
    Busy();
    return host_->Allgatherv(send, recv, counts, dtype);
  }
  Status Broadcast(void* buffer, int64_t count, DataType dtype, int root) override {
    Busy();
    return host_->Broadcast(buffer, count, dtype, root);
  }
  Status Alltoallv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                   const std::vector<int64_t>& recv_counts, DataType dtype) override {
    Busy();
    return host_->Alltoallv(send, send_counts, recv, recv_counts, dtype);
  }
  Status ReduceScatterv(const void* send, void* recv, const std::vector<int64_t>& counts,
                        DataType dtype, gradsync::ReduceOp op) override {
    Busy();
    return host_->ReduceScatterv(send, recv, counts, dtype, op);
  }
  Status Adasum(void* data, DataType dtype, int64_t count,
                const std::vector<gradsync::ElementRange>& tensors, double prescale,
                double postscale) override {
    Busy();
    return host_->Adasum(data, dtype, count, tensors, prescale, postscale);
  }
  Status CheckAsyncError() override { return host_->CheckAsyncError(); }
  void Abort(const Status& status) override { host_->Abort(status); }

 private:
  void Busy() {
    const int64_t us = device_us.load();
    host_->Enqueue([us] {
      Sleep(us);
      return Status::OK();
    });
  }

  std::unique_ptr<gradsync::HostDeviceBackend> host_;
};

Status BusyPlane(const gradsync::Config& config, MPI_Comm comm, const gradsync::Device&,
                 std::unique_ptr<gradsync::DataPlane>* plane) {
  std::unique_ptr<gradsync::HostDeviceBackend> host;
  GRADSYNC_RETURN_IF_ERROR(gradsync::HostDeviceBackend::Create(comm, &host));
  *plane =
      std::make_unique<gradsync::DevicePlane>(std::make_unique<BusyDeviceBackend>(std::move(host)),
                                              comm, gradsync::DeviceCompletionTimeout(config));
  return Status::OK();
}

int Run(int argc, char** argv) {
  Flags flags(argc, argv, {"--iters", "--bytes"});
  const int iters = static_cast<int>(flags.GetInt("--iters", 200, 1));
  const int64_t floats = std::max<int64_t>(1, flags.GetInt("--bytes", 16, 4) / 4);
  MPI_Comm raw_comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &raw_comm);
  std::vector<float> raw_data(floats, 1.0f);
  std::vector<float> device_data(floats, 1.0f);
  const gradsync::TensorView view(device_data.data(), DataType::kFloat32, {floats},
                                  gradsync::Device::Cuda(0));
  gradsync::AllreduceOptions named;
  named.name = "completion";  // named, so that its schedule locks in the warm-up
  if (gradsync::rank() == 0) {
    std::printf("# gradsync_bench_completion: %d ranks, allreduce of %lld B, median of %d\n",
                gradsync::size(), static_cast<long long>(floats * 4), iters);
    std::printf("%10s %10s %10s %10s %8s\n", "device_us", "raw_us", "gs_us", "gs-raw", "gs/raw");
  }
  for (int64_t us : {0, 50, 100, 200, 400, 800, 1600}) {
    device_us.store(us);
    const std::vector<double> medians =
        MeasureInterleaved({{"raw",
                             [&] {
                               Sleep(us);
                               AllreduceFloats(raw_data.data(), floats, raw_comm);
                             }},
                            {"gradsync", [&] { gradsync::allreduce(view, named).wait(); }}},
                           10, iters, MPI_COMM_WORLD);
    if (gradsync::rank() == 0) {
      std::printf("%10lld %10.1f %10.1f %10.1f %8.2f\n", static_cast<long long>(us),
                  medians[0] * 1e6, medians[1] * 1e6, (medians[1] - medians[0]) * 1e6,
                  medians[1] / medians[0]);
    }
  }
  MPI_Comm_free(&raw_comm);
  return 0;
}

}  // namespace
}  // namespace gradsync_bench

int main(int argc, char** argv) {
  gradsync::SetDevicePlaneFactoryForTesting(&gradsync_bench::BusyPlane);
  return gradsync_bench::RunBenchmark("gradsync_bench_completion", &gradsync_bench::Run, argc,
                                      argv);
}
