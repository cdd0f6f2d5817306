#include "coordinator/job_store.h"

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace ringmaster {
namespace {

class InMemoryJobStore : public JobStore {
 public:
  absl::Status Put(const Job& job) override {
    absl::MutexLock lock(&mu_);
    auto [it, inserted] = index_.try_emplace(job.id, jobs_.size());
    if (inserted) {
      jobs_.push_back(job);
    } else {
      jobs_[it->second] = job;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Job> Get(const std::string& id) const override {
    absl::MutexLock lock(&mu_);
    auto it = index_.find(id);
    if (it == index_.end()) return absl::NotFoundError(absl::StrCat("job '", id, "' not found"));
    return jobs_[it->second];
  }

  std::vector<Job> List() const override {
    absl::MutexLock lock(&mu_);
    return jobs_;
  }

  absl::Status Delete(const std::string& id) override {
    absl::MutexLock lock(&mu_);
    auto it = index_.find(id);
    if (it == index_.end()) return absl::OkStatus();
    jobs_.erase(jobs_.begin() + static_cast<std::ptrdiff_t>(it->second));
    index_.clear();
    for (size_t i = 0; i < jobs_.size(); ++i) index_[jobs_[i].id] = i;
    return absl::OkStatus();
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<Job> jobs_ ABSL_GUARDED_BY(mu_);  // in creation order
  absl::flat_hash_map<std::string, size_t> index_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<JobStore> JobStore::InMemory() { return std::make_unique<InMemoryJobStore>(); }

}  // namespace ringmaster
