#include <cstring>

#include "client/staging.h"

namespace ringmaster {
namespace {

// A CPU slot's arena is host shared memory the daemon maps too: staging is a memcpy, a tensor is
// ready when it is written, and memory comes back at once.
class HostStaging final : public Staging {
 public:
  using Staging::Staging;

  int device() const override { return -1; }
  std::unique_ptr<DeviceScope> EnterDevice() override { return nullptr; }
  void BindThread() override {}
  absl::Status Copy(void* dst, const void* src, size_t bytes, void* /*stream*/,
                    const char* /*what*/, bool /*wait*/) override {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  bool HostMemory(const void* /*p*/) const override { return true; }
  absl::StatusOr<int> RecordReady(void* /*stream*/) override { return -1; }
  void ReadyDone(int /*ready*/) override {}
  std::vector<std::string> ReadyEventHandles() const override { return {}; }
  absl::Status WaitDone(int32_t /*done_event*/, void* /*stream*/) override {
    return absl::OkStatus();
  }
  absl::Status JoinStreams(void* /*from*/, void* /*to*/) override { return absl::OkStatus(); }
  void Release(size_t offset, void* /*stream*/) override { allocator().Free(offset).IgnoreError(); }
  bool Reclaim(bool /*wait*/) override { return false; }
};

}  // namespace

std::unique_ptr<Staging> MakeHostStaging(uint8_t* base, size_t bytes) {
  return std::make_unique<HostStaging>(base, bytes);
}

}  // namespace ringmaster
