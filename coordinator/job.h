// A job as the coordinator's logic sees it: plain data, converted to and from ringmaster.v1
// messages by the service layer.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/knobs.h"
#include "coordinator/autotuner.h"

namespace ringmaster {

enum class JobState { kPending = 1, kStarting, kRunning, kSucceeded, kFailed, kCancelled };
// kStopped: the job ended before the rank's process exited (its worker was told to stop it).
enum class RankState { kAssigned = 1, kStarted, kExited, kStopped };

// JobSpec.source: the job's code archive as the coordinator stored it (SourceStore).
struct SourceArchive {
  std::string sha256;  // empty: the job has no code of its own
  int64_t size_bytes = 0;
  int64_t unpacked_bytes = 0;
  int32_t files = 0;
};

struct JobSpec {
  std::string name;
  int32_t np = 0;
  int32_t processes_per_host = 0;    // 0: no limit
  std::vector<std::string> command;  // empty: processes attach to their worker
  std::map<std::string, std::string> env;
  std::string working_dir;
  Knobs knobs;
  std::map<std::string, std::string> labels;
  SourceArchive source;
  // Ranks placed where attached training processes claim them (JobSpec.attached in job.proto).
  bool attached = false;
  // Elastic training (JobSpec.min_np, max_np, reset_limit, elastic_timeout_seconds in job.proto).
  // Register fills in the defaults: an elastic job has 1 <= min_np <= np <= max_np.
  int32_t min_np = 0;
  int32_t max_np = 0;
  int32_t reset_limit = 0;              // 0: no limit
  int32_t elastic_timeout_seconds = 0;  // 0: kDefaultElasticTimeoutSeconds
  // The client's idempotency key (JobSpec.request_id in job.proto); empty: none.
  std::string request_id;
  // The time limit (JobSpec.max_run_seconds in job.proto): 0, none.
  int32_t max_run_seconds = 0;

  bool elastic() const { return min_np > 0 || max_np > 0; }
};

// Horovod's default --elastic-timeout.
inline constexpr int32_t kDefaultElasticTimeoutSeconds = 600;

struct RankInfo {
  int32_t rank = 0;
  std::string worker_id;
  std::string host;
  std::string device;
  std::string address;  // its worker's data plane address ("": not known)
  // What its worker's registration bound (Worker::identity, Worker::secret_sha256), so that a
  // restarted coordinator takes the worker's session back only from that identity and secret.
  std::string worker_identity;
  std::string worker_secret_sha256;
  int32_t local_rank = 0;
  int32_t local_size = 0;
  int32_t cross_rank = 0;
  int32_t cross_size = 0;
  RankState state = RankState::kAssigned;
  int32_t exit_code = 0;
};

// An elastic spec's defaults filled in (min_np and max_np default to np, np to max_np); other
// specs are left as they are. Before ValidateJobSpec.
void FillElasticDefaults(JobSpec& spec);

// "rank 1 on host h1 (worker-000002)": where a rank runs, in error messages.
std::string Placement(const RankInfo& r);

struct JobEvent {
  absl::Time time;
  JobState state = JobState::kPending;
  std::string message;
};

// Live figures of a running job (see JobThroughput in proto/ringmaster/v1/job.proto).
struct JobThroughput {
  double bytes_per_second = 0;
  double steps_per_second = 0;
  double cycles_per_second = 0;
  int64_t tensors_negotiated = 0;
  int64_t bytes_negotiated = 0;
  int64_t fusion_threshold_bytes = 0;
  double cycle_time_ms = 0;
  bool cache_enabled = false;
  std::optional<AutotuneStatus> autotune;  // when the job autotunes
};

// Who is slow (see Stragglers in proto/ringmaster/v1/job.proto): one rank's lateness over the
// window of steps.
struct RankLateness {
  int32_t rank = 0;
  double behind_first_seconds = 0;
  double behind_median_seconds = 0;
  bool flagged = false;  // late to submit: named as holding the job back
  // From its worker (ExecutionTracker), when `measured`: shares of the wall time in collectives
  // and in network communicators, and its host's data-plane send rate (0: unknown).
  bool measured = false;
  double collective_share = 0;
  double network_share = 0;
  double link_bytes_per_second = 0;
  double host_link_bytes_per_second = 0;
  double others_link_bytes_per_second = 0;
  bool slow_link = false;  // named "slow link"
};

struct JobStragglers {
  int32_t steps = 0;      // steps in the window
  int64_t last_step = 0;  // steps ended since the job (its epoch) began
  double step_seconds = 0;
  std::vector<RankLateness> slowest;  // furthest behind the median rank first
  int32_t straggler_rank = -1;        // -1: none
};

struct Job {
  std::string id;
  // Who submitted it (the authenticated user's name; "" without authentication). Only the owner
  // and admins may read or cancel it.
  std::string owner;
  // The current epoch's rendezvous token, sent only to its ranks' workers: a rendezvous call must
  // carry it. New each epoch.
  std::string rendezvous_token;
  JobSpec spec;
  JobState state = JobState::kPending;
  std::string reason;
  int64_t epoch = 0;
  // Elastic jobs: the epochs started after the first (membership changes).
  int32_t resets = 0;
  absl::Time create_time;
  absl::Time update_time;
  std::vector<RankInfo> ranks;
  std::vector<JobEvent> events;
  // Live figures, set by Coordinator::GetJob while the job runs; once it has ended, the figures as
  // they were at its end (kept by the registry).
  std::optional<JobThroughput> throughput;
  // Who is slow, set by Coordinator::GetJob while the job runs (once a step has ended).
  std::optional<JobStragglers> stragglers;
  // Why a PENDING job waits; set by Coordinator::GetJob.
  std::string waiting_reason;
};

inline constexpr int32_t kMaxNp = 4096;
// The longest time limit a job may have: 30 days.
inline constexpr int32_t kMaxRunSeconds = 30 * 86400;
// The most bytes of strings one job spec may hold (command, env, labels, name, working_dir).
inline constexpr size_t kMaxSpecBytes = size_t{256} << 10;

bool IsTerminal(JobState state);
absl::string_view JobStateName(JobState state);  // "PENDING", ...

// INVALID_ARGUMENT naming the first bad field ("spec.np = 0 is out of bounds [1, 4096]").
absl::Status ValidateJobSpec(const JobSpec& spec);

}  // namespace ringmaster
