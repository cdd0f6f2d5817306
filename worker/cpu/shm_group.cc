#include "worker/cpu/shm_group.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/shared_memory.h"
#include "spdlog/spdlog.h"
#include "worker/cpu/futex.h"
#include "worker/cpu/local_rounds.h"
#include "worker/cpu/reduce_kernels.h"

namespace ringmaster {

// The segment's first page. Per-rank barrier counts follow it, a cache line each, then the slots
// and the result buffer, page-aligned.
struct ShmHeader {
  uint64_t magic;
  uint64_t nonce;
  int32_t size;
  int64_t slot_bytes;
  alignas(64) std::atomic<uint32_t> arrivals;  // barrier arrivals of every rank, ever (wraps)
  alignas(64) std::atomic<uint32_t> claimed;   // the first rank to fail claims `why`
  std::atomic<uint32_t> failed;                // 0, or 1 + the rank that failed
  int32_t failed_code;
  char why[1024];
  LocalRoundState rounds;  // local negotiation (local_rounds.h), on one host
};

namespace {

constexpr uint64_t kMagic = 0x52474d5348475270;  // "pRGHSMGR"
constexpr size_t kPage = 4096;
constexpr size_t kLine = 64;
constexpr int kMaxRanks = 1024;
static_assert(sizeof(ShmHeader) <= kPage);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

// Where the slots begin for `size` ranks.
size_t SlotsOffset(int size) {
  return (kPage + kLine * static_cast<size_t>(size) + kPage - 1) / kPage * kPage;
}

size_t SegmentBytes(int size, int64_t slot_bytes) {
  return SlotsOffset(size) + static_cast<size_t>(slot_bytes) * (static_cast<size_t>(size) + 1);
}

std::atomic<uint32_t>* Arrived(uint8_t* segment, int rank) {
  return reinterpret_cast<std::atomic<uint32_t>*>(segment + kPage + kLine * rank);
}

// Whether a rank is in its cross-host step (1) or not (0): in its barrier count's cache line.
std::atomic<uint32_t>* Crossing(uint8_t* segment, int rank) {
  return reinterpret_cast<std::atomic<uint32_t>*>(segment + kPage + kLine * rank +
                                                  sizeof(uint32_t));
}

std::string ReadTrimmed(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return std::string(absl::StripAsciiWhitespace(line));
}

std::string Link(const char* path) {
  char buf[256];
  const ssize_t n = readlink(path, buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// What ranks must share to share memory: one boot of one machine, the same PID namespace (so that
// /proc/<pid> names the peer) and network namespace (a container or a test's host is its own), and
// the same host name. Empty when any part cannot be read.
std::string HostIdentity(const std::string& host) {
  const std::string boot = ReadTrimmed("/proc/sys/kernel/random/boot_id");
  const std::string pid_ns = Link("/proc/self/ns/pid");
  const std::string net_ns = Link("/proc/self/ns/net");
  if (boot.empty() || pid_ns.empty() || net_ns.empty()) return "";
  return absl::StrCat(host, "|", boot, "|", pid_ns, "|", net_ns);
}

int PidfdOpen(int pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

// Opens the segment of rank `leader` (the host's first), announced as "<pid> <fd> <nonce> <bytes>",
// and checks it is the one
// announced.
absl::StatusOr<std::unique_ptr<SharedMemory>> OpenSegment(const std::string& announced, int leader,
                                                          int size, int64_t slot_bytes) {
  std::vector<std::string> parts = absl::StrSplit(announced, ' ');
  int pid = 0, fd = 0;
  uint64_t nonce = 0, bytes = 0;
  if (parts.size() != 4 || !absl::SimpleAtoi(parts[0], &pid) || !absl::SimpleAtoi(parts[1], &fd) ||
      !absl::SimpleAtoi(parts[2], &nonce) || !absl::SimpleAtoi(parts[3], &bytes)) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", leader, " has no segment: ", announced));
  }
  const std::string path = absl::StrCat("/proc/", pid, "/fd/", fd);
  const int mine = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (mine < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open rank ", leader, "'s segment ", path, ": ", std::strerror(errno)));
  }
  absl::StatusOr<std::unique_ptr<SharedMemory>> segment =
      SharedMemory::Map(mine, "ringmaster-shm-group");
  if (!segment.ok()) return segment.status();
  const auto* header = reinterpret_cast<const ShmHeader*>((*segment)->data());
  if ((*segment)->size() != bytes || bytes != SegmentBytes(size, slot_bytes) ||
      header->magic != kMagic || header->nonce != nonce || header->size != size) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is not the segment rank ", leader, " announced"));
  }
  return segment;
}

}  // namespace

ShmGroup::ShmGroup(int rank, int size, int host_index, int64_t slot_bytes, absl::Duration timeout,
                   std::unique_ptr<SharedMemory> segment, std::vector<std::vector<int>> host_ranks,
                   std::vector<int> pids, std::vector<int> pidfds)
    : rank_(rank),
      size_(size),
      hosts_(static_cast<int>(host_ranks.size())),
      host_index_(host_index),
      slot_bytes_(slot_bytes),
      timeout_(timeout),
      segment_(std::move(segment)),
      header_(reinterpret_cast<ShmHeader*>(segment_->data())),
      host_ranks_(std::move(host_ranks)),
      job_ranks_(host_ranks_[host_index_]),
      pids_(std::move(pids)),
      pidfds_(std::move(pidfds)) {}

ShmGroup::~ShmGroup() {
  for (int fd : pidfds_) {
    if (fd >= 0) close(fd);
  }
}

uint8_t* ShmGroup::Slot(int rank) const {
  return segment_->data() + SlotsOffset(size_) + static_cast<size_t>(slot_bytes_) * rank;
}

uint8_t* ShmGroup::Result() const { return Slot(size_); }

int ShmGroup::DeadPeer() const {
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    if (pidfds_[r] >= 0) {
      pollfd p{pidfds_[r], POLLIN, 0};
      if (poll(&p, 1, 0) > 0) return r;  // readable once the process has exited
    } else if (kill(pids_[r], 0) != 0 && errno == ESRCH) {
      return r;
    }
  }
  return -1;
}

absl::Status ShmGroup::Failed() {
  const uint32_t failed = header_->failed.load(std::memory_order_acquire);
  const int by = static_cast<int>(failed) - 1;
  failure_ = absl::Status(static_cast<absl::StatusCode>(header_->failed_code),
                          by == rank_ ? std::string(header_->why)
                                      : absl::StrCat("shared-memory ", what_, " failed on rank ",
                                                     job_ranks_[by], ": ", header_->why));
  return failure_;
}

absl::Status ShmGroup::Fail(absl::Status status) {
  uint32_t unclaimed = 0;
  if (header_->claimed.compare_exchange_strong(unclaimed, 1, std::memory_order_acq_rel)) {
    const std::string why(status.message());
    const size_t n = std::min(why.size(), sizeof(header_->why) - 1);
    std::memcpy(header_->why, why.data(), n);
    header_->why[n] = '\0';
    header_->failed_code = static_cast<int32_t>(status.code());
    header_->failed.store(static_cast<uint32_t>(rank_ + 1), std::memory_order_release);
  }
  FutexWake(header_->arrivals);  // every waiter sleeps on it
  failure_ = std::move(status);
  return failure_;
}

void ShmGroup::Abort(const std::string& why) {
  uint32_t unclaimed = 0;
  if (header_->claimed.compare_exchange_strong(unclaimed, 1, std::memory_order_acq_rel)) {
    const std::string text = absl::StrCat("aborted on rank ", job_ranks_[rank_], ": ", why);
    const size_t n = std::min(text.size(), sizeof(header_->why) - 1);
    std::memcpy(header_->why, text.data(), n);
    header_->why[n] = '\0';
    header_->failed_code = static_cast<int32_t>(absl::StatusCode::kAborted);
    header_->failed.store(static_cast<uint32_t>(rank_ + 1), std::memory_order_release);
  }
  FutexWake(header_->arrivals);
}

LocalRoundState* ShmGroup::local_round_state() const {
  return hosts_ == 1 ? &header_->rounds : nullptr;
}

absl::Status ShmGroup::Barrier() {
  ++barriers_;
  const uint32_t target = barriers_ * static_cast<uint32_t>(size_);
  Arrived(segment_->data(), rank_)->store(barriers_, std::memory_order_relaxed);
  std::atomic<uint32_t>& arrivals = header_->arrivals;
  const uint32_t now = arrivals.fetch_add(1, std::memory_order_acq_rel) + 1;
  if (now == target) {
    FutexWake(arrivals);
    return absl::OkStatus();
  }
  auto reached = [target](uint32_t v) { return static_cast<int32_t>(v - target) >= 0; };
  // Spin first, yielding the core now and then (ranks may outnumber cores): the others are usually
  // microseconds behind, and a futex sleep and wake costs tens of microseconds, every chunk.
  const absl::Time spin_until = absl::Now() + absl::Milliseconds(1);
  for (int i = 1;; ++i) {
    if (reached(arrivals.load(std::memory_order_acquire))) return absl::OkStatus();
    if (header_->failed.load(std::memory_order_relaxed) != 0) return Failed();
    CpuRelax();
    if (i % 64 == 0) {
      if (absl::Now() >= spin_until) break;
      sched_yield();
    }
  }
  const absl::Time deadline = absl::Now() + timeout_;
  absl::Time next_check = absl::Now() + absl::Milliseconds(100);
  while (true) {
    const uint32_t v = arrivals.load(std::memory_order_acquire);
    if (reached(v)) return absl::OkStatus();
    if (header_->failed.load(std::memory_order_acquire) != 0) return Failed();
    const absl::Time t = absl::Now();
    if (t >= next_check) {
      next_check = t + absl::Milliseconds(100);
      if (const int dead = DeadPeer(); dead >= 0) {
        return Fail(absl::UnavailableError(
            absl::StrCat("shared-memory ", what_, " on rank ", job_ranks_[rank_], ": rank ",
                         job_ranks_[dead], "'s worker (pid ", pids_[dead], ") exited")));
      }
      if (t >= deadline) {
        // A rank late in its cross-host step waits for the other hosts: the straggler is there.
        std::vector<int> missing, crossing;
        for (int r = 0; r < size_; ++r) {
          const uint32_t seen = Arrived(segment_->data(), r)->load(std::memory_order_relaxed);
          if (static_cast<int32_t>(seen - barriers_) >= 0) continue;
          (Crossing(segment_->data(), r)->load(std::memory_order_relaxed) != 0 ? crossing : missing)
              .push_back(job_ranks_[r]);
        }
        // The last rank came in just now: the barrier is complete, not late.
        if ((missing.empty() && crossing.empty()) ||
            reached(arrivals.load(std::memory_order_acquire))) {
          continue;
        }
        std::string why = absl::StrCat("shared-memory ", what_, " on rank ", job_ranks_[rank_],
                                       " timed out after ", absl::FormatDuration(timeout_));
        if (!missing.empty())
          absl::StrAppend(&why, " waiting for rank(s) ", absl::StrJoin(missing, ", "));
        if (!crossing.empty()) {
          absl::StrAppend(&why, missing.empty() ? ":" : ";", " rank(s) ",
                          absl::StrJoin(crossing, ", "),
                          " still in the cross-host step, waiting for the ranks of their local "
                          "index on the other hosts");
        }
        return Fail(absl::DeadlineExceededError(why));
      }
    }
    FutexWait(arrivals, v, std::min(absl::Milliseconds(20), next_check - t));
  }
}

absl::Status ShmGroup::Allreduce(void* data, int64_t count, DataType dtype, ReduceOp op,
                                 Finish before, Reduced after) {
  uint8_t* bytes = static_cast<uint8_t*>(data);
  const int64_t elem = DataTypeSize(dtype);
  return Allreduce(
      count, dtype, op,
      [&](int64_t first, int64_t n, void* slot) {
        std::memcpy(slot, bytes + first * elem, static_cast<size_t>(n * elem));
        return absl::OkStatus();
      },
      before, after,
      [&](int64_t first, int64_t n, const void* reduced) {
        std::memcpy(bytes + first * elem, reduced, static_cast<size_t>(n * elem));
        return absl::OkStatus();
      });
}

absl::Status ShmGroup::Cross(absl::FunctionRef<absl::Status()> step) {
  if (hosts_ == 1) return step();
  std::atomic<uint32_t>* crossing = Crossing(segment_->data(), rank_);
  crossing->store(1, std::memory_order_relaxed);
  absl::Status s = step();
  crossing->store(0, std::memory_order_relaxed);
  return s;
}

absl::Status ShmGroup::Begin(const char* what) {
  what_ = what;
  if (!failure_.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared-memory ", what, " refused on rank ", job_ranks_[rank_],
                     ": the group is unusable after an earlier failure: ", failure_.message()));
  }
  if (header_->failed.load(std::memory_order_acquire) != 0) return Failed();
  return absl::OkStatus();
}

absl::Status ShmGroup::Allgatherv(const void* in, void* out, absl::Span<const int64_t> bytes,
                                  Gather across) {
  if (absl::Status s = Begin("allgather"); !s.ok()) return s;
  const int job_size = hosts_ * size_;
  if (static_cast<int>(bytes.size()) != job_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("allgather: ", bytes.size(), " parts for ", job_size, " ranks"));
  }
  std::vector<int64_t> offset(job_size + 1, 0);
  for (int r = 0; r < job_size; ++r) {
    if (bytes[r] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("allgather: rank ", r, "'s part is negative"));
    }
    offset[r + 1] = offset[r] + bytes[r];
  }
  // Local rank i's block: the parts of the job ranks with local index i, host by host.
  std::vector<int64_t> block(size_, 0);
  for (int i = 0; i < size_; ++i) {
    for (int h = 0; h < hosts_; ++h) block[i] += bytes[host_ranks_[h][i]];
  }
  const uint8_t* mine = static_cast<const uint8_t*>(in);
  std::vector<uint8_t> gathered;
  if (hosts_ > 1) {
    std::vector<int64_t> per_host(hosts_);
    for (int h = 0; h < hosts_; ++h) per_host[h] = bytes[host_ranks_[h][rank_]];
    gathered.resize(static_cast<size_t>(block[rank_]));
    absl::Status crossed = Cross([&] { return across(in, gathered.data(), per_host); });
    if (!crossed.ok()) return Fail(std::move(crossed));
    mine = gathered.data();
  }
  uint8_t* const dst = static_cast<uint8_t*>(out);
  // Bytes [lo, hi) of local rank i's block, at `src`, to their places in `out`.
  auto place = [&](int i, int64_t lo, int64_t hi, const uint8_t* src) {
    int64_t at = 0;
    for (int h = 0; h < hosts_; ++h) {
      const int r = host_ranks_[h][i];
      const int64_t from = std::max(lo, at), to = std::min(hi, at + bytes[r]);
      if (from < to) {
        std::memmove(dst + offset[r] + (from - at), src + (from - lo),
                     static_cast<size_t>(to - from));
      }
      at += bytes[r];
    }
  };
  place(rank_, 0, block[rank_], mine);
  const int64_t rounds_bytes = *std::max_element(block.begin(), block.end());
  if (size_ == 1 || rounds_bytes == 0) return absl::OkStatus();
  if (after_small_) {  // a slower rank may still be reading the slots of a small allreduce
    after_small_ = false;
    if (absl::Status s = Barrier(); !s.ok()) return s;
  }
  for (int64_t lo = 0; lo < rounds_bytes; lo += slot_bytes_) {
    const int64_t n = std::clamp<int64_t>(block[rank_] - lo, 0, slot_bytes_);
    if (n > 0) std::memcpy(Slot(rank_), mine + lo, static_cast<size_t>(n));
    if (absl::Status s = Barrier(); !s.ok()) return s;
    for (int i = 0; i < size_; ++i) {
      const int64_t m = std::clamp<int64_t>(block[i] - lo, 0, slot_bytes_);
      if (i != rank_ && m > 0) place(i, lo, lo + m, Slot(i));
    }
    if (absl::Status s = Barrier(); !s.ok()) return s;  // before the slots are written again
  }
  return absl::OkStatus();
}

absl::Status ShmGroup::Allreduce(int64_t count, DataType dtype, ReduceOp op, Load load,
                                 Finish before, Reduced after, Store store) {
  if (absl::Status s = Begin("allreduce"); !s.ok()) return s;
  absl::StatusOr<ReduceFn> reduce = ReduceFunction(dtype, op);
  if (!reduce.ok()) return reduce.status();
  if (count < 0) {
    return absl::InvalidArgumentError(absl::StrCat("allreduce: negative count ", count));
  }
  const int64_t elem = DataTypeSize(dtype);
  if (hosts_ == 1 && count * elem <= std::min(kSmallBytes, slot_bytes_ / 2)) {
    const size_t half = static_cast<size_t>(slot_bytes_ / 2) * (small_ops_++ & 1);
    if (absl::Status s = load(0, count, Slot(rank_) + half); !s.ok()) return Fail(std::move(s));
    before(Slot(rank_) + half, count);
    if (absl::Status s = Barrier(); !s.ok()) return s;
    after_small_ = true;
    uint8_t* const reduced = reinterpret_cast<uint8_t*>(small_result_.data());
    if (size_ == 1) {
      std::memcpy(reduced, Slot(0) + half, static_cast<size_t>(count * elem));
    } else {
      (*reduce)(reduced, Slot(0) + half, Slot(1) + half, count);
      for (int r = 2; r < size_; ++r) (*reduce)(reduced, reduced, Slot(r) + half, count);
    }
    if (absl::Status s = after(reduced, count); !s.ok()) return Fail(std::move(s));
    if (absl::Status s = store(0, count, reduced); !s.ok()) {
      failure_ = s;
      return s;
    }
    return absl::OkStatus();
  }
  // A slower rank may still be reading the slots of the small allreduce before.
  if (after_small_) {
    after_small_ = false;
    if (absl::Status s = Barrier(); !s.ok()) return s;
  }
  // Slices start on cache lines, so that no two ranks write one line of the result.
  const int64_t align = std::max<int64_t>(1, static_cast<int64_t>(kLine) / elem);
  const int64_t chunk = slot_bytes_ / elem / align * align;
  uint8_t* const mine = Slot(rank_);
  uint8_t* const result = Result();
  for (int64_t done = 0; done < count; done += chunk) {
    const int64_t m = std::min(chunk, count - done);
    if (absl::Status s = load(done, m, mine); !s.ok()) return Fail(std::move(s));
    before(mine, m);
    if (absl::Status s = Barrier(); !s.ok()) return s;
    // This rank's slice of the chunk, in ranks' order, so that every run adds alike.
    const int64_t lo = std::min(m, m * rank_ / size_ / align * align);
    const int64_t hi =
        rank_ + 1 == size_ ? m : std::min(m, m * (rank_ + 1) / size_ / align * align);
    if (hi > lo) {
      const size_t at = static_cast<size_t>(lo * elem);
      const size_t n = static_cast<size_t>(hi - lo);
      if (size_ == 1) {
        std::memcpy(result + at, Slot(0) + at, n * elem);
      } else {
        (*reduce)(result + at, Slot(0) + at, Slot(1) + at, n);
        for (int r = 2; r < size_; ++r) (*reduce)(result + at, result + at, Slot(r) + at, n);
      }
    }
    // Every rank calls it, an empty slice too, so that the ranks of one local index across hosts
    // stay in step.
    absl::Status crossed = Cross([&] { return after(result + lo * elem, hi - lo); });
    if (!crossed.ok()) return Fail(std::move(crossed));
    if (absl::Status s = Barrier(); !s.ok()) return s;
    if (absl::Status s = store(done, m, result); !s.ok()) {
      failure_ = s;
      return s;
    }
  }
  return absl::OkStatus();
}

namespace {

// Where every rank of the job is: hosts numbered by their lowest rank, a host's ranks in rank
// order, and this rank's host and place on it.
struct HostLayout {
  std::vector<std::vector<int>> ranks;  // by host index
  int host_index = 0;
  int local_rank = 0;
  const std::vector<int>& members() const { return ranks[host_index]; }
  int local_size() const { return static_cast<int>(members().size()); }
  int hosts() const { return static_cast<int>(ranks.size()); }
};

std::vector<std::string> RankKeys(const std::string& prefix, const std::string& what, int size) {
  std::vector<std::string> k;
  for (int r = 0; r < size; ++r) k.push_back(absl::StrCat(prefix, what, "/", r));
  return k;
}

absl::StatusOr<HostLayout> MeetHosts(const ShmGroupOptions& options, KeyValueStore& store) {
  const int rank = options.rank, size = options.size;
  std::string identity = HostIdentity(options.host);
  if (identity.empty()) identity = absl::StrCat("unknown host of rank ", rank);
  const std::vector<std::string> keys = RankKeys(options.prefix, "host", size);
  if (absl::Status s = store.Set(keys[rank], identity); !s.ok()) return s;
  absl::StatusOr<std::vector<std::string>> where = store.Wait(keys, options.timeout);
  if (!where.ok()) return where.status();
  std::vector<std::string> host_ids;  // by host index
  HostLayout layout;
  for (int r = 0; r < size; ++r) {
    const auto it = std::find(host_ids.begin(), host_ids.end(), (*where)[r]);
    if (it == host_ids.end()) {
      host_ids.push_back((*where)[r]);
      layout.ranks.push_back({r});
    } else {
      layout.ranks[it - host_ids.begin()].push_back(r);
    }
  }
  layout.host_index =
      static_cast<int>(std::find(host_ids.begin(), host_ids.end(), identity) - host_ids.begin());
  const std::vector<int>& members = layout.members();
  layout.local_rank =
      static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
  return layout;
}

// Whether the hosts' groups can work hierarchically: asked for, two ranks or more per host, and
// as many on every host.
bool HierarchyHolds(const ShmGroupOptions& options, const HostLayout& layout) {
  if (!options.across_hosts || layout.local_size() < 2) return false;
  for (const std::vector<int>& on_host : layout.ranks) {
    if (static_cast<int>(on_host.size()) != layout.local_size()) {
      if (options.rank == 0) {
        spdlog::warn(
            "hosts run different numbers of ranks; allreduce and allgather are not "
            "hierarchical");
      }
      return false;
    }
  }
  return true;
}

// The host's first rank makes the segment and announces it; the others open it. `attached`: "ok",
// or why this rank has no segment.
absl::StatusOr<std::unique_ptr<SharedMemory>> MakeOrOpenSegment(const ShmGroupOptions& options,
                                                                KeyValueStore& store,
                                                                const HostLayout& layout,
                                                                int64_t slot_bytes,
                                                                std::string* attached) {
  const size_t bytes = SegmentBytes(layout.local_size(), slot_bytes);
  const std::string segment_key = absl::StrCat(options.prefix, "segment/", layout.host_index);
  *attached = "ok";
  if (layout.local_rank == 0) {
    absl::StatusOr<std::unique_ptr<SharedMemory>> made =
        SharedMemory::Create("ringmaster-shm-group", bytes);
    std::string announced;
    std::unique_ptr<SharedMemory> segment;
    if (made.ok()) {
      segment = *std::move(made);
      auto* header = new (segment->data()) ShmHeader();
      header->magic = kMagic;
      header->nonce = 0;
      getrandom(&header->nonce, sizeof(header->nonce), 0);  // tells this segment from a stale one
      header->size = layout.local_size();
      header->slot_bytes = slot_bytes;
      announced = absl::StrCat(getpid(), " ", segment->fd(), " ", header->nonce, " ", bytes);
    } else {
      *attached = announced = absl::StrCat("none: ", made.status().message());
    }
    if (absl::Status s = store.Set(segment_key, announced); !s.ok()) return s;
    return segment;
  }
  absl::StatusOr<std::vector<std::string>> announced = store.Wait({segment_key}, options.timeout);
  if (!announced.ok()) return announced.status();
  absl::StatusOr<std::unique_ptr<SharedMemory>> opened =
      OpenSegment(announced->front(), layout.members()[0], layout.local_size(), slot_bytes);
  if (opened.ok()) return *std::move(opened);
  *attached = std::string(opened.status().message());
  return nullptr;
}

// Every rank of the job hears whether every host's group formed: all or none. The ranks' pids,
// or an empty vector when some rank has no segment.
absl::StatusOr<std::vector<int>> AgreeAllAttached(const ShmGroupOptions& options,
                                                  KeyValueStore& store, std::string attached) {
  const int rank = options.rank, size = options.size;
  if (attached == "ok") attached = absl::StrCat("ok ", getpid());
  const std::vector<std::string> keys = RankKeys(options.prefix, "attached", size);
  if (absl::Status s = store.Set(keys[rank], attached); !s.ok()) return s;
  absl::StatusOr<std::vector<std::string>> all = store.Wait(keys, options.timeout);
  if (!all.ok()) return all.status();
  std::vector<int> pids(size);
  for (int r = 0; r < size; ++r) {
    const std::string& a = (*all)[r];
    if (!absl::StartsWith(a, "ok ") || !absl::SimpleAtoi(a.substr(3), &pids[r])) {
      if (rank == 0) {
        spdlog::warn(
            "ranks share a host but not memory (rank {}: {}); the network carries "
            "allreduce",
            r, a);
      }
      return std::vector<int>();
    }
  }
  return pids;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShmGroup>> ConnectShmGroup(ShmGroupOptions options) {
  const int rank = options.rank, size = options.size;
  if (size < 1 || size > kMaxRanks || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared-memory group: rank ", rank, " of size ", size));
  }
  if (options.store == nullptr) {
    return absl::InvalidArgumentError("shared-memory group: no rendezvous store");
  }
  KeyValueStore& store = *options.store;
  // 1. Where is every rank?
  absl::StatusOr<HostLayout> layout = MeetHosts(options, store);
  if (!layout.ok()) return layout.status();
  const int hosts = layout->hosts();
  const int local_size = layout->local_size();
  if (hosts > 1 && !HierarchyHolds(options, *layout)) return nullptr;
  // Larger chunks across hosts: each carries one allreduce per local rank over the network.
  int64_t slot_bytes = options.slot_bytes;
  if (slot_bytes <= 0) {
    slot_bytes = hosts > 1 ? std::clamp<int64_t>((int64_t{64} << 20) / local_size,
                                                 int64_t{256} << 10, int64_t{32} << 20)
                           : std::clamp<int64_t>((int64_t{8} << 20) / local_size, int64_t{64} << 10,
                                                 int64_t{1} << 20);
  }
  slot_bytes = (slot_bytes + kLine - 1) / static_cast<int64_t>(kLine) * kLine;
  // 2. The host's first rank makes the segment; the others open it.
  std::string attached;
  absl::StatusOr<std::unique_ptr<SharedMemory>> segment =
      MakeOrOpenSegment(options, store, *layout, slot_bytes, &attached);
  if (!segment.ok()) return segment.status();
  // 3. All or none.
  absl::StatusOr<std::vector<int>> pids = AgreeAllAttached(options, store, attached);
  if (!pids.ok()) return pids.status();
  if (pids->empty()) return nullptr;
  const std::vector<int>& members = layout->members();
  std::vector<int> local_pids(local_size), pidfds(local_size, -1);
  for (int i = 0; i < local_size; ++i) {
    local_pids[i] = (*pids)[members[i]];
    if (i != layout->local_rank) pidfds[i] = PidfdOpen(local_pids[i]);
  }
  // Every host's ranks, not only this one's: an allgather across hosts places their parts.
  return std::unique_ptr<ShmGroup>(new ShmGroup(
      layout->local_rank, local_size, layout->host_index, slot_bytes, options.timeout,
      *std::move(segment), std::move(layout->ranks), std::move(local_pids), std::move(pidfds)));
}

}  // namespace ringmaster
