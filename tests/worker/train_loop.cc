// A stand-in training loop for failure tests: allreduces a 1 MiB gradient every 20 ms for
// --steps steps (default: forever), printing "step N" every 10 steps. On an error it prints it and
// exits 1.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "ringmaster/client.h"

int main(int argc, char** argv) {
  const long steps = argc > 1 ? std::atol(argv[1]) : -1;
  auto client = ringmaster::Client::Connect();
  if (!client.ok()) {
    std::printf("connect failed: %s\n", client.status().ToString().c_str());
    return 1;
  }
  ringmaster::Client& c = **client;
  const int64_t n = 1 << 18;
  float* grad = static_cast<float*>(c.Allocate(n * sizeof(float)));
  std::printf("rank %d pid %d ready\n", c.rank(), static_cast<int>(getpid()));
  std::fflush(stdout);
  for (long step = 0; steps < 0 || step < steps; ++step) {
    for (int64_t i = 0; i < n; ++i) grad[i] = 1;
    auto h = c.AllreduceAsync("grad", grad, ringmaster::DataType::kFloat32, {n});
    absl::Status s = h.ok() ? c.Wait(*h, absl::Seconds(60)) : h.status();
    if (!s.ok()) {
      std::printf("rank %d step %ld: %s\n", c.rank(), step, s.ToString().c_str());
      std::fflush(stdout);
      return 1;
    }
    if (step % 10 == 0) {
      std::printf("step %ld\n", step);
      std::fflush(stdout);
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return 0;
}
