// Gang scheduling: all np ranks of a job are placed at once, or none. Pure functions of their
// inputs.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/job.h"
#include "coordinator/worker_registry.h"

namespace ringmaster {

// Places `np` ranks on `available` workers, at most `processes_per_host` per host (0: no limit),
// filling the hosts with the most available workers first. Ranks are ordered by (host, device), so
// ranks on one host are consecutive and local_rank, local_size, cross_rank and cross_size follow
// Horovod's definitions. UNAVAILABLE, saying how many workers there are, when the gang does not
// fit.
absl::StatusOr<std::vector<RankInfo>> GangSchedule(const std::vector<Worker>& available, int np,
                                                   int processes_per_host);

// The workers a job on `backend` may run on: NCCL needs GPU slots; otherwise any.
std::vector<Worker> SlotsFor(const std::vector<Worker>& workers, Backend backend);

// An attached job's placement (JobSpec::attached): rank r on `claimed[r]`, the worker whose
// training process claimed it. local_rank counts the host's ranks in rank order; hosts are ordered
// by their lowest rank; cross_rank and cross_size as GangSchedule's. INVALID_ARGUMENT when a worker
// holds two ranks.
absl::StatusOr<std::vector<RankInfo>> PlaceClaimed(const std::vector<Worker>& claimed);

// Why a job of `np` ranks (at most `processes_per_host` per host, 0: no limit, on `backend`) cannot
// be placed on `workers` (every registered worker, any state), e.g. "needs 16 idle cpu slots; 0
// registered, 0 idle". Empty when GangSchedule would place it.
std::string WaitingReason(const std::vector<Worker>& workers, int np, int processes_per_host,
                          Backend backend);

}  // namespace ringmaster
