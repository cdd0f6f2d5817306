// The response cache: a bounded map from a tensor's name and metadata to a small id, so a rank in
// steady state requests a tensor by id instead of by full description (Horovod's ResponseCache,
// held by the coordinator). Ids are never reused, so a stale id is detected rather than misread.
// Not thread-safe: owned by one Negotiator, under its lock.
#pragma once

#include <cstdint>
#include <list>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "coordinator/negotiation_types.h"

namespace ringmaster {

class ResponseCache {
 public:
  // capacity 0 disables the cache: Put() assigns nothing.
  explicit ResponseCache(int capacity) : capacity_(capacity) {}

  ResponseCache(const ResponseCache&) = delete;
  ResponseCache& operator=(const ResponseCache&) = delete;

  int capacity() const { return capacity_; }
  int size() const { return static_cast<int>(by_id_.size()); }

  // The request cached under `id`, or nullptr when the id is unknown (never assigned, or evicted).
  // The pointer stays valid until the next Put() or Invalidate().
  const TensorRequest* Lookup(uint32_t id) const;

  // The id cached for `name`, or 0.
  uint32_t IdOf(const std::string& name) const;

  // Caches `request` (replacing an entry of the same name) and marks it most recently used. Returns
  // the new id (0 when the cache is disabled); ids of evicted entries are appended to `evicted`.
  uint32_t Put(const TensorRequest& request, std::vector<uint32_t>* evicted);

  // Marks `id` most recently used.
  void Touch(uint32_t id);

  // Removes every entry, appending their ids to `evicted`.
  void Clear(std::vector<uint32_t>* evicted);

  // Removes the entry of `name`; returns its id, or 0 when there was none.
  uint32_t Invalidate(const std::string& name);

 private:
  struct Entry {
    TensorRequest request;
    std::list<uint32_t>::iterator lru_position;
  };

  const int capacity_;
  uint32_t next_id_ = 1;
  absl::flat_hash_map<uint32_t, Entry> by_id_;
  absl::flat_hash_map<std::string, uint32_t> by_name_;
  std::list<uint32_t> lru_;  // front: most recently used
};

}  // namespace ringmaster
