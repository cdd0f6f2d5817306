// Jobs' code archives (JobSpec.source), kept by the coordinator under <root>/<sha256>.tar.gz (one
// file for every job that sent the same code) until no job it keeps refers to them. An archive
// arrives through an Upload: written to a temporary file as it streams in, bounded in size, checked
// (common/source_archive.h) and moved into place by Commit().
//
// Thread-safe: uploads in flight are counted atomically; each Upload belongs to one caller.
#pragma once

#include <atomic>
#include <cstdint>
#include <fstream>
#include <memory>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "coordinator/job.h"

namespace ringmaster {

class SourceStore {
 public:
  // `max_bytes`: the largest archive accepted (--max-source-bytes). At most `max_uploads` arrive at
  // once.
  SourceStore(std::string root, int64_t max_bytes, int max_uploads = 16)
      : root_(std::move(root)), max_bytes_(max_bytes), max_uploads_(max_uploads) {}

  class Upload {
   public:
    ~Upload();
    // INVALID_ARGUMENT (naming the limit) once the archive grows past the store's max_bytes.
    absl::Status Append(absl::string_view data);
    // Checks the archive (INVALID_ARGUMENT naming the bad member) and stores it.
    absl::StatusOr<SourceArchive> Commit();

   private:
    friend class SourceStore;
    Upload(SourceStore& store, std::string path) : store_(store), path_(std::move(path)) {}

    SourceStore& store_;
    const std::string path_;
    std::ofstream out_;
    int64_t bytes_ = 0;
    bool committed_ = false;
  };

  // RESOURCE_EXHAUSTED when max_uploads are in flight; UNAVAILABLE when the directory is not
  // writable.
  absl::StatusOr<std::unique_ptr<Upload>> Begin();

  int64_t max_bytes() const { return max_bytes_; }
  std::string PathOf(const std::string& sha256) const;
  bool Has(const std::string& sha256) const;
  // Removes the archives no sha256 in `referenced` names, older than `grace` (an archive committed
  // moments ago is about to be referenced by the job being registered).
  void RemoveUnreferenced(const std::set<std::string>& referenced, absl::Duration grace) const;

 private:
  const std::string root_;
  const int64_t max_bytes_;
  const int max_uploads_;
  std::atomic<int> uploads_{0};
  std::atomic<uint64_t> next_upload_{0};
};

}  // namespace ringmaster
