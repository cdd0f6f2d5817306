// What a rank's training process is given: its environment and its working directory, from its
// assignment and where the daemon serves it. Pure functions; the daemon launches the process
// (ChildProcess) with them.
#pragma once

#include <map>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "ringmaster/v1/worker.pb.h"

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

}  // namespace ringmaster
