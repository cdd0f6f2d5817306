// Fuzz target: the rendezvous store under any sequence of sets, gets, waits, expiries and drops
// across a few job epochs. A wait's callback must run exactly once.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/rendezvous_store.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using ringmaster::RendezvousStore;
  RendezvousStore store;
  auto calls = std::make_shared<std::vector<int>>();
  absl::Time now = absl::UnixEpoch();
  size_t pos = 0;
  auto next = [&]() -> uint8_t { return pos < size ? data[pos++] : 0; };
  for (int step = 0; step < 4096 && pos < size; ++step) {
    const std::string scope = RendezvousStore::Scope("job", next() % 3);
    const std::string key = next() % 8 == 0 ? std::string() : absl::StrCat("k", next() % 8);
    switch (next() % 6) {
      case 0:
        (void)store.Set(scope, key, std::string(next() % 64, 'v'));
        break;
      case 1:
        (void)store.Get(scope, key);
        break;
      case 2: {
        std::vector<std::string> keys;
        for (int i = next() % 4; i > 0; --i) keys.push_back(absl::StrCat("k", next() % 8));
        const size_t id = calls->size();
        calls->push_back(0);
        store.Wait(scope, keys, now + absl::Milliseconds(next()),
                   [calls, id](absl::StatusOr<std::vector<std::string>>) { ++(*calls)[id]; });
        break;
      }
      case 3:
        now += absl::Milliseconds(next());
        store.ExpireWaiters(now);
        break;
      case 4:
        store.DropScope(scope, "dropped");
        break;
      case 5:
        store.AbortAll("stopping");
        break;
    }
  }
  store.AbortAll("end");
  for (int c : *calls) {
    if (c != 1) std::abort();  // every wait answered exactly once
  }
  return 0;
}
