// Conversions between the engine's types (worker/engine.h) and the messages the daemon exchanges
// with the training process (local.proto) and the coordinator (worker.proto). Only the daemon's
// edges (and tests) include this.
#pragma once

#include <cstdint>

#include "ringmaster/v1/local.pb.h"
#include "ringmaster/v1/worker.pb.h"
#include "worker/negotiation/engine.h"

namespace ringmaster {

void FromProto(const v1::LocalEnqueue& in, LocalOp* out);
// The completion of the operation the client knows as `handle`.
void ToProto(const OpResult& in, uint64_t handle, v1::LocalCompletion* out);
void FromProto(const v1::ResponseList& in, RankCycle* out);

}  // namespace ringmaster
