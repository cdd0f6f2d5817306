#include "common/executor.h"

#include <utility>

namespace ringmaster {
namespace {

class InlineExecutor final : public Executor {
 public:
  void Post(std::function<void()> task) override { task(); }
};

}  // namespace

Executor& Executor::Inline() {
  static InlineExecutor* const inline_executor = new InlineExecutor();
  return *inline_executor;
}

SerialExecutor::SerialExecutor() : thread_([this] { Run(); }) {}

SerialExecutor::~SerialExecutor() { Shutdown(); }

void SerialExecutor::Post(std::function<void()> task) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopped_) {
      tasks_.push_back(std::move(task));
      return;
    }
  }
  task();  // after Shutdown(): nothing runs the queue any more
}

void SerialExecutor::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void SerialExecutor::Run() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !tasks_.empty() || stopping_; };
      // Every wait has a deadline: wake at least once a second (nothing else happens then).
      mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(1));
      if (tasks_.empty()) {
        if (stopping_) {
          stopped_ = true;
          return;
        }
        continue;
      }
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();  // with no lock held: it may post more
  }
}

}  // namespace ringmaster
