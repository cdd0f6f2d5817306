#include "common/negotiation_wire.h"

#include <algorithm>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace ringmaster {

void FromProto(const v1::TensorRequest& in, TensorRequest* out) {
  out->name = in.name();
  out->type = static_cast<RequestType>(in.type());
  out->dtype = static_cast<DataType>(in.dtype());
  out->shape.assign(in.shape().begin(), in.shape().end());
  out->root_rank = in.root_rank();
  out->reduce_op = static_cast<ReduceOp>(in.reduce_op());
  out->prescale_factor = in.prescale_factor();
  out->postscale_factor = in.postscale_factor();
  out->device = in.device();
  out->group_id = in.group_id();
  out->group_size = in.group_size();
  out->process_set_id = in.process_set_id();
  out->process_set_ranks.assign(in.process_set_ranks().begin(), in.process_set_ranks().end());
}

void ToProto(const TensorRequest& in, v1::TensorRequest* out) {
  out->set_name(in.name);
  out->set_type(static_cast<v1::RequestType>(in.type));
  out->set_dtype(static_cast<v1::DataType>(in.dtype));
  for (int64_t d : in.shape) out->add_shape(d);
  out->set_root_rank(in.root_rank);
  out->set_reduce_op(static_cast<v1::ReduceOp>(in.reduce_op));
  out->set_prescale_factor(in.prescale_factor);
  out->set_postscale_factor(in.postscale_factor);
  out->set_device(in.device);
  out->set_group_id(in.group_id);
  out->set_group_size(in.group_size);
  out->set_process_set_id(in.process_set_id);
  for (int32_t r : in.process_set_ranks) out->add_process_set_ranks(r);
}

void ToProto(const Response& in, v1::Response* out) {
  out->set_type(static_cast<v1::Response::Type>(static_cast<int>(in.type) + 1));
  // Steady state: every tensor has a cache id, and the names are left out altogether.
  const bool all_cached =
      !in.cache_ids.empty() &&
      std::find(in.cache_ids.begin(), in.cache_ids.end(), 0u) == in.cache_ids.end();
  if (!all_cached) {
    for (const std::string& name : in.names) out->add_names(name);
  }
  for (uint32_t id : in.cache_ids) out->add_cache_ids(id);
  out->set_dtype(static_cast<v1::DataType>(in.dtype));
  out->set_reduce_op(static_cast<v1::ReduceOp>(in.reduce_op));
  out->set_prescale_factor(in.prescale_factor);
  out->set_postscale_factor(in.postscale_factor);
  out->set_root_rank(in.root_rank);
  out->set_device(in.device);
  for (int64_t s : in.tensor_sizes) out->add_tensor_sizes(s);
  for (int64_t s : in.row_elements) out->add_row_elements(s);
  out->set_error_message(in.error_message);
  out->set_last_joined_rank(in.last_joined_rank);
  out->set_process_set_id(in.process_set_id);
  for (int32_t r : in.process_set_ranks) out->add_process_set_ranks(r);
}

void FromProto(const v1::Response& in, Response* out) {
  out->type = static_cast<Response::Type>(static_cast<int>(in.type()) - 1);
  out->cache_ids.assign(in.cache_ids().begin(), in.cache_ids().end());
  out->names.assign(in.names().begin(), in.names().end());
  out->names.resize(std::max(out->names.size(), out->cache_ids.size()));
  out->dtype = static_cast<DataType>(in.dtype());
  out->reduce_op = static_cast<ReduceOp>(in.reduce_op());
  out->prescale_factor = in.prescale_factor();
  out->postscale_factor = in.postscale_factor();
  out->root_rank = in.root_rank();
  out->device = in.device();
  out->tensor_sizes.assign(in.tensor_sizes().begin(), in.tensor_sizes().end());
  out->row_elements.assign(in.row_elements().begin(), in.row_elements().end());
  out->error_message = in.error_message();
  out->last_joined_rank = in.last_joined_rank();
  out->process_set_id = in.process_set_id();
  out->process_set_ranks.assign(in.process_set_ranks().begin(), in.process_set_ranks().end());
}

void FromProto(const v1::RequestBatch& in, RequestBatch* out) {
  out->job_id = in.job_id();
  out->epoch = in.epoch();
  out->rank = in.rank();
  out->requests.resize(in.requests_size());
  for (int i = 0; i < in.requests_size(); ++i) FromProto(in.requests(i), &out->requests[i]);
  out->cached_ids.assign(in.cached_ids().begin(), in.cached_ids().end());
  out->seq = in.seq();
  out->ack_responses = in.ack_responses();
  out->cache_generation = in.cache_generation();
  out->used_ids.assign(in.used_ids().begin(), in.used_ids().end());
}

void ToProto(const RequestBatch& in, v1::RequestBatch* out) {
  out->set_job_id(in.job_id);
  out->set_epoch(in.epoch);
  out->set_rank(in.rank);
  for (const TensorRequest& r : in.requests) ToProto(r, out->add_requests());
  for (uint32_t id : in.cached_ids) out->add_cached_ids(id);
  out->set_seq(in.seq);
  out->set_ack_responses(in.ack_responses);
  out->set_cache_generation(in.cache_generation);
  for (uint32_t id : in.used_ids) out->add_used_ids(id);
}

void ToProto(const ExecutionSpan& in, v1::ExecutionSpan* out) {
  for (const std::string& name : in.tensors) out->add_tensors(name);
  out->set_op(in.op);
  out->set_start_unix_us(in.start_unix_us);
  for (const auto& [activity, end] : in.activities) {
    out->add_activities(activity);
    out->add_activity_end_unix_us(end);
  }
}

namespace {

struct Seen {
  int batches = 0;     // how many batches hold the id
  int last = -1;       // the last batch that did
  bool twice = false;  // some batch holds it twice (an error the coordinator names per rank)
};

// `find(id, insert)`: the id's Seen (made when `insert`), or nullptr.
template <typename Find>
void Share(v1::RelayedBatches* message, Find find) {
  const int batches = message->batches_size();
  for (int b = 0; b < batches; ++b) {
    for (uint32_t id : message->batches(b).cached_ids()) {
      Seen* s = find(id, b == 0);  // only ids of the first batch can be in all of them
      if (s == nullptr) continue;
      if (s->last == b) {
        s->twice = true;
        continue;
      }
      s->last = b;
      ++s->batches;
    }
  }
  auto shared = [&](uint32_t id) {
    const Seen* s = find(id, false);
    return s != nullptr && s->batches == batches && !s->twice;
  };
  for (uint32_t id : message->batches(0).cached_ids()) {
    if (shared(id)) message->add_shared_cached_ids(id);
  }
  if (message->shared_cached_ids_size() == 0) return;
  for (v1::RequestBatch& batch : *message->mutable_batches()) {
    auto* ids = batch.mutable_cached_ids();
    ids->erase(std::remove_if(ids->begin(), ids->end(), shared), ids->end());
  }
}

}  // namespace

void ShareCachedIds(v1::RelayedBatches* message) {
  if (message->batches_size() < 2 || message->batches(0).cached_ids().empty()) return;
  const auto& first = message->batches(0).cached_ids();
  const uint32_t top = *std::max_element(first.begin(), first.end());
  // Cache ids count up from 1, so a steady state's are small: a table indexed by id (a hub of a
  // large job, or the negotiation benchmark that plays every host's hub, runs this per lot). Ids
  // are never reused, so a job whose cache turns over has large ones: a hash map then.
  if (top < 4096 || (top < (uint32_t{1} << 16) && top < 16 * static_cast<uint32_t>(first.size()))) {
    std::vector<Seen> table(size_t{top} + 1);
    std::vector<uint8_t> known(size_t{top} + 1, 0);
    Share(message, [&](uint32_t id, bool insert) -> Seen* {
      if (id > top) return nullptr;
      if (insert) known[id] = 1;
      return known[id] ? &table[id] : nullptr;
    });
    return;
  }
  absl::flat_hash_map<uint32_t, Seen> seen;
  seen.reserve(static_cast<size_t>(first.size()));
  Share(message, [&](uint32_t id, bool insert) -> Seen* {
    if (insert) return &seen[id];
    auto it = seen.find(id);
    return it == seen.end() ? nullptr : &it->second;
  });
}

}  // namespace ringmaster
