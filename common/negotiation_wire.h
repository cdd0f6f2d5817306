// Conversions between the shared negotiation types (common/negotiation_types.h) and their
// ringmaster.v1 messages, used at the coordinator's and the workers' edges alike. Enum values are
// copied as they are: the wire's numbers equal the plain enums' (common/tensor.h), and a response
// type's wire number is one more than the plain one (0 is TYPE_UNSPECIFIED). Validation of what a
// peer sent stays with the caller.
#pragma once

#include "common/negotiation_types.h"
#include "ringmaster/v1/worker.pb.h"

namespace ringmaster {

void FromProto(const v1::TensorRequest& in, TensorRequest* out);
void ToProto(const TensorRequest& in, v1::TensorRequest* out);
// Names are left out when every tensor has a cache id (the steady state); FromProto then gives
// empty names, one per cache id.
void ToProto(const Response& in, v1::Response* out);
void FromProto(const v1::Response& in, Response* out);
void FromProto(const v1::RequestBatch& in, RequestBatch* out);
void ToProto(const RequestBatch& in, v1::RequestBatch* out);
void ToProto(const ExecutionSpan& in, v1::ExecutionSpan* out);

// A negotiation relay's message: moves the cache ids that every batch holds exactly once into
// shared_cached_ids (in the first batch's order), out of each batch's cached_ids (the rest keep
// their order). With fewer than two batches, nothing moves.
void ShareCachedIds(v1::RelayedBatches* message);

}  // namespace ringmaster
