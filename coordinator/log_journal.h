// The jobs' output on disk, so that it survives a coordinator restart (with --state-dir): one file
// per job, <dir>/<job id>.log, each chunk a record appended as it is stored (no fsync: a killed
// coordinator loses nothing, a crashed host what the page cache held). The LogStore keeps the
// bounds: it has a job's file rewritten from what it holds once the file grows well past it, and
// removed with the job's log.
//
// Not thread-safe: the LogStore calls it under its lock.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ringmaster {

struct JournalRecord {
  int32_t rank = 0;
  int stream = 1;    // OutputStream's value
  uint64_t seq = 0;  // the rank's chunk number (0: none)
  absl::Time time;
  std::string data;
};

class LogJournal {
 public:
  // Creates `dir` when missing.
  static absl::StatusOr<std::unique_ptr<LogJournal>> Open(std::string dir);
  ~LogJournal();

  // Every job's records, in the order written. A record cut short (the coordinator died writing it,
  // or the disk was full) is left out, and the file cut back to the records before it, so that
  // what is appended next is read again.
  void Load(const std::function<void(const std::string& job_id, JournalRecord record)>& each);
  // Appends one record; the bytes the job's file now has.
  int64_t Write(const std::string& job_id, const JournalRecord& record);
  // Replaces the job's file by `records` (the old one stays when the new one cannot be written).
  void Rewrite(const std::string& job_id, const std::vector<JournalRecord>& records);
  void Remove(const std::string& job_id);
  // Closes the job's file (its log ended); a later Write opens it again.
  void Close(const std::string& job_id);

 private:
  explicit LogJournal(std::string dir) : dir_(std::move(dir)) {}
  std::string PathOf(const std::string& job_id) const;
  std::FILE* FileOf(const std::string& job_id);

  const std::string dir_;
  struct File {
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> f{nullptr, &std::fclose};
    int64_t bytes = 0;
  };
  absl::flat_hash_map<std::string, File> files_;
};

}  // namespace ringmaster
