#include "worker/negotiation/worker_cache.h"

#include <algorithm>

namespace ringmaster {

bool SameMetadata(const TensorRequest& a, const TensorRequest& b) {
  return a.type == b.type && a.dtype == b.dtype && a.shape == b.shape &&
         a.root_rank == b.root_rank && a.reduce_op == b.reduce_op &&
         a.prescale_factor == b.prescale_factor && a.postscale_factor == b.postscale_factor &&
         a.device == b.device && a.group_id == b.group_id && a.group_size == b.group_size &&
         a.process_set_id == b.process_set_id && a.process_set_ranks == b.process_set_ranks;
}

absl::string_view AutomaticFamily(absl::string_view name) {
  constexpr absl::string_view kMark = ".noname.";
  const size_t at = name.rfind(kMark);
  if (at == absl::string_view::npos || at == 0) return {};
  const absl::string_view number = name.substr(at + kMark.size());
  if (number.empty() ||
      !std::all_of(number.begin(), number.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return {};
  }
  return name.substr(0, at + kMark.size());
}

uint32_t WorkerCache::Find(const TensorRequest& request) const {
  auto it = by_name_.find(request.name);
  if (it == by_name_.end() || !SameMetadata(it->second.second, request)) return 0;
  return it->second.first;
}

uint32_t WorkerCache::FindFamily(const TensorRequest& request) const {
  const absl::string_view family = AutomaticFamily(request.name);
  if (family.empty()) return 0;
  auto it = family_.find(family);
  if (it == family_.end()) return 0;
  auto name = by_id_.find(it->second);
  if (name == by_id_.end()) return 0;
  auto entry = by_name_.find(name->second);
  if (entry == by_name_.end() || !SameMetadata(entry->second.second, request)) return 0;
  return it->second;
}

void WorkerCache::Assign(const std::string& name, uint32_t id, const TensorRequest& request) {
  if (auto old = by_name_.find(name); old != by_name_.end()) {
    ForgetFamily(name, old->second.first);
    by_id_.erase(old->second.first);
  }
  if (auto old = by_id_.find(id); old != by_id_.end()) {
    ForgetFamily(old->second, id);
    by_name_.erase(old->second);
  }
  evicted_.erase(id);
  by_name_[name] = {id, request};
  by_id_[id] = name;
  if (const absl::string_view family = AutomaticFamily(name); !family.empty()) {
    family_[std::string(family)] = id;
  }
}

void WorkerCache::ForgetFamily(const std::string& name, uint32_t id) {
  const absl::string_view family = AutomaticFamily(name);
  if (family.empty()) return;
  if (auto it = family_.find(family); it != family_.end() && it->second == id) family_.erase(it);
}

void WorkerCache::Evict(uint32_t id, bool in_flight) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return;
  ForgetFamily(it->second, id);
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
  ForgetFamily(it->second, id);
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
