// A worker's side of the response cache: which of its tensors the coordinator has given an id, with
// the metadata they were cached with, so a steady-state request is just the id. Not thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "common/negotiation_types.h"

namespace ringmaster {

// Same collective metadata (names are compared by the caller's lookup).
bool SameMetadata(const TensorRequest& a, const TensorRequest& b);

// The family of one of Horovod's automatic names, `<prefix>.noname.<n>`: `<prefix>.noname.`; empty
// for any other name.
absl::string_view AutomaticFamily(absl::string_view name);

class WorkerCache {
 public:
  // The id under which `request` may be sent, or 0 when it must go in full.
  uint32_t Find(const TensorRequest& request) const;
  // For a request under an automatic name (every call a new one, so never cached itself): the id
  // last assigned to a tensor of its family with the same metadata, or 0. Ranks that issue their
  // unnamed operations in one order agree on it by position, as on the name.
  uint32_t FindFamily(const TensorRequest& request) const;
  void Assign(const std::string& name, uint32_t id, const TensorRequest& request);
  // `in_flight`: this rank has an operation of the tensor in flight, whose request by `id` the
  // coordinator may yet ask for again (TakeForResend): its request is kept until then. Others
  // are forgotten, so a job that names every call anew (Horovod's "allreduce.noname.N") does not
  // grow the worker.
  void Evict(uint32_t id, bool in_flight = true);
  // Most evicted requests kept for a resend (the oldest go first).
  static constexpr size_t kMaxEvicted = 4096;
  // The name cached under `id`, or nullptr.
  const std::string* NameOf(uint32_t id) const;
  // Drops `id` and returns its request, to be re-sent in full. An id evicted since it was last
  // sent still answers: the coordinator may drop its cache (autotune turning it off) while a
  // request by that id is on its way, and then asks for the request after the eviction.
  std::optional<TensorRequest> TakeForResend(uint32_t id);

 private:
  // Forgets `name`'s family entry if it is `id`.
  void ForgetFamily(const std::string& name, uint32_t id);

  absl::flat_hash_map<std::string, std::pair<uint32_t, TensorRequest>> by_name_;
  absl::flat_hash_map<uint32_t, std::string> by_id_;
  // Per automatic family, the id last assigned to one of its names (while it is cached): at most
  // one per entry of by_name_.
  absl::flat_hash_map<std::string, uint32_t> family_;
  // Evicted entries of operations in flight, until their id is assigned again or asked for; at
  // most kMaxEvicted, the oldest first out (evicted_order_).
  absl::flat_hash_map<uint32_t, TensorRequest> evicted_;
  std::deque<uint32_t> evicted_order_;
};

}  // namespace ringmaster
