// Conversions between ringmaster.v1 messages and the coordinator's plain types, with validation of
// what the plain types cannot represent (enum values out of range). Included only by service
// sources.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/negotiation_wire.h"
#include "coordinator/coordinator.h"
#include "coordinator/job.h"
#include "coordinator/log_store.h"
#include "coordinator/negotiation_types.h"
#include "coordinator/worker_registry.h"
#include "ringmaster/v1/cluster.pb.h"
#include "ringmaster/v1/job.pb.h"
#include "ringmaster/v1/worker.pb.h"

namespace ringmaster {

// Fills in Horovod's defaults for unset knobs. INVALID_ARGUMENT names a bad enum field.
absl::Status FromProto(const v1::JobSpec& in, JobSpec* out);
void ToProto(const JobSpec& in, v1::JobSpec* out);
// Everything, secrets included: for the store and for the job's assignments.
void ToProto(const Job& in, v1::Job* out);
// What a JobService caller sees of a job: env values replaced by kRedacted, the rendezvous token
// and the workers' secret digests cleared.
inline constexpr char kRedacted[] = "<redacted>";
void RedactForClient(v1::Job* job);
void ToProto(const JobEvent& in, v1::JobEvent* out);
void ToProto(const Worker& in, v1::WorkerInfo* out);
v1::JobState ToProto(JobState state);
// INVALID_ARGUMENT for JOB_STATE_UNSPECIFIED or an unknown value.
absl::Status FromProto(v1::JobState in, JobState* out);

// A job as stored (the durable store keeps jobs as serialized v1::Job); live figures are not kept.
absl::Status FromProto(const v1::Job& in, Job* out);
// INVALID_ARGUMENT for a state other than STARTED or EXITED.
absl::Status FromProto(const v1::RankUpdate& in, RankUpdate* out);
// INVALID_ARGUMENT for a stream other than STDOUT or STDERR.
absl::Status FromProto(v1::RankOutput::Stream in, OutputStream* out);
void ToProto(const LogChunk& in, v1::LogChunk* out);
// INVALID_ARGUMENT naming the field for spans out of bounds (see worker.proto).
absl::Status FromProto(const v1::TimelineSpans& in, std::vector<ExecutionSpan>* out);

// The part of a cycle every rank receives alike (no resend_ids, no rank_errors).
void ToProto(const CycleBroadcast& in, v1::ResponseList* out);
void ToProto(const RankNotice& in, v1::ResponseList* out);
// A list a worker retained (RankResume.retained), as the cycle it was: INVALID_ARGUMENT naming the
// field for one of another job, unnumbered, or with an unknown response type.
absl::StatusOr<std::shared_ptr<CycleBroadcast>> CycleFromProto(const v1::ResponseList& in,
                                                               const std::string& job_id, int np);

}  // namespace ringmaster
