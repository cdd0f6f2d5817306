#include "coordinator/response_cache.h"

#include <algorithm>

namespace ringmaster {

const TensorRequest* ResponseCache::Lookup(uint32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &it->second.request;
}

uint32_t ResponseCache::IdOf(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? 0 : it->second;
}

uint32_t ResponseCache::Put(const TensorRequest& request, std::vector<uint32_t>* evicted) {
  if (capacity_ == 0) return 0;
  if (uint32_t old = Invalidate(request.name); old != 0) evicted->push_back(old);
  while (static_cast<int>(by_id_.size()) >= capacity_) {
    uint32_t victim = lru_.back();
    lru_.pop_back();
    by_name_.erase(by_id_.at(victim).request.name);
    by_id_.erase(victim);
    evicted->push_back(victim);
  }
  uint32_t id = next_id_++;
  lru_.push_front(id);
  by_id_.emplace(id, Entry{request, lru_.begin()});
  by_name_[request.name] = id;
  return id;
}

void ResponseCache::Clear(std::vector<uint32_t>* evicted) {
  for (const auto& [id, entry] : by_id_) evicted->push_back(id);
  std::sort(evicted->end() - static_cast<std::ptrdiff_t>(by_id_.size()), evicted->end());
  by_id_.clear();
  by_name_.clear();
  lru_.clear();
}

void ResponseCache::Touch(uint32_t id) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return;
  lru_.splice(lru_.begin(), lru_, it->second.lru_position);
}

uint32_t ResponseCache::Invalidate(const std::string& name) {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return 0;
  uint32_t id = it->second;
  by_name_.erase(it);
  auto entry = by_id_.find(id);
  lru_.erase(entry->second.lru_position);
  by_id_.erase(entry);
  return id;
}

}  // namespace ringmaster
