// A JobStore kept in etcd (`ringmaster-coordinator --store etcd://HOST:PORT[,HOST:PORT...]`), over
// etcd's documented v3 gRPC API (proto/etcd/etcd_kv.proto: Range and Put). Each job is the key
// PREFIX/jobs/JOB_ID holding its serialized v1::Job, as in the SQLite store; a Put returns once
// etcd committed it (a quorum of its members), so a job the coordinator said it registered survives
// the coordinator, its host and any minority of etcd's members. Endpoints are tried in order: a
// call that finds one unreachable goes to the next.
//
// With a fence (coordinator replicas electing a leader, leader_election.h), every write is a
// transaction that holds only while the leader key is still the one this replica created: a
// replica that lost its leadership without knowing it yet cannot overwrite the new leader's jobs.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/job_store.h"

namespace ringmaster {

// Writes go through only while `key` has this create revision (the leader key this replica
// created when it won the election).
struct EtcdFence {
  std::string key;
  int64_t create_revision = 0;
};

// Connects (checking that etcd answers within `timeout`). UNAVAILABLE naming the endpoints when
// none does; INVALID_ARGUMENT for a malformed URL. `prefix`: where this coordinator's keys live
// (several clusters may share one etcd). A write refused by the fence is ABORTED.
absl::StatusOr<std::unique_ptr<JobStore>> OpenEtcdJobStore(
    const std::string& url, const std::string& prefix = "/ringmaster",
    absl::Duration timeout = absl::Seconds(5), std::optional<EtcdFence> fence = std::nullopt);

}  // namespace ringmaster
