// The shared-memory host group: an allreduce among ranks whose daemons share one host, through one
// segment of shared memory instead of sockets. With `across_hosts`, a job spread over several hosts
// with as many ranks on each gets one group per host, and the caller allreduces each reduced slice
// across hosts among the ranks of the same local index (hierarchical allreduce). The data goes
// through in chunks: every rank copies its chunk into its own slot, then reduces its slice of every
// rank's slot into the segment's result buffer (a reduce-scatter through memory), then copies the
// whole reduced chunk out (the allgather). Two barriers per chunk, and every rank ends with the
// same bits.
//
// The segment is anonymous (memfd): rank 0 creates it and the others open it through
// /proc/<pid>/fd, so nothing is left behind whoever dies. Connecting decides, the same way on
// every rank, whether the group can exist: all ranks must be on one host (same boot, PID and
// network namespaces, same host name) and every rank must map the segment; otherwise there is no
// group and the job's communicators carry the data.
//
// Failure: every wait is bounded by the timeout. A rank that fails (timeout, a peer that exited,
// Abort) marks the segment failed and wakes the others, so every rank of the group returns an error
// at once naming the cause; the group is unusable afterwards, as a failed Gloo communicator is.
//
// Not thread-safe, except Abort: one engine thread owns the group.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/tensor.h"
#include "worker/rendezvous/key_value_store.h"

namespace ringmaster {

class SharedMemory;
struct ShmHeader;
struct LocalRoundState;

struct ShmGroupOptions {
  int rank = 0;
  int size = 1;
  // Where the ranks meet (the job epoch's rendezvous store) and under which key prefix.
  std::shared_ptr<KeyValueStore> store;
  std::string prefix = "shm/";
  // The worker's host name: ranks of different names never share memory.
  std::string host;
  // A group of this host's ranks even when the job spans hosts, provided every host has the same
  // number of ranks, two or more (hierarchical allreduce). Otherwise only when all ranks share it.
  bool across_hosts = false;
  // Bytes each rank moves through its slot per chunk. 0: chosen from the host's ranks (1 MiB up to
  // 8 ranks, less above, so the segment stays in the last-level cache; across hosts 64 MiB over
  // the host's ranks, at most 32 MiB, since each chunk costs an allreduce over the network).
  int64_t slot_bytes = 0;
  // Bounds the rendezvous and every wait of a collective.
  absl::Duration timeout = absl::Seconds(30);
};

class ShmGroup {
 public:
  // Applied to `count` elements at `data` in place (scaling).
  using Finish = absl::FunctionRef<void(void* data, int64_t count)>;
  // The same, and may fail (a slice's allreduce across hosts, then scaling).
  using Reduced = absl::FunctionRef<absl::Status(void* data, int64_t count)>;

  ~ShmGroup();
  ShmGroup(const ShmGroup&) = delete;
  ShmGroup& operator=(const ShmGroup&) = delete;

  // This rank's place among its host's ranks (in job rank order), and their number.
  int rank() const { return rank_; }
  int size() const { return size_; }
  // The hosts of the job (1 unless across_hosts), and this one's place among them (by lowest rank).
  int hosts() const { return hosts_; }
  int host_index() const { return host_index_; }

  // In place over `count` elements of `dtype` at `data` (sum, min, max or product). `before` runs
  // on each chunk of this rank's input once it is in the segment, `after` on each reduced slice
  // before the others read it: the scaling costs no pass over memory of its own. Every host splits
  // chunks and slices alike, so `after` of local rank i sees the same elements on every host. A
  // failing `after` fails the group on every rank with its status.
  absl::Status Allreduce(void* data, int64_t count, DataType dtype, ReduceOp op, Finish before,
                         Reduced after);

  // Fills `slot` with elements [first, first + count) of this rank's input.
  using Load = absl::FunctionRef<absl::Status(int64_t first, int64_t count, void* slot)>;
  // Writes the reduced elements [first, first + count), at `reduced`, to this rank's output.
  using Store = absl::FunctionRef<absl::Status(int64_t first, int64_t count, const void* reduced)>;
  // The same over `count` elements that need not lie in one buffer here (fused tensors where they
  // are: no fusion buffer). A failing `load` fails the group on every rank; a failing `store`
  // fails this rank.
  absl::Status Allreduce(int64_t count, DataType dtype, ReduceOp op, Load load, Finish before,
                         Reduced after, Store store);

  // Every job rank's part, gathered into `out` on every rank in job rank order: `bytes` holds
  // each job rank's part size (this rank's part at `in`; `in` may be its place in `out`). On one
  // host every rank copies its part into the segment and the others' out of it, a slot at a
  // time. Across hosts, each rank first gathers the parts of the ranks with its local index, one
  // per host, with `across` (a network allgather among them, in host order: `bytes` per host),
  // then the host's ranks exchange what they gathered through the segment. A failing `across`
  // fails the group on every rank of the host.
  using Gather =
      absl::FunctionRef<absl::Status(const void* in, void* out, absl::Span<const int64_t> bytes)>;
  absl::Status Allgatherv(const void* in, void* out, absl::Span<const int64_t> bytes,
                          Gather across);

  // Any thread: a collective in progress here and on every other rank returns, and every later one
  // fails, with `why`.
  void Abort(const std::string& why);

  // Where the group's ranks hold local negotiation rounds (local_rounds.h), in the segment: with
  // one host only (a job spread over hosts negotiates through the coordinator), else null.
  LocalRoundState* local_round_state() const;

  // An allreduce of at most this many bytes (and half a slot) on one host takes one barrier, not
  // two: every rank reduces all of it (in rank order, as a slice is reduced, so every rank gets the
  // same bits) from the ranks' slots into memory of its own. Its inputs alternate between the two
  // halves of each slot, so a rank may write the next one's while a slower rank still reads this
  // one's.
  static constexpr int64_t kSmallBytes = 4096;

 private:
  friend absl::StatusOr<std::unique_ptr<ShmGroup>> ConnectShmGroup(ShmGroupOptions options);
  ShmGroup(int rank, int size, int host_index, int64_t slot_bytes, absl::Duration timeout,
           std::unique_ptr<SharedMemory> segment, std::vector<std::vector<int>> host_ranks,
           std::vector<int> pids, std::vector<int> pidfds);

  // Waits until every rank has arrived at this rank's next barrier.
  absl::Status Barrier();
  // Runs `step` (a cross-host step when there are several hosts), marked in the segment meanwhile:
  // a host's rank whose barrier times out names the ranks still in theirs apart.
  absl::Status Cross(absl::FunctionRef<absl::Status()> step);
  // Names the collective in progress (for errors) and refuses it when the group failed before.
  absl::Status Begin(const char* what);
  // The error every rank returns once the segment is marked failed.
  absl::Status Failed();
  // Marks the segment failed by this rank with `status` and wakes every waiter.
  absl::Status Fail(absl::Status status);
  // A peer whose daemon has exited, or -1.
  int DeadPeer() const;
  uint8_t* Slot(int rank) const;
  uint8_t* Result() const;

  const int rank_;
  const int size_;
  const int hosts_;
  const int host_index_;
  const int64_t slot_bytes_;
  const absl::Duration timeout_;
  std::unique_ptr<SharedMemory> segment_;
  ShmHeader* header_;
  const std::vector<std::vector<int>> host_ranks_;  // the job ranks of each host, by host index
  const std::vector<int> job_ranks_;                // per local rank (this host's)
  const char* what_ = "allreduce";                  // the collective in progress, for errors
  const std::vector<int> pids_;                     // per local rank
  std::vector<int> pidfds_;  // per local rank; -1 for this one, or where pidfd_open is missing
  uint32_t barriers_ = 0;    // barriers this rank has passed
  absl::Status failure_;
  // Small allreduces so far (their parity picks the half of the slots), whether the last
  // allreduce was one (a larger one then waits until every rank has read the slots), and where
  // this rank reduces them.
  uint32_t small_ops_ = 0;
  bool after_small_ = false;
  std::vector<uint64_t> small_result_ = std::vector<uint64_t>(kSmallBytes / sizeof(uint64_t));
};

// Meets the other ranks under `options.prefix` and decides whether they form a group (one per host
// with `across_hosts`). Null (OK) when they are not all on this host (nor spread evenly, with
// `across_hosts`) or the memory cannot be shared somewhere: every rank gets the same answer. An
// error when the rendezvous itself fails (a rank that never showed up: DEADLINE_EXCEEDED), as a
// communicator's would.
absl::StatusOr<std::unique_ptr<ShmGroup>> ConnectShmGroup(ShmGroupOptions options);

}  // namespace ringmaster
