// The GPU communicator: NCCL among the ranks of one job epoch, one CUDA stream per communicator,
// behind the same Backend interface as Gloo; `data` pointers are device memory.
//
// Setup: rank 0 generates the NCCL unique id and publishes it through the epoch's rendezvous store
// (the coordinator relays it); every rank creates its communicator non-blocking
// (ncclCommInitRankConfig with blocking = 0) and polls it until ready or `timeout`, then aborts it:
// DEADLINE_EXCEEDED naming the rank. Collectives are enqueued on the stream and completed by
// polling a CUDA event (no cudaStreamSynchronize); while waiting, the watchdog (watchdog.h) polls
// NCCL's asynchronous error and the deadline, and on failure aborts the communicator
// (ncclCommAbort, never a blocking destroy) so the wait returns with the rank and host named.
//
// Not thread-safe (see Backend) except Abort(), which any thread may call (e.g. when the
// coordinator reports a lost peer).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "worker/backend.h"
#include "worker/rendezvous/key_value_store.h"

namespace ringmaster {

struct NcclBackendOptions {
  int rank = 0;
  int size = 1;
  int device = 0;  // CUDA device ordinal
  std::shared_ptr<KeyValueStore> store;
  std::string prefix = "nccl/";  // rendezvous key prefix, distinct per communicator
  // Names this rank in errors, e.g. "rank 3 (host-b, cuda:1)".
  std::string where;
  // Bounds the rendezvous, the communicator's setup and every collective.
  absl::Duration timeout = absl::Seconds(30);
  // Set from another thread to give up the communicator's setup (the job stopped meanwhile).
  std::shared_ptr<std::atomic<bool>> cancelled;
  // Called once (on the thread that detected it) when the communicator fails by itself: an
  // asynchronous NCCL error or a collective past its deadline (not an Abort()). The daemon reports
  // it to the coordinator, which fails the job.
  std::function<void(const absl::Status&)> on_fail;
  // The CUDA stream (a cudaStream_t) to enqueue on, borrowed: a process set's communicator shares
  // its job's. nullptr: the backend creates its own.
  void* stream = nullptr;
  // What the setup's and each collective's deadline are measured on (borrowed; tests pass a
  // FakeClock and move it, instead of waiting for a timeout).
  Clock* clock = Clock::Real();
};

class NcclBackend : public Backend {
 public:
  // Aborts the communicator (from any thread): the collective in flight and every later one fail
  // with UNAVAILABLE carrying `why`.
  virtual void Abort(const std::string& why) = 0;
  // The stream collectives are enqueued on (a cudaStream_t).
  virtual void* stream() const = 0;
};

// FAILED_PRECONDITION when `options.device` is absent or cannot be used (busy in exclusive mode,
// out of memory); the rendezvous or setup failure otherwise.
absl::StatusOr<std::unique_ptr<NcclBackend>> CreateNcclBackend(NcclBackendOptions options);

// Number of CUDA devices visible to this process (0 without a driver or device).
int CudaDeviceCount();

// What GPU tests and benchmarks need to know before they run: the visible devices, and when there
// are none, CUDA's reason and whether an NVIDIA kernel driver is installed anyway (then having no
// device is a failure to report, e.g. a CUDA runtime newer than the driver, not a machine without
// GPUs to skip).
struct CudaProbe {
  int devices = 0;
  bool driver_installed = false;
  std::string problem;  // empty when devices > 0
};
CudaProbe ProbeCuda();

// OK when `device` can be used by this process: FAILED_PRECONDITION with CUDA's reason otherwise
// (absent, busy or prohibited by the compute mode, driver missing).
absl::Status CheckCudaDevice(int device);

}  // namespace ringmaster
