#include "worker/worker_cache.h"

namespace ringmaster {

bool SameMetadata(const TensorRequest& a, const TensorRequest& b) {
  return a.type == b.type && a.dtype == b.dtype && a.shape == b.shape &&
         a.root_rank == b.root_rank && a.reduce_op == b.reduce_op &&
         a.prescale_factor == b.prescale_factor && a.postscale_factor == b.postscale_factor &&
         a.device == b.device && a.group_id == b.group_id && a.group_size == b.group_size &&
         a.process_set_id == b.process_set_id && a.process_set_ranks == b.process_set_ranks;
}

uint32_t WorkerCache::Find(const TensorRequest& request) const {
  auto it = by_name_.find(request.name);
  if (it == by_name_.end() || !SameMetadata(it->second.second, request)) return 0;
  return it->second.first;
}

void WorkerCache::Assign(const std::string& name, uint32_t id, const TensorRequest& request) {
  if (auto old = by_name_.find(name); old != by_name_.end()) by_id_.erase(old->second.first);
  evicted_.erase(id);
  by_name_[name] = {id, request};
  by_id_[id] = name;
}

void WorkerCache::Evict(uint32_t id, bool in_flight) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return;
  if (auto entry = by_name_.find(it->second); entry != by_name_.end()) {
    if (in_flight) {
      evicted_[id] = std::move(entry->second.second);
      evicted_order_.push_back(id);
      while (evicted_order_.size() > kMaxEvicted) {
        evicted_.erase(evicted_order_.front());  // a no-op for one taken or assigned again
        evicted_order_.pop_front();
      }
    }
    by_name_.erase(entry);
  }
  by_id_.erase(it);
}

const std::string* WorkerCache::NameOf(uint32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &it->second;
}

std::optional<TensorRequest> WorkerCache::TakeForResend(uint32_t id) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) {
    auto evicted = evicted_.find(id);
    if (evicted == evicted_.end()) return std::nullopt;
    std::optional<TensorRequest> request = std::move(evicted->second);
    evicted_.erase(evicted);
    return request;
  }
  auto entry = by_name_.find(it->second);
  std::optional<TensorRequest> request;
  if (entry != by_name_.end()) {
    request = std::move(entry->second.second);
    by_name_.erase(entry);
  }
  by_id_.erase(it);
  return request;
}

}  // namespace ringmaster
