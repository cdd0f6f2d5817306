// The rendezvous key-value store as a worker sees it: the coordinator's RendezvousService for one
// job epoch in production, an in-memory map in tests. Communicator backends rendezvous through it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ringmaster {

// Implementations are thread-safe.
class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // NOT_FOUND when the key is not set.
  virtual absl::StatusOr<std::string> Get(const std::string& key) = 0;
  // The values of `keys` once all are set; DEADLINE_EXCEEDED naming the missing keys after
  // `timeout`.
  virtual absl::StatusOr<std::vector<std::string>> Wait(const std::vector<std::string>& keys,
                                                        absl::Duration timeout) = 0;

  // A process-local store (tests, and single-process jobs).
  static std::shared_ptr<KeyValueStore> InMemory();
};

}  // namespace ringmaster
