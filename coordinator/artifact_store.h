// Files a job leaves behind for its users (its timeline, its autotune log), kept by the coordinator
// under <root>/<job id>/<name> and fetched with `ringmaster artifacts JOB`. They outlive the job
// and the coordinator; a job id reused by a later coordinator run starts with an empty directory.
// Thread-safe (stateless apart from the root).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ringmaster {

struct ArtifactInfo {
  std::string name;
  int64_t size_bytes = 0;
};

// Where artifacts go when not configured: $TMPDIR/ringmaster-artifacts-<uid>/<instance> (TMPDIR
// defaults to /tmp), created private to the user. `instance` names one coordinator (its listen
// address, e.g. "127.0.0.1-50051"), so two coordinators never share a directory.
std::string DefaultArtifactsDir(const std::string& instance);

// The instance name for a coordinator listening on `address` ("host:port"): "host-port", or
// "pid-PID" when the port is 0 (picked at start).
std::string ArtifactsInstanceName(const std::string& address);

class ArtifactStore {
 public:
  explicit ArtifactStore(std::string root) : root_(std::move(root)) {}

  const std::string& root() const { return root_; }

  // Empties (creating) the job's directory: called when the job starts.
  absl::Status Reset(const std::string& job_id) const;
  // Removes the job's directory and what it holds.
  void Remove(const std::string& job_id) const;

  // The path to write artifact `name` of the job to.
  std::string PathOf(const std::string& job_id, const std::string& name) const;

  // A rank's output files are the artifacts "rank-<rank>/<path>". ResetRank removes what the rank
  // sent before (creating the job's directory when needed); RankFilePath is where `path` (checked
  // by ValidateRelativePath) goes.
  absl::Status ResetRank(const std::string& job_id, int32_t rank) const;
  std::string RankFilePath(const std::string& job_id, int32_t rank, const std::string& path) const;

  // The job's artifacts, by name (a rank's files as "rank-<rank>/<path>"); empty when it has none.
  std::vector<ArtifactInfo> List(const std::string& job_id) const;

  // Up to `max_bytes` of the artifact from `offset`; empty at the end. NOT_FOUND for an artifact
  // that does not exist (or a name that is not one: an absolute path, a ".." component).
  absl::StatusOr<std::string> Read(const std::string& job_id, const std::string& name,
                                   int64_t offset, int64_t max_bytes) const;

 private:
  std::string JobDir(const std::string& job_id) const;

  const std::string root_;
};

}  // namespace ringmaster
