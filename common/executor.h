// Where slow work goes (file I/O, joining a thread, anything that may block) when the thread that
// has it must not block: a gRPC callback, a reactor. Tests use Inline(), which runs each task at
// once on the caller's thread, so logic stays synchronous under test.
#pragma once

#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ringmaster {

class Executor {
 public:
  virtual ~Executor() = default;
  // Runs `task` (later, or at once). Tasks posted from one thread run in the order posted.
  virtual void Post(std::function<void()> task) = 0;
  // Runs every task at once, on the caller's thread.
  static Executor& Inline();
};

// One thread that runs tasks in the order they were posted. Thread-safe.
class SerialExecutor final : public Executor {
 public:
  SerialExecutor();
  ~SerialExecutor() override;  // Shutdown()s

  void Post(std::function<void()> task) override;
  // Runs what was posted so far, then stops the thread; tasks posted afterwards run at once on the
  // caller's thread. Idempotent.
  void Shutdown();

 private:
  void Run();

  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ringmaster
