// Links against an installed gradsync and sums each rank's number.
#include <gradsync/gradsync.h>

#include <cstdio>

int main() {
  gradsync::init();
  int value = gradsync::rank() + 1;
  gradsync::allreduce(gradsync::TensorView(&value, gradsync::DataType::kInt32, {1})).wait();
  const int n = gradsync::size();
  const bool ok = value == n * (n + 1) / 2;
  if (gradsync::rank() == 0)
    std::printf("installed gradsync: sum %d on %d ranks: %s\n", value, n, ok ? "ok" : "WRONG");
  gradsync::shutdown();
  return ok ? 0 : 1;
}
