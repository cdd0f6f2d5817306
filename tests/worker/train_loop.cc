// A stand-in training loop for failure tests: each step allreduces (sums) a 1 MiB gradient and two
// small bias tensors, then sleeps 20 ms, for STEPS steps (default: forever), printing "step N"
// every 10 steps. Every result is checked exactly (each rank contributes rank + 1 + step % 5 in
// every element); on an error or a wrong value it prints it and exits 1. At the end it prints
// "rank R: N steps, every result exact" (N as run: a step lost or repeated would be seen there).
// A slow rank, for straggler tests: RINGMASTER_TEST_SLOW_RANK=R and RINGMASTER_TEST_SLOW_MS=M make
// rank R compute M ms longer than the others each step (a sleep before it submits).
// RINGMASTER_TEST_COMPUTE_MS=C makes every rank compute C ms of CPU time each step before it
// submits (a busy loop on the thread's CPU clock): a rank whose CPU is limited takes longer.
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

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
  const std::vector<int64_t> sizes = {1 << 18, 1000, 3};
  const std::vector<std::string> names = {"grad", "bias.0", "bias.1"};
  std::vector<float*> data;
  for (int64_t n : sizes) data.push_back(static_cast<float*>(c.Allocate(n * sizeof(float))));
  std::printf("rank %d pid %d ready\n", c.rank(), static_cast<int>(getpid()));
  std::fflush(stdout);
  const int np = c.size();
  const char* slow_rank = std::getenv("RINGMASTER_TEST_SLOW_RANK");
  const char* slow_ms = std::getenv("RINGMASTER_TEST_SLOW_MS");
  const absl::Duration slower =
      slow_rank != nullptr && slow_ms != nullptr && std::atoi(slow_rank) == c.rank()
          ? absl::Milliseconds(std::atoi(slow_ms))
          : absl::ZeroDuration();
  const char* compute_ms = std::getenv("RINGMASTER_TEST_COMPUTE_MS");
  const int64_t compute_ns = compute_ms != nullptr ? std::atoll(compute_ms) * 1'000'000 : 0;
  auto cpu_ns = [] {
    timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec;
  };
  long step = 0;
  for (; steps < 0 || step < steps; ++step) {
    absl::SleepFor(slower);
    for (const int64_t until = cpu_ns() + compute_ns; cpu_ns() < until;) {
    }
    const float mine = static_cast<float>(c.rank() + 1 + step % 5);
    const float want = static_cast<float>(np * (np + 1) / 2 + np * (step % 5));
    std::vector<ringmaster::Handle> handles;
    absl::Status s;
    for (size_t t = 0; t < sizes.size() && s.ok(); ++t) {
      for (int64_t i = 0; i < sizes[t]; ++i) data[t][i] = mine;
      auto h = c.AllreduceAsync(names[t], data[t], ringmaster::DataType::kFloat32, {sizes[t]},
                                ringmaster::ReduceOp::kSum);
      if (h.ok()) {
        handles.push_back(*h);
      } else {
        s = h.status();
      }
    }
    for (ringmaster::Handle h : handles) s.Update(c.Wait(h, absl::Seconds(60)));
    if (!s.ok()) {
      std::printf("rank %d step %ld: %s\n", c.rank(), step, s.ToString().c_str());
      std::fflush(stdout);
      return 1;
    }
    for (size_t t = 0; t < sizes.size(); ++t) {
      for (int64_t i = 0; i < sizes[t]; ++i) {
        if (data[t][i] != want) {
          std::printf("rank %d step %ld: %s[%ld] = %g, expected %g\n", c.rank(), step,
                      names[t].c_str(), static_cast<long>(i), data[t][i], want);
          std::fflush(stdout);
          return 1;
        }
      }
    }
    if (step % 10 == 0) {
      std::printf("step %ld\n", step);
      std::fflush(stdout);
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  std::printf("rank %d: %ld steps, every result exact\n", c.rank(), step);
  return 0;
}
