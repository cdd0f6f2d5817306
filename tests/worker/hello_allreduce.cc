// Smoke check of the whole path: rank r allreduces [r+1, r+1, ...] and expects the average.
#include <cstdio>

#include "ringmaster/client.h"

int main() {
  auto client = ringmaster::Client::Connect();
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    return 1;
  }
  ringmaster::Client& c = **client;
  const int n = 1000;
  float* x = static_cast<float*>(c.Allocate(n * sizeof(float)));
  for (int i = 0; i < n; ++i) x[i] = c.rank() + 1;
  auto h = c.AllreduceAsync("x", x, ringmaster::DataType::kFloat32, {n});
  if (!h.ok()) return 2;
  absl::Status s = c.Wait(*h);
  const float want = (c.size() + 1) / 2.0f;
  std::printf("rank %d of %d: status=%s x[0]=%g want=%g\n", c.rank(), c.size(),
              s.ToString().c_str(), x[0], want);
  return s.ok() && x[0] == want ? 0 : 3;
}
