// A workload for timeline and autotune tests: every step, a grouped allreduce of two gradients that
// lie apart in the arena (so the fused response is packed into and unpacked from the fusion buffer)
// and a broadcast, then a
// 20 ms pause; --steps given as the first argument (default 100). Checks the sums; exits 1 on any
// error.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "absl/time/clock.h"
#include "ringmaster/client.h"

int main(int argc, char** argv) {
  const long steps = argc > 1 ? std::atol(argv[1]) : 100;
  auto client = ringmaster::Client::Connect();
  if (!client.ok()) {
    std::printf("connect failed: %s\n", client.status().ToString().c_str());
    return 1;
  }
  ringmaster::Client& c = **client;
  constexpr int64_t kA = 1000, kB = 3000, kC = 16;
  float* a = static_cast<float*>(c.Allocate(kA * sizeof(float)));
  void* spacer = c.Allocate(4096);  // keeps a and b apart
  float* b = static_cast<float*>(c.Allocate(kB * sizeof(float)));
  float* weights = static_cast<float*>(c.Allocate(kC * sizeof(float)));
  if (a == nullptr || spacer == nullptr || b == nullptr || weights == nullptr) {
    std::printf("arena too small\n");
    return 1;
  }
  for (long step = 0; step < steps; ++step) {
    for (int64_t i = 0; i < kA; ++i) a[i] = 1;
    for (int64_t i = 0; i < kB; ++i) b[i] = 2;
    for (int64_t i = 0; i < kC; ++i) weights[i] = static_cast<float>(c.rank() + step);
    // Grouped: always one response, so always packed and unpacked.
    auto grads =
        c.GroupedAllreduceAsync({"grad.a", "grad.b"}, {a, b}, ringmaster::DataType::kFloat32,
                                {{kA}, {kB}}, ringmaster::ReduceOp::kSum);
    auto hw = c.BroadcastAsync("weights", weights, ringmaster::DataType::kFloat32, {kC}, 0);
    std::vector<absl::StatusOr<ringmaster::Handle>> handles = {hw};
    if (grads.ok()) {
      for (ringmaster::Handle h : *grads) handles.push_back(h);
    } else {
      handles.push_back(grads.status());
    }
    for (auto& h : handles) {
      absl::Status s = h.ok() ? c.Wait(*h, absl::Seconds(60)) : h.status();
      if (!s.ok()) {
        std::printf("rank %d step %ld: %s\n", c.rank(), step, s.ToString().c_str());
        return 1;
      }
    }
    if (a[0] != static_cast<float>(c.size()) || b[kB - 1] != 2.0f * c.size() ||
        weights[0] != static_cast<float>(step)) {
      std::printf("rank %d step %ld: wrong result %g %g %g\n", c.rank(), step, a[0], b[kB - 1],
                  weights[0]);
      return 1;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  std::printf("rank %d done\n", c.rank());
  c.Shutdown();
  return 0;
}
