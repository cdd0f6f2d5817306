// How a tensor reaches the shared arena its daemon reads, and how the result comes back: the part
// of the client that differs between a CPU slot (the arena is host shared memory; copies are
// memcpy) and a GPU slot (the arena is the daemon's device memory opened through CUDA IPC; copies
// and readiness are ordered on the caller's CUDA stream with interprocess events).
//
// One implementation per kind: HostStaging (host_staging.cc) always; the CUDA one
// (cuda_staging.cc) only in builds that found CUDA, and without it OpenDeviceStaging says the
// client was built without CUDA (no_cuda_staging.cc). The client itself has no CUDA code.
//
// Streams are opaque here (`void*`, a cudaStream_t on a GPU slot; nullptr is the legacy default
// stream). Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/shared_memory.h"

namespace ringmaster {

class Staging {
 public:
  // `base`: the arena in this process (host or device memory); the first `bytes` are this
  // process's to allocate.
  Staging(uint8_t* base, size_t bytes) : base_(base), allocator_(0, bytes) {}
  virtual ~Staging() = default;

  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  uint8_t* base() const { return base_; }
  ArenaAllocator& allocator() { return allocator_; }
  // Whether `p` .. `p + bytes` lies in this process's part of the arena (zero copy).
  bool InArena(const void* p, size_t bytes) const {
    const auto* q = static_cast<const uint8_t*>(p);
    return q >= base_ && q + bytes <= base_ + allocator_.end();
  }

  // The CUDA device of the arena, -1 for host memory.
  virtual int device() const = 0;

  // While alive, the arena's device is current on this thread (and the thread's previous context
  // comes back after). Nothing on the host.
  class DeviceScope {
   public:
    virtual ~DeviceScope() = default;
  };
  virtual std::unique_ptr<DeviceScope> EnterDevice() = 0;
  // Makes the arena's device current on this thread for good (the client's reader thread).
  virtual void BindThread() = 0;

  // Copies `bytes` (host or device memory either side), in order on `stream`; complete when this
  // returns only with `wait` (always, on the host).
  virtual absl::Status Copy(void* dst, const void* src, size_t bytes, void* stream,
                            const char* what, bool wait) = 0;
  // Whether `p` is host memory (always, on a host arena).
  virtual bool HostMemory(const void* p) const = 0;

  // Marks the tensor ready once the work queued on `stream` so far is done, with a ready event
  // shared with the daemon: its index, or -1 when there is none (the host; or every event in use,
  // after waiting for the stream to drain). Each index is in use until ReadyDone.
  virtual absl::StatusOr<int> RecordReady(void* stream) = 0;
  virtual void ReadyDone(int ready) = 0;
  // The handles of the ready events, to share with the daemon once (none on the host).
  virtual std::vector<std::string> ReadyEventHandles() const = 0;

  // Makes `stream` wait for the daemon's done event (1-based; 0: none).
  virtual absl::Status WaitDone(int32_t done_event, void* stream) = 0;
  // Makes `to` wait for the work queued on `from` so far.
  virtual absl::Status JoinStreams(void* from, void* to) = 0;

  // Gives staged memory back: at once on the host; on a device, once the work queued on `stream`
  // so far (the copy out) is done.
  virtual void Release(size_t offset, void* stream) = 0;
  // Frees released memory whose last use is done (with `wait`, waits for all of it first); returns
  // whether anything was freed. Nothing to do on the host.
  virtual bool Reclaim(bool wait) = 0;

  // Whether staged memory may be reused after its operation failed: on a device the daemon may
  // still be writing it.
  bool ReusableAfterFailure() const { return device() < 0; }

 private:
  uint8_t* const base_;
  ArenaAllocator allocator_;
};

// A CPU slot: `base` is the host arena (owned by the caller, outlives the staging).
std::unique_ptr<Staging> MakeHostStaging(uint8_t* base, size_t bytes);

// What the daemon of a GPU slot shares: its device (0-based, and its PCI bus id so the same GPU is
// found whatever this process's CUDA_VISIBLE_DEVICES), the IPC handle of its device arena and
// those of its done events.
struct DeviceArena {
  int device = -1;
  std::string pci_bus_id;
  std::string arena_handle;
  std::vector<std::string> done_events;
  size_t bytes = 0;  // this process's part
};
// Opens the device arena and the done events and creates the ready events. FAILED_PRECONDITION in
// a build without CUDA.
absl::StatusOr<std::unique_ptr<Staging>> OpenDeviceStaging(const DeviceArena& arena);

}  // namespace ringmaster
