// The durable JobStore: one SQLite database (Debian's libsqlite3) in WAL mode, `DIR/jobs.db` under
// `ringmaster-coordinator --state-dir DIR`. Each job is a row holding its serialized v1::Job (spec,
// state and reason, events, assignments: worker, rank, host, device; epoch), written with
// synchronous=FULL before the change is acknowledged: a job the coordinator said it registered is
// still there after a kill -9. Jobs are never deleted, so job ids are never reused.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "coordinator/job_store.h"

namespace ringmaster {

// Creates DIR (mode 0700) and the database if needed. UNAVAILABLE naming the path when either
// cannot be created or opened (another coordinator holding it included: SQLite's lock).
absl::StatusOr<std::unique_ptr<JobStore>> OpenSqliteJobStore(const std::string& dir);

}  // namespace ringmaster
