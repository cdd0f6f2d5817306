// A job's timeline: Horovod's Chrome-trace JSON (open it in chrome://tracing or Perfetto), one row
// ("process") per tensor with two threads: the coordinator's negotiation (NEGOTIATE_ALLREDUCE, ...,
// with a tick per rank as it submits) and rank 0's execution (ALLREDUCE, ... enclosing QUEUE,
// MEMCPY_IN_FUSION_BUFFER, GLOO_ALLREDUCE, MEMCPY_OUT_FUSION_BUFFER, ...), plus optional
// CYCLE_START markers.
//
// The file is valid JSON at any moment: it always ends with the closing bracket, and each batch of
// events is written over that bracket with one pwrite that ends with it again. A background thread
// formats and writes; recording only queues. Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/negotiation_types.h"

namespace ringmaster {

class Timeline {
 public:
  // Creates (truncates) `path`. `title` names the trace (e.g. "job job-000001").
  static absl::StatusOr<std::unique_ptr<Timeline>> Create(const std::string& path,
                                                          std::string title, bool mark_cycles,
                                                          absl::Time start);
  ~Timeline();  // Close()s

  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  void Negotiation(std::vector<NegotiationEvent> events);
  // `skew_us`: our clock minus the rank's host's, as seen when the spans arrived (transit
  // included). The rank's spans are moved by the first one seen of 1 s or more, for the whole
  // timeline: a host whose clock is off lines up with the negotiation rows, and transit jitter
  // never reorders a row (clocks within a second are taken as they are).
  void Execution(int32_t rank, std::vector<ExecutionSpan> spans, int64_t skew_us = 0);
  // A negotiation cycle produced responses at `time` (ignored unless mark_cycles).
  void Cycle(absl::Time time);

  // Writes what is queued and stops the writer; later records are dropped. Idempotent.
  void Close();

  // Bytes of the file that no later write changes; the file's content at any moment is these bytes
  // followed by "\n]\n" (and possibly more events). Lets a reader serve a consistent snapshot.
  int64_t StableSize() const { return stable_.load(); }
  const std::string& path() const { return path_; }

  static constexpr char kTail[] = "\n]\n";

 private:
  struct Item {
    enum class Kind { kNegotiation, kExecution, kCycle } kind = Kind::kNegotiation;
    std::vector<NegotiationEvent> negotiation = {};
    int32_t rank = 0;
    std::vector<ExecutionSpan> execution = {};
    absl::Time time = {};
  };

  Timeline(std::string path, int fd, std::string title, bool mark_cycles, absl::Time start);
  void Run();
  void Format(const Item& item, std::string* out);
  // The tensor's row, announcing it (name, sort order, thread names) on first use.
  int Row(const std::string& tensor, std::string* out);
  void Append(std::string* out, const std::string& event);
  int64_t Micros(absl::Time t) const;
  int64_t MicrosFromUnix(int64_t unix_us) const;

  const std::string path_;
  const int fd_;
  const std::string title_;
  const bool mark_cycles_;
  const absl::Time start_;
  std::atomic<int64_t> stable_{1};  // "["

  absl::Mutex mu_;
  std::vector<Item> queue_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  std::map<int32_t, int64_t> offset_us_ ABSL_GUARDED_BY(mu_);  // per rank, fixed when first seen
  absl::Mutex close_mu_;                                       // serialises Close()
  std::thread writer_;

  // Writer thread only.
  absl::flat_hash_map<std::string, int> rows_;
  absl::flat_hash_set<std::pair<int, int>> announced_;  // (pid, tid) with a thread name
  bool any_event_ = false;
};

}  // namespace ringmaster
