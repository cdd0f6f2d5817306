// A key-value store that forked test processes share: one file per key in a directory, written
// whole by a rename. For tests of what ranks meet through the rendezvous store (shm_group_test,
// cpu_executor_test).
#pragma once

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "worker/rendezvous/key_value_store.h"

namespace ringmaster {

class DirectoryStore final : public KeyValueStore {
 public:
  explicit DirectoryStore(std::string dir) : dir_(std::move(dir)) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    const std::string path = Path(key);
    {
      std::ofstream out(path + ".tmp", std::ios::binary);
      out << value;
    }
    std::filesystem::rename(path + ".tmp", path);
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Get(const std::string& key) override {
    std::ifstream in(Path(key), std::ios::binary);
    if (!in) return absl::NotFoundError(key);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  absl::StatusOr<std::vector<std::string>> Wait(const std::vector<std::string>& keys,
                                                absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      std::vector<std::string> values;
      for (const std::string& key : keys) {
        absl::StatusOr<std::string> v = Get(key);
        if (!v.ok()) break;
        values.push_back(*v);
      }
      if (values.size() == keys.size()) return values;
      if (absl::Now() >= deadline) return absl::DeadlineExceededError("keys missing");
      absl::SleepFor(absl::Milliseconds(1));
    }
  }

 private:
  std::string Path(const std::string& key) const {
    std::string name = key;
    for (char& ch : name) {
      if (ch == '/') ch = '_';
    }
    return dir_ + "/" + name;
  }

  const std::string dir_;
};

}  // namespace ringmaster
