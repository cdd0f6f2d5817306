// Threads started for tasks that end on their own (a connection's reader, a job's cleanup).
// Finished threads are joined when the next one starts, so a long-lived daemon does not accumulate
// them; the rest at JoinAll(). Thread-safe.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ringmaster {

class ThreadList {
 public:
  ~ThreadList() { JoinAll(); }

  void Start(std::function<void()> task) {
    std::vector<Entry> finished;
    {
      absl::MutexLock lock(&mu_);
      for (auto it = entries_.begin(); it != entries_.end();) {
        if (it->done->load()) {
          finished.push_back(std::move(*it));
          it = entries_.erase(it);
        } else {
          ++it;
        }
      }
      auto done = std::make_shared<std::atomic<bool>>(false);
      entries_.push_back(Entry{std::thread([task = std::move(task), done] {
                                 task();
                                 done->store(true);
                               }),
                               done});
    }
    for (Entry& e : finished) e.thread.join();  // they have returned, or are about to
  }

  // Joins every thread, those started by the threads it joins included (a job's stop that starts
  // its cleanup); REQUIRES: their tasks end (the caller has told them to).
  void JoinAll() {
    while (true) {
      std::vector<Entry> all;
      {
        absl::MutexLock lock(&mu_);
        if (entries_.empty()) return;
        all.swap(entries_);
      }
      for (Entry& e : all) {
        if (e.thread.joinable()) e.thread.join();
      }
    }
  }

 private:
  struct Entry {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  absl::Mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ringmaster
