// The output of every job's ranks, as their workers forward it: per job, each rank's chunks
// (stream, bytes, time) in arrival order, numbered by a per-job sequence so readers resume from a
// cursor. Bounded: each rank keeps only its last `max_bytes_per_rank` (oldest chunks are dropped,
// so a reader that falls behind skips them), and the logs of ended jobs are dropped, oldest ended
// first, once all logs together exceed `max_total_bytes`. Logs outlive their job so they can be
// read afterwards. With a journal (LogJournal: --state-dir), the logs also survive a coordinator
// restart: every chunk stored is written to it, and the store starts with what it holds.
//
// Thread-safe: one mutex guards everything. Subscribers are called with it released.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/log_journal.h"

namespace ringmaster {

enum class OutputStream { kStdout = 1, kStderr = 2 };

struct LogChunk {
  int64_t seq = 0;  // 1, 2, ... in arrival order within the job
  int32_t rank = 0;
  OutputStream stream = OutputStream::kStdout;
  std::string data;
  absl::Time time;
};

struct LogRead {
  std::vector<LogChunk> chunks;  // in seq order
  // Pass back as `after` to continue after these chunks.
  int64_t cursor = 0;
  // The job has ended and nothing the read asked for remains after `cursor`: a follower is done.
  bool end = false;
};

struct LogStoreOptions {
  Clock* clock = Clock::Real();  // borrowed; must outlive the store
  // Each chunk counts its bytes plus kChunkOverheadBytes, so many tiny chunks cannot exceed the
  // bound in memory.
  int64_t max_bytes_per_rank = int64_t{4} << 20;
  int64_t max_total_bytes = int64_t{1} << 30;
  // Null: the logs live in memory alone.
  std::unique_ptr<LogJournal> journal;
};

class LogStore {
 public:
  static constexpr int64_t kChunkOverheadBytes = 64;
  // Read's `rank` for every rank.
  static constexpr int32_t kAllRanks = -1;

  // Called after new output of the job is stored and after the job ends. Must not block; it may
  // call Read(). It may still run once after Unsubscribe() returned, so it must hold what it uses.
  using Subscriber = std::function<void()>;

  explicit LogStore(LogStoreOptions options = {});
  ~LogStore();

  LogStore(const LogStore&) = delete;
  LogStore& operator=(const LogStore&) = delete;

  // Stores a chunk (a chunk longer than the rank's bound keeps only its tail). FAILED_PRECONDITION
  // once the job's log has ended. Empty data is accepted and stores nothing.
  // `seq` > 0 numbers the rank's chunks (the reliable session): one at or below the last stored is
  // a re-sent duplicate, dropped (OK).
  absl::Status Append(const std::string& job_id, int32_t rank, OutputStream stream,
                      std::string data, uint64_t seq = 0);

  // Ends the job's log after `linger` (at once when zero): no more appends after that; followers
  // finish once they have read everything. Until then output is still accepted, because a rank's
  // last words race its job's end. EndDue() ends lingering logs whose time has come. Idempotent (a
  // shorter linger wins); creates the log when the job never had output.
  void End(const std::string& job_id, absl::Duration linger = absl::ZeroDuration());
  void EndDue();
  // Forgets the job's log (and its journal file): the job was removed. Its followers finish.
  void Remove(const std::string& job_id);

  // Chunks of `rank` (or kAllRanks) with after < seq <= until, oldest first, up to `max_bytes` of
  // data (at least one chunk when any is left). A job without output reads as empty.
  LogRead Read(const std::string& job_id, int32_t rank, int64_t after, int64_t max_bytes,
               int64_t until = std::numeric_limits<int64_t>::max()) const;

  // The last `max_lines` non-blank lines `rank` wrote (stdout and stderr in arrival order), oldest
  // first, each cut to `max_line_bytes`; empty when it wrote nothing (or its output was dropped).
  std::vector<std::string> LastLines(const std::string& job_id, int32_t rank, int max_lines,
                                     size_t max_line_bytes) const;

  // The seq of the job's newest chunk (0 when none): a reader that wants only what is there now
  // reads until it.
  int64_t Head(const std::string& job_id) const;

  // Returns an id for Unsubscribe.
  int64_t Subscribe(const std::string& job_id, Subscriber subscriber);
  void Unsubscribe(const std::string& job_id, int64_t id);

  // Bytes held by all logs, overhead included.
  int64_t total_bytes() const;

 private:
  struct RankLog {
    std::deque<LogChunk> chunks;
    int64_t bytes = 0;
    uint64_t last_seq = 0;  // the last numbered chunk stored
  };
  struct JobLog {
    absl::flat_hash_map<int32_t, RankLog> ranks;
    int64_t head = 0;  // last seq given out
    bool ended = false;
    absl::Time end_at = absl::InfiniteFuture();  // when lingering: when it ends
    absl::flat_hash_map<int64_t, std::shared_ptr<Subscriber>> subscribers;
  };

  JobLog& LogLocked(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stores a chunk (Append's work, without the checks of an ended log); writes it to the journal
  // unless it comes from there. False for a duplicate.
  bool StoreLocked(const std::string& job_id, JobLog& log, int32_t rank, OutputStream stream,
                   std::string data, uint64_t seq, absl::Time time, bool journal)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the log now; returns its subscribers to notify (none when it had ended already).
  std::vector<std::shared_ptr<Subscriber>> EndLocked(const std::string& job_id, JobLog& log)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the logs of ended jobs, oldest ended first, while the total exceeds the bound.
  void EvictLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static std::vector<std::shared_ptr<Subscriber>> SubscribersOf(const JobLog& log);

  Clock* const clock_;
  const int64_t max_bytes_per_rank_;
  const int64_t max_total_bytes_;
  mutable absl::Mutex mu_;
  const std::unique_ptr<LogJournal> journal_ ABSL_PT_GUARDED_BY(mu_);
  // The latest jobs Remove()d (at most kRemembered): a reader or follower of one reads its end
  // instead of waiting for output that cannot come.
  static constexpr size_t kRemembered = 4096;
  std::deque<std::string> removed_order_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> removed_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, JobLog> jobs_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> ended_order_ ABSL_GUARDED_BY(mu_);         // ended jobs, oldest first
  absl::flat_hash_set<std::string> lingering_ ABSL_GUARDED_BY(mu_);  // to end at their end_at
  int64_t total_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_subscriber_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace ringmaster
