// A JobStore kept in etcd (`ringmaster-coordinator --store etcd://HOST:PORT[,HOST:PORT...]`), over
// etcd's documented v3 gRPC API (proto/etcd/etcd_kv.proto: Range and Put). Each job is the key
// PREFIX/jobs/JOB_ID holding its serialized v1::Job, as in the SQLite store; a Put returns once
// etcd committed it (a quorum of its members), so a job the coordinator said it registered survives
// the coordinator, its host and any minority of etcd's members. Endpoints are tried in order: a
// call that finds one unreachable goes to the next.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/job_store.h"

namespace ringmaster {

// The endpoints of "etcd://HOST:PORT[,HOST:PORT...]"; INVALID_ARGUMENT naming the flag otherwise.
absl::StatusOr<std::vector<std::string>> ParseEtcdUrl(const std::string& url);

// Connects (checking that etcd answers within `timeout`). UNAVAILABLE naming the endpoints when
// none does. `prefix`: where this coordinator's keys live (several clusters may share one etcd).
absl::StatusOr<std::unique_ptr<JobStore>> OpenEtcdJobStore(
    const std::string& url, const std::string& prefix = "/ringmaster",
    absl::Duration timeout = absl::Seconds(5));

}  // namespace ringmaster
