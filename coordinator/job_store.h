// Where jobs are kept. The registry owns one; in-memory now, a durable store later implements the
// same interface.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/job.h"

namespace ringmaster {

// Implementations are thread-safe.
class JobStore {
 public:
  virtual ~JobStore() = default;
  // Inserts or replaces the job with `job.id`.
  virtual absl::Status Put(const Job& job) = 0;
  // NOT_FOUND when there is no such job.
  virtual absl::StatusOr<Job> Get(const std::string& id) const = 0;
  // Every job, oldest first.
  virtual std::vector<Job> List() const = 0;
  // Removes the job with `id` (OK when there is none).
  virtual absl::Status Delete(const std::string& id) = 0;

  static std::unique_ptr<JobStore> InMemory();
};

}  // namespace ringmaster
