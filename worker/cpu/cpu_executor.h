// A CPU rank's executor: collectives on the host arena with Gloo communicators. Fused tensors that
// are not contiguous in the arena are packed into a fusion buffer and unpacked after; averages and
// pre/postscale factors are applied on the host; a large allreduce is split across the
// communicators and its parts run concurrently on a small persistent pool (the same split on every
// rank), so the reduction arithmetic uses several cores, as NCCL's channels and PyTorch's Gloo
// threads do.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "common/shared_memory.h"
#include "worker/backend.h"
#include "worker/cpu/local_rounds.h"
#include "worker/cpu/shm_group.h"
#include "worker/executor.h"

namespace ringmaster {

// Runs parts 1 .. n-1 of a job on persistent threads and part 0 on the caller; returns once every
// part is done. One job at a time (the engine thread's).
class PartPool {
 public:
  explicit PartPool(int helpers);
  ~PartPool();
  PartPool(const PartPool&) = delete;
  PartPool& operator=(const PartPool&) = delete;

  // `parts` at most helpers + 1.
  void Run(int parts, absl::FunctionRef<void(int)> part);

 private:
  void Loop(int index);

  absl::Mutex mu_;
  const absl::FunctionRef<void(int)>* part_ ABSL_GUARDED_BY(mu_) = nullptr;
  int parts_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

struct CpuExecutorOptions {
  int rank = 0;
  int size = 1;
  uint8_t* arena = nullptr;           // borrowed; outlives the executor
  ArenaAllocator* outputs = nullptr;  // borrowed: where allgather outputs are allocated
  // Creates communicator `index` (rendezvous included), for 0 .. communicators-1, in Setup.
  std::function<absl::StatusOr<std::unique_ptr<Backend>>(int index)> make_backend;
  // Creates the communicator of a process set (Collective::process_set_ranks) the first time one of
  // its collectives runs here: `key` names the set and its members (the rendezvous scope), `rank`
  // is this rank's place among the `size` members. Null: process sets are refused.
  std::function<absl::StatusOr<std::unique_ptr<Backend>>(const std::string& key, int rank,
                                                         int size)>
      make_set_backend;
  // Connects the shared-memory host group (shm_group.h) in Setup, for jobs of more than one rank;
  // null, or a null group, leaves allreduce to the communicators. A group of several hosts makes
  // allreduce hierarchical, with a cross-host communicator made by make_set_backend.
  std::function<absl::StatusOr<std::unique_ptr<ShmGroup>>()> make_host_group;
  // With a group of several hosts: whether allreduce, and allgather, go through it (hierarchical)
  // or flat over the communicators. A group of one host carries both.
  bool hierarchical_allreduce = true;
  bool hierarchical_allgather = true;
  // With a group of this one host (every rank of the job), of at most LocalRoundState::kMaxRanks
  // ranks: a lone cached allreduce may be negotiated locally (local_rounds.h).
  bool local_negotiation = true;
  int communicators = 2;
  // Allreduces smaller than this use communicator 0 alone.
  int64_t split_bytes = int64_t{4} << 20;
};

class CpuExecutor final : public Executor {
 public:
  explicit CpuExecutor(CpuExecutorOptions options);
  ~CpuExecutor() override;

  absl::Status Setup() override;
  absl::StatusOr<Executed> Execute(const Collective& c, ExecutionTrace& trace) override;
  // A malformed response, and an allgather whose output did not fit this rank's arena (the rank
  // took part all the same), leave the communicator in step: they fail only themselves.
  bool Fatal(const absl::Status& status) const override {
    return status.code() != absl::StatusCode::kInvalidArgument &&
           status.code() != absl::StatusCode::kResourceExhausted;
  }
  // Every Gloo operation has its timeout; the host group is woken at once (a rank in its cross-host
  // step of a hierarchical allreduce returns at that step's timeout).
  void Abort(const std::string& why) override;
  void ReleaseProcessSet(int32_t id) override;
  // Whether allreduce goes through shared memory (known after Setup).
  bool shares_memory() const { return host_group_ != nullptr; }
  LocalRounds* local_rounds() override { return local_rounds_.get(); }

  // Most process-set communicators one rank keeps.
  static constexpr size_t kMaxProcessSets = 256;

 private:
  absl::Status Allreduce(const Collective& c, ExecutionTrace& trace);
  // The allreduce through the host's shared-memory group (hierarchical across hosts when cross_
  // is set): each tensor read into the segment where it lies and the result written straight back.
  absl::Status ShmAllreduce(const Collective& c, const std::vector<int64_t>& counts, int64_t total,
                            ReduceOp backend_op, int divisor);
  // Through the communicators: split across them when large and global.
  absl::Status NetworkAllreduce(const Collective& c, uint8_t* buffer, int64_t total,
                                ReduceOp backend_op, int divisor, Backend& set_backend,
                                ExecutionTrace& trace);
  absl::StatusOr<Executed> Allgather(const Collective& c, Backend& backend, int size);
  // The communicator of the collective's process set (made on first use); the first global one for
  // the global set.
  absl::StatusOr<Backend*> BackendFor(const Collective& c);
  // Whether an allgather of `c` goes through the host group (the job's set; one host, or
  // hierarchical allgather across hosts).
  bool HostGroupGathers(const Collective& c) const {
    return c.process_set_ranks.empty() && host_group_ != nullptr &&
           (cross_ == nullptr || options_.hierarchical_allgather);
  }
  // Scratch memory of at least `bytes` (packing; a joined rank's part).
  uint8_t* Scratch(size_t bytes);

  const CpuExecutorOptions options_;
  std::vector<std::unique_ptr<Backend>> backends_;
  std::map<std::string, std::unique_ptr<Backend>> set_backends_;  // by set key
  // Sets released (Horovod's remove_process_set), whose collectives are refused: their
  // communicators' rendezvous keys are spent. At most kMaxReleased are remembered.
  static constexpr size_t kMaxReleased = size_t{1} << 20;
  absl::flat_hash_set<int32_t> released_;
  std::unique_ptr<PartPool> pool_;
  std::unique_ptr<ShmGroup> host_group_;       // the engine thread's
  std::unique_ptr<LocalRounds> local_rounds_;  // in host_group_'s segment
  // What Abort (any thread) reaches: the group once connected, and the first reason, applied to a
  // group connected after it.
  absl::Mutex abort_mu_;
  ShmGroup* abortable_ ABSL_GUARDED_BY(abort_mu_) = nullptr;
  std::optional<std::string> aborted_ ABSL_GUARDED_BY(abort_mu_);
  // Hierarchical: the communicator among the ranks of this local rank on every host.
  std::unique_ptr<Backend> cross_;
  std::vector<uint8_t> fusion_buffer_;
};

}  // namespace ringmaster
