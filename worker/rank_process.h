// A rank's training process: what it is given (its environment and working directory, from its
// assignment and where the daemon serves it: pure functions), its directory, and the process
// itself (RankProcess: launched, its output numbered and forwarded, waited for, terminated).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ringmaster/v1/worker.pb.h"
#include "worker/child_process.h"

namespace ringmaster {

// Where the daemon serves the rank.
struct RankPlace {
  std::string socket_path;  // the local API (RINGMASTER_SOCKET)
  std::string coordinator;  // the coordinator's address (RINGMASTER_COORDINATOR)
  std::string dir;          // the rank's directory: output/ (and code/ when the job has code)
};

// The environment of the rank's process: `inherited` (the daemon's own), then the job's spec.env,
// then Horovod's topology (RINGMASTER_ and HOROVOD_ RANK, SIZE, LOCAL_RANK, LOCAL_SIZE, CROSS_RANK,
// CROSS_SIZE, HOSTNAME), the daemon's socket and coordinator, the job, its epoch (and an elastic
// job's timeout), the epoch's rendezvous token, the host's data-plane address, the output
// directory (RINGMASTER_OUTPUT_DIR, SageMaker's SM_OUTPUT_DATA_DIR and SM_MODEL_DIR) and the code
// directory (RINGMASTER_CODE_DIR, SM_MODULE_DIR) when the job ships code.
std::map<std::string, std::string> RankEnvironment(
    const v1::JobAssignment& assignment, const RankPlace& place,
    const std::map<std::string, std::string>& inherited);

// The process's working directory: the unpacked code when the job ships code, else
// spec.working_dir.
std::string RankWorkingDir(const v1::JobAssignment& assignment, const RankPlace& place);

// Makes the rank's directory under `work_dir` afresh (`<job>-<epoch>-rank-<rank>-<daemon pid>`,
// owner only, with output/ in it) and, when the job ships code, unpacks it into code/ (the archive
// written by `fetch_source` to the path it is given, then removed). Returns the directory;
// UNAVAILABLE when it cannot be made, the fetch's or the unpack's error, saying which, otherwise
// (the directory then removed).
absl::StatusOr<std::string> MakeRankDir(
    const std::string& work_dir, const v1::JobAssignment& assignment,
    absl::FunctionRef<absl::Status(const std::string& archive)> fetch_source);

// This process's environment, as RankEnvironment's `inherited`.
std::map<std::string, std::string> ProcessEnvironment();

// A launched rank's process and its directory. An elastic job's rank keeps them across its epochs:
// each new epoch's runner shares its predecessor's, and the output is the current epoch's
// (FollowEpoch).
//
// Thread-safe: launch_mu_ orders a launch against a stop (a stop that comes while the rank's code
// is being fetched finds no process, and none starts after it); output_mu_ numbers the output.
// The directory is set once, before the launch, and read after it.
class RankProcess {
 public:
  // How a chunk of output (a RankOutput) reaches the coordinator; best effort.
  using SendFn = std::function<void(const v1::WorkerMessage&)>;
  static constexpr size_t kMaxOutputChunk = 1 << 20;

  explicit RankProcess(SendFn send) : send_(std::move(send)) {}
  // Kills and reaps a process still running, its output readers ended first (they forward
  // through this object). REQUIRES: the waiter was joined.
  ~RankProcess();

  // Makes the rank's directory (MakeRankDir), fetching the job's code with `fetch_source`.
  absl::Status MakeDir(const std::string& work_dir, const v1::JobAssignment& assignment,
                       absl::FunctionRef<absl::Status(const std::string& archive)> fetch_source);
  // The directory made by MakeDir ("" before); removed by RemoveDir.
  const std::string& dir() const { return dir_; }
  void RemoveDir();

  // Starts the job's command for `assignment` in its environment and working directory (after
  // MakeDir), its output numbered afresh as `assignment`'s epoch and rank. ABORTED, and nothing
  // started, when `stopped()` (asked under the launch lock) says the rank was stopped meanwhile.
  absl::Status Launch(const v1::JobAssignment& assignment, const RankPlace& place,
                      absl::FunctionRef<bool()> stopped);
  // Whether a process was started (under the launch lock: a stop that sees none, after setting
  // what Launch's `stopped` reads, knows none will start).
  bool launched() const;
  pid_t pid() const { return pid_.load(); }
  // Waits for the process to exit and its output to drain; exited() from then on.
  // REQUIRES: launched(); one caller.
  ChildExit Wait();
  bool exited() const { return exited_.load(); }
  // SIGTERM to the process group, then SIGKILL after `grace`. REQUIRES: launched(), and another
  // thread in Wait().
  void Terminate(absl::Duration grace);
  // From now on its output is `assignment`'s (an elastic job's next epoch): numbered from 1 again
  // under the new epoch.
  void FollowEpoch(const v1::JobAssignment& assignment);

  // The thread that launches the process and waits for it, started once; JoinWaiter joins it
  // unless called on it.
  void StartWaiter(std::function<void()> run) { waiter_ = std::thread(std::move(run)); }
  void JoinWaiter();

 private:
  // A chunk of the process's output (stream 1 stdout, 2 stderr), numbered and sent.
  void Forward(int stream, const std::string& data);

  const SendFn send_;
  mutable absl::Mutex launch_mu_;
  std::unique_ptr<ChildProcess> child_ ABSL_GUARDED_BY(launch_mu_);
  std::atomic<pid_t> pid_{0};
  std::atomic<bool> exited_{false};
  std::string dir_;
  std::thread waiter_;
  // Whose output the process's output is (the current epoch's job, epoch and rank), and the
  // number of its last chunk in that epoch.
  absl::Mutex output_mu_;
  std::string output_job_ ABSL_GUARDED_BY(output_mu_);
  int64_t output_epoch_ ABSL_GUARDED_BY(output_mu_) = 0;
  int32_t output_rank_ ABSL_GUARDED_BY(output_mu_) = 0;
  uint64_t output_seq_ ABSL_GUARDED_BY(output_mu_) = 0;
};

}  // namespace ringmaster
