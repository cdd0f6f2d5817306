#include "worker/rendezvous/key_value_store.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"

namespace ringmaster {
namespace {

// Thread-safe: one mutex guards the map; Wait() blocks on it with a deadline (Await releases it).
class InMemoryKeyValueStore final : public KeyValueStore {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override {
    absl::MutexLock lock(&mu_);
    values_[key] = value;
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Get(const std::string& key) override {
    absl::MutexLock lock(&mu_);
    auto it = values_.find(key);
    if (it == values_.end()) return absl::NotFoundError(absl::StrCat("key '", key, "' is not set"));
    return it->second;
  }

  absl::StatusOr<std::vector<std::string>> Wait(const std::vector<std::string>& keys,
                                                absl::Duration timeout) override {
    struct AllSet {
      const InMemoryKeyValueStore* store;
      const std::vector<std::string>* keys;
      bool operator()() const ABSL_NO_THREAD_SAFETY_ANALYSIS {  // Await holds mu_ when calling.
        for (const std::string& key : *keys) {
          if (!store->values_.contains(key)) return false;
        }
        return true;
      }
    };
    const AllSet all_set{this, &keys};

    absl::MutexLock lock(&mu_);
    if (!mu_.AwaitWithTimeout(absl::Condition(&all_set), timeout)) {
      std::vector<std::string> missing;
      for (const std::string& key : keys) {
        if (!values_.contains(key)) missing.push_back(key);
      }
      return absl::DeadlineExceededError(
          absl::StrCat("rendezvous wait timed out; keys not set: ", absl::StrJoin(missing, ", ")));
    }
    std::vector<std::string> values;
    values.reserve(keys.size());
    for (const std::string& key : keys) values.push_back(values_.at(key));
    return values;
  }

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::shared_ptr<KeyValueStore> KeyValueStore::InMemory() {
  return std::make_shared<InMemoryKeyValueStore>();
}

}  // namespace ringmaster
