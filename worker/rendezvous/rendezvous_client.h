// KeyValueStore over the coordinator's RendezvousService, scoped to one job epoch.
//
// A coordinator that restarts while ranks meet must not fail them: every call waits for the
// channel to connect and retries UNAVAILABLE (with a short pause) until its deadline, and every
// key set goes into the job's journal, which the daemon publishes again whenever its session to the
// coordinator opens again (a restarted coordinator has lost what ranks set before).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/coordinator_channels.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "ringmaster/v1/rendezvous.grpc.pb.h"
#include "worker/rendezvous/key_value_store.h"

namespace ringmaster {

// The keys one rank's clients set, for publishing them again; and its calls in flight, which
// Cancel() ends (a job stopped while its ranks meet must not wait out the retries). Thread-safe.
class RendezvousJournal {
 public:
  void Record(const std::string& key, const std::string& value);
  std::map<std::string, std::string> keys() const;

  // Every call in flight, and every later one, fails CANCELLED.
  void Cancel();
  bool cancelled() const;
  // A call's context while it runs (false: cancelled already, do not start it).
  bool Begin(grpc::ClientContext* context);
  void End(grpc::ClientContext* context);

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, std::string> keys_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<grpc::ClientContext*> calls_ ABSL_GUARDED_BY(mu_);
};

class RendezvousClient : public KeyValueStore {
 public:
  // How long Set and Get keep retrying a coordinator that cannot be reached.
  static constexpr absl::Duration kRetryFor = absl::Seconds(60);

  // `journal` (may be null) records every key set. `token` is the epoch's rendezvous token
  // (JobAssignment.rendezvous_token): every call carries it.
  RendezvousClient(std::shared_ptr<CoordinatorChannels> channels, std::string job_id, int64_t epoch,
                   std::shared_ptr<RendezvousJournal> journal = nullptr, std::string token = "");

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key) override;
  absl::StatusOr<std::vector<std::string>> Wait(const std::vector<std::string>& keys,
                                                absl::Duration timeout) override;

  // Sets every key of the journal again (with Set's retries); the first error.
  absl::Status Republish(const RendezvousJournal& journal);

  // How long moving a file (the code archive, a rank's output) may take, retries included.
  static constexpr absl::Duration kFilesFor = absl::Minutes(5);
  // The job's code archive (JobSpec.source) into file `dest`, fetched again whole should the
  // coordinator be unreachable for a while.
  absl::Status FetchSource(const std::string& dest);
  // Sends the regular files under directory `dir` (symbolic links and other entries are skipped)
  // as rank `rank`'s output: its artifacts "rank-<rank>/<path>". Nothing is sent when `dir` holds
  // no file. `files` and `bytes` (may be null) get what the coordinator kept.
  absl::Status PutOutput(int32_t rank, const std::string& dir, int32_t* files = nullptr,
                         int64_t* bytes = nullptr);

 private:
  absl::Status SetOnce(const std::string& key, const std::string& value);

  const std::shared_ptr<CoordinatorChannels> channels_;
  const std::string job_id_;
  // The metadata every call carries.
  void Authorize(grpc::ClientContext& context) const;

  const int64_t epoch_;
  const std::shared_ptr<RendezvousJournal> journal_;
  const std::string token_;
};

}  // namespace ringmaster
