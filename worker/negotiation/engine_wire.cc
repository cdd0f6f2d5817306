#include "worker/negotiation/engine_wire.h"

#include <string>

#include "common/negotiation_wire.h"

namespace ringmaster {

void FromProto(const v1::LocalEnqueue& in, LocalOp* out) {
  out->handle = in.handle();
  FromProto(in.request(), &out->request);
  out->offset = in.offset();
  out->ready_event = in.ready_event();
  out->address = in.address();
}

void ToProto(const OpResult& in, uint64_t handle, v1::LocalCompletion* out) {
  out->set_handle(handle);
  out->set_code(static_cast<int>(in.status.code()));
  out->set_message(std::string(in.status.message()));
  out->set_output_offset(in.output_offset);
  for (int64_t d : in.output_shape) out->add_output_shape(d);
  out->set_last_joined_rank(in.last_joined_rank);
  out->set_done_event(in.done_event);
}

void FromProto(const v1::ResponseList& in, RankCycle* out) {
  out->cache_generation = in.cache_generation();
  out->fusion_threshold_bytes = in.fusion_threshold_bytes();
  out->cycle_time_ms = in.cycle_time_ms();
  out->cache_assignments.clear();
  for (const v1::CacheAssignment& a : in.cache_assignments()) {
    out->cache_assignments.push_back({a.name(), a.id()});
  }
  out->evicted_ids.assign(in.evicted_ids().begin(), in.evicted_ids().end());
  out->resend_ids.assign(in.resend_ids().begin(), in.resend_ids().end());
  out->rank_errors.resize(in.rank_errors_size());
  for (int i = 0; i < in.rank_errors_size(); ++i)
    FromProto(in.rank_errors(i), &out->rank_errors[i]);
  out->responses.resize(in.responses_size());
  for (int i = 0; i < in.responses_size(); ++i) FromProto(in.responses(i), &out->responses[i]);
}

}  // namespace ringmaster
