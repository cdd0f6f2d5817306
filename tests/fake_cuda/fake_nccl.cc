// A stand-in for NCCL (libnccl.so.2) over the fake CUDA runtime (fake_cudart.cc): the ranks of a
// communicator are processes on this machine; each collective is executed when it is called
// (streams are synchronous there) by exchanging the ranks' buffers through memfd objects that a
// small control segment (POSIX shared memory named by the unique id) announces, between two
// barriers. Sum, product, min, max and average of every type the project uses; broadcast; groups
// (executed as called: every rank calls the same collectives in the same order). Every wait has
// a deadline (FAKE_NCCL_TIMEOUT_SECONDS, default 60): past it the collective fails with
// ncclSystemError and the communicator reports it as its asynchronous error.
#include <fcntl.h>
#include <nccl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "common/half.h"

namespace {

constexpr int kMaxRanks = 64;

struct Slot {
  std::atomic<int32_t> pid;
  std::atomic<int32_t> fd;
  std::atomic<uint64_t> bytes;
};

struct Control {
  std::atomic<uint64_t> arrived;
  std::atomic<uint64_t> generation;
  Slot slots[kMaxRanks];
};

std::chrono::seconds Timeout() {
  const char* s = std::getenv("FAKE_NCCL_TIMEOUT_SECONDS");
  return std::chrono::seconds(s != nullptr ? std::atoi(s) : 60);
}

struct Half {
  uint16_t bits;
};
struct Bf16 {
  uint16_t bits;
};

}  // namespace

struct ncclComm {
  std::string name;
  int nranks = 0;
  int rank = 0;
  Control* control = nullptr;
  std::atomic<ncclResult_t> async_error{ncclSuccess};
  std::atomic<bool> aborted{false};
  // A non-blocking communicator (ncclConfig_t::blocking = 0) runs its collectives on a thread of
  // its own, in the order they were called, and reports ncclInProgress until they are done, as
  // NCCL's may: the caller polls ncclCommGetAsyncError without holding anything.
  bool blocking = true;
  std::mutex mu;
  std::condition_variable wake;
  std::deque<std::function<ncclResult_t()>> queue;
  std::atomic<int> pending{0};
  int calls = 0;  // collectives called (the caller's thread)
  std::thread runner;
  bool stopping = false;

  ncclResult_t Run(std::function<ncclResult_t()> op);

  ncclResult_t Enqueue(std::function<ncclResult_t()> op) {
    {
      std::lock_guard lock(mu);
      if (!runner.joinable()) runner = std::thread([this] { Loop(); });
      ++pending;
      queue.push_back(std::move(op));
    }
    wake.notify_one();
    return ncclInProgress;
  }

  void Loop() {
    while (true) {
      std::function<ncclResult_t()> op;
      {
        std::unique_lock lock(mu);
        wake.wait(lock, [this] { return stopping || !queue.empty(); });
        if (queue.empty()) return;
        op = std::move(queue.front());
        queue.pop_front();
      }
      const ncclResult_t r = aborted.load() ? ncclSystemError : op();
      if (r != ncclSuccess && async_error.load() == ncclSuccess) async_error = r;
      --pending;
    }
  }

  void Stop() {
    {
      std::lock_guard lock(mu);
      stopping = true;
    }
    wake.notify_all();
    if (runner.joinable()) runner.join();
  }

  bool Barrier() {
    const uint64_t generation = control->generation.load();
    if (control->arrived.fetch_add(1) + 1 == static_cast<uint64_t>(nranks)) {
      control->arrived.store(0);
      control->generation.fetch_add(1);
      return true;
    }
    const auto deadline = std::chrono::steady_clock::now() + Timeout();
    auto pause =
        std::chrono::microseconds(10);  // backs off to 1 ms: waiters leave the CPU to others
    while (control->generation.load() == generation) {
      if (aborted.load()) return false;
      if (std::chrono::steady_clock::now() > deadline) {
        async_error = ncclSystemError;  // a peer never came: what NCCL reports asynchronously
        return false;
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
    return true;
  }

  // Publishes `bytes` of `data` as this rank's contribution.
  int Publish(const void* data, size_t bytes) {
    const int fd = memfd_create("fake-nccl", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes == 0 ? 1 : bytes)) != 0) return -1;
    if (bytes > 0) {
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) return -1;
      std::memcpy(p, data, bytes);
      munmap(p, bytes);
    }
    control->slots[rank].pid.store(getpid());
    control->slots[rank].fd.store(fd);
    control->slots[rank].bytes.store(bytes);
    return fd;
  }

  // Maps rank r's contribution (read only); nullptr on failure.
  const void* Open(int r, size_t bytes) {
    const std::string path = "/proc/" + std::to_string(control->slots[r].pid.load()) + "/fd/" +
                             std::to_string(control->slots[r].fd.load());
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return nullptr;
    void* p = mmap(nullptr, bytes == 0 ? 1 : bytes, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    return p == MAP_FAILED ? nullptr : p;
  }
};

namespace {

template <typename T>
double In(T v) {
  if constexpr (std::is_same_v<T, Half>)
    return ringmaster::HalfToFloat(v.bits);
  else if constexpr (std::is_same_v<T, Bf16>)
    return ringmaster::Bfloat16ToFloat(v.bits);
  else
    return static_cast<double>(v);
}
template <typename T>
T Out(double v) {
  if constexpr (std::is_same_v<T, Half>)
    return {ringmaster::FloatToHalf(static_cast<float>(v))};
  else if constexpr (std::is_same_v<T, Bf16>)
    return {ringmaster::FloatToBfloat16(static_cast<float>(v))};
  else
    return static_cast<T>(v);
}

// out[i] = op over ranks of parts[r][i]; integers in their own type, floats in double then rounded
// once (the test values are exact either way).
template <typename T>
void Reduce(const std::vector<const void*>& parts, void* out, size_t count, ncclRedOp_t op) {
  for (size_t i = 0; i < count; ++i) {
    if constexpr (std::is_integral_v<T>) {
      T acc = static_cast<const T*>(parts[0])[i];
      for (size_t r = 1; r < parts.size(); ++r) {
        const T v = static_cast<const T*>(parts[r])[i];
        switch (op) {
          case ncclSum:
          case ncclAvg:
            acc = static_cast<T>(acc + v);
            break;
          case ncclProd:
            acc = static_cast<T>(acc * v);
            break;
          case ncclMax:
            acc = v > acc ? v : acc;
            break;
          case ncclMin:
            acc = v < acc ? v : acc;
            break;
          default:
            break;
        }
      }
      if (op == ncclAvg) acc = static_cast<T>(acc / static_cast<T>(parts.size()));
      static_cast<T*>(out)[i] = acc;
    } else {
      double acc = In(static_cast<const T*>(parts[0])[i]);
      for (size_t r = 1; r < parts.size(); ++r) {
        const double v = In(static_cast<const T*>(parts[r])[i]);
        switch (op) {
          case ncclSum:
          case ncclAvg:
            acc += v;
            break;
          case ncclProd:
            acc *= v;
            break;
          case ncclMax:
            acc = v > acc ? v : acc;
            break;
          case ncclMin:
            acc = v < acc ? v : acc;
            break;
          default:
            break;
        }
      }
      if (op == ncclAvg) acc /= static_cast<double>(parts.size());
      static_cast<T*>(out)[i] = Out<T>(acc);
    }
  }
}

size_t Size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    default:
      return 8;
  }
}

}  // namespace

// Inside ncclGroupStart/End (per thread, as NCCL's): the non-blocking communicator the group's
// calls went to. Its calls return ncclSuccess (deferred); ncclGroupEnd returns ncclInProgress.
thread_local int group_depth = 0;
thread_local ncclComm* group_comm = nullptr;

// Fault injection: FAKE_NCCL_FAIL_RANK=R and FAKE_NCCL_FAIL_AT=K make rank R's K-th collective
// (1-based) fail as a network error does: it never completes, and the communicator reports
// ncclRemoteError asynchronously (its peers wait for it until they are aborted or time out).
bool InjectedFailure(const ncclComm& comm, int call) {
  const char* rank = std::getenv("FAKE_NCCL_FAIL_RANK");
  const char* at = std::getenv("FAKE_NCCL_FAIL_AT");
  return rank != nullptr && at != nullptr && std::atoi(rank) == comm.rank && std::atoi(at) == call;
}

ncclResult_t ncclComm::Run(std::function<ncclResult_t()> op) {
  if (InjectedFailure(*this, ++calls)) {
    async_error = ncclRemoteError;
    return blocking ? ncclRemoteError : ncclInProgress;
  }
  if (blocking) return op();
  const ncclResult_t r = Enqueue(std::move(op));
  if (group_depth == 0) return r;
  group_comm = this;
  return ncclSuccess;
}

ncclResult_t AllReduceNow(const void* send, void* recv, size_t count, ncclDataType_t type,
                          ncclRedOp_t op, ncclComm_t comm);
ncclResult_t BroadcastNow(const void* send, void* recv, size_t count, ncclDataType_t type, int root,
                          ncclComm_t comm);

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}
const char* ncclGetLastError(ncclComm_t) { return ""; }
const char* ncclGetErrorString(ncclResult_t) { return "fake NCCL error"; }

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::memset(id, 0, sizeof(*id));
  std::random_device random;
  std::snprintf(id->internal, sizeof(id->internal), "/fake-nccl-%d-%08x%08x", getpid(), random(),
                random());
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* out, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t* config) {
  if (nranks < 1 || nranks > kMaxRanks || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  auto* comm = new ncclComm;
  comm->blocking = config == nullptr || config->blocking != 0;
  comm->name = id.internal;
  comm->nranks = nranks;
  comm->rank = rank;
  const int fd = shm_open(comm->name.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0 || ftruncate(fd, sizeof(Control)) != 0) {
    delete comm;
    return ncclSystemError;
  }
  void* p = mmap(nullptr, sizeof(Control), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    delete comm;
    return ncclSystemError;
  }
  comm->control = static_cast<Control*>(p);  // zero-filled by ftruncate: the atomics start at 0
  // Every rank arrives, then rank 0 removes the segment's name (everyone has it mapped).
  auto rendezvous = [comm] {
    const bool met = comm->Barrier();
    if (comm->rank == 0 || !met) shm_unlink(comm->name.c_str());  // nobody else opens it now
    return met ? ncclSuccess : ncclSystemError;
  };
  *out = comm;
  if (!comm->blocking) return comm->Enqueue(rendezvous);  // ncclInProgress: poll the comm
  const ncclResult_t r = rendezvous();
  if (r != ncclSuccess) {
    *out = nullptr;
    delete comm;
  }
  return r;
}
ncclResult_t ncclCommInitRank(ncclComm_t* out, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(out, nranks, id, rank, nullptr);
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* state) {
  const ncclResult_t error = comm->async_error.load();
  *state = error != ncclSuccess ? error : comm->pending.load() > 0 ? ncclInProgress : ncclSuccess;
  return ncclSuccess;
}
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  return comm->pending.load() > 0 ? ncclInProgress : ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  comm->Stop();
  munmap(comm->control, sizeof(Control));
  delete comm;
  return ncclSuccess;
}
// As NCCL's: collectives in flight (on other threads) return at once. The communicator's memory is
// left alone (a collective may still be leaving a barrier): a fake leaks a few bytes per abort.
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  // As NCCL's: once it returns, nothing of the communicator touches memory any more (the caller
  // frees its buffers next). The collective in progress sees `aborted` at its next wait.
  comm->aborted.store(true);
  comm->Stop();
  return ncclSuccess;
}
ncclResult_t ncclGroupStart() {
  ++group_depth;
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd() {  // the group's calls are already queued, in order
  if (group_depth == 0) return ncclInvalidUsage;
  if (--group_depth > 0) return ncclSuccess;
  ncclComm* comm = group_comm;
  group_comm = nullptr;
  return comm != nullptr && comm->pending.load() > 0 ? ncclInProgress : ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t) {
  return comm->Run([=] { return AllReduceNow(send, recv, count, type, op, comm); });
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t) {
  return comm->Run([=] { return BroadcastNow(send, recv, count, type, root, comm); });
}

}  // extern "C"

ncclResult_t AllReduceNow(const void* send, void* recv, size_t count, ncclDataType_t type,
                          ncclRedOp_t op, ncclComm_t comm) {
  const size_t bytes = count * Size(type);
  const int mine = comm->Publish(send, bytes);
  if (mine < 0) return ncclSystemError;
  if (!comm->Barrier()) {
    close(mine);
    return ncclSystemError;
  }
  std::vector<const void*> parts;
  for (int r = 0; r < comm->nranks; ++r) parts.push_back(comm->Open(r, bytes));
  bool ok = true;
  for (const void* p : parts) ok = ok && p != nullptr;
  if (ok) {
    switch (type) {
      case ncclInt8:
        Reduce<int8_t>(parts, recv, count, op);
        break;
      case ncclUint8:
        Reduce<uint8_t>(parts, recv, count, op);
        break;
      case ncclInt32:
        Reduce<int32_t>(parts, recv, count, op);
        break;
      case ncclUint32:
        Reduce<uint32_t>(parts, recv, count, op);
        break;
      case ncclInt64:
        Reduce<int64_t>(parts, recv, count, op);
        break;
      case ncclUint64:
        Reduce<uint64_t>(parts, recv, count, op);
        break;
      case ncclFloat16:
        Reduce<Half>(parts, recv, count, op);
        break;
      case ncclBfloat16:
        Reduce<Bf16>(parts, recv, count, op);
        break;
      case ncclFloat32:
        Reduce<float>(parts, recv, count, op);
        break;
      case ncclFloat64:
        Reduce<double>(parts, recv, count, op);
        break;
      default:
        ok = false;
    }
  }
  for (const void* p : parts) {
    if (p != nullptr) munmap(const_cast<void*>(p), bytes == 0 ? 1 : bytes);
  }
  const bool done = comm->Barrier();  // nobody reads this rank's part any more
  close(mine);
  return ok && done ? ncclSuccess : ncclSystemError;
}

ncclResult_t BroadcastNow(const void* send, void* recv, size_t count, ncclDataType_t type, int root,
                          ncclComm_t comm) {
  const size_t bytes = count * Size(type);
  int mine = -1;
  if (comm->rank == root) {
    mine = comm->Publish(send, bytes);
    if (mine < 0) return ncclSystemError;
    if (recv != send) std::memmove(recv, send, bytes);
  }
  if (!comm->Barrier()) {
    if (mine >= 0) close(mine);
    return ncclSystemError;
  }
  bool ok = true;
  if (comm->rank != root && bytes > 0) {
    const void* p = comm->Open(root, bytes);
    ok = p != nullptr;
    if (ok) {
      std::memcpy(recv, p, bytes);
      munmap(const_cast<void*>(p), bytes);
    }
  }
  const bool done = comm->Barrier();
  if (mine >= 0) close(mine);
  return ok && done ? ncclSuccess : ncclSystemError;
}
