#include "worker/cpu/cpu_executor.h"

#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/half.h"
#include "spdlog/spdlog.h"

namespace ringmaster {
namespace {

// As Horovod scales integers: the factor (postscale / size for an average) in double, the product
// truncated toward zero.
template <typename T>
void ScaleInts(T* p, int64_t n, double factor, int divisor) {
  const double f = factor / divisor;
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(f * static_cast<double>(p[i]));
}

template <typename T>
void ScaleFloats(T* p, int64_t n, double factor) {
  const T f = static_cast<T>(factor);  // in the tensor's own type, so the loop vectorises
  for (int64_t i = 0; i < n; ++i) p[i] *= f;
}

// Multiplies `n` elements by factor / divisor, as Horovod's ScaleBuffer does: integers in double,
// truncated toward zero; float32 and float64 in their own type; float16 and bfloat16 in float32.
void Scale(void* data, int64_t n, DataType dtype, double factor, int divisor) {
  if (factor == 1.0 && divisor == 1) return;
  switch (dtype) {
    case DataType::kUint8:
      ScaleInts(static_cast<uint8_t*>(data), n, factor, divisor);
      break;
    case DataType::kInt8:
      ScaleInts(static_cast<int8_t*>(data), n, factor, divisor);
      break;
    case DataType::kInt32:
      ScaleInts(static_cast<int32_t*>(data), n, factor, divisor);
      break;
    case DataType::kInt64:
      ScaleInts(static_cast<int64_t*>(data), n, factor, divisor);
      break;
    case DataType::kFloat32:
      ScaleFloats(static_cast<float*>(data), n, factor / divisor);
      break;
    case DataType::kFloat64:
      ScaleFloats(static_cast<double*>(data), n, factor / divisor);
      break;
    case DataType::kFloat16: {
      auto* p = static_cast<uint16_t*>(data);
      const float f = static_cast<float>(factor / divisor);
      for (int64_t i = 0; i < n; ++i) p[i] = FloatToHalf(HalfToFloat(p[i]) * f);
      break;
    }
    case DataType::kBfloat16: {
      auto* p = static_cast<uint16_t*>(data);
      const float f = static_cast<float>(factor / divisor);
      for (int64_t i = 0; i < n; ++i) p[i] = FloatToBfloat16(Bfloat16ToFloat(p[i]) * f);
      break;
    }
    case DataType::kUnspecified:
      break;
  }
}

}  // namespace

PartPool::PartPool(int helpers) {
  for (int i = 1; i <= helpers; ++i) threads_.emplace_back([this, i] { Loop(i); });
}

PartPool::~PartPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void PartPool::Run(int parts, absl::FunctionRef<void(int)> part) {
  {
    absl::MutexLock lock(&mu_);
    part_ = &part;
    parts_ = std::min<int>(parts, static_cast<int>(threads_.size()) + 1);
    pending_ = parts_ - 1;
    ++generation_;
  }
  part(0);
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ == 0; };
  mu_.Await(absl::Condition(&done));  // each part is a collective with its own timeout
  part_ = nullptr;
}

void PartPool::Loop(int index) {
  int64_t seen = 0;
  absl::MutexLock lock(&mu_);
  while (true) {
    auto woken = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || generation_ != seen;
    };
    mu_.Await(absl::Condition(&woken));
    if (stopping_) return;
    seen = generation_;
    if (index >= parts_) continue;
    const absl::FunctionRef<void(int)>* part = part_;
    mu_.Unlock();
    (*part)(index);
    mu_.Lock();
    --pending_;
  }
}

CpuExecutor::CpuExecutor(CpuExecutorOptions options) : options_(std::move(options)) {}

absl::Status CpuExecutor::Setup() {
  if (!options_.make_backend) return absl::FailedPreconditionError("no communicators to create");
  for (int i = 0; i < std::max(1, options_.communicators); ++i) {
    absl::StatusOr<std::unique_ptr<Backend>> backend = options_.make_backend(i);
    if (!backend.ok()) {
      backends_.clear();
      return backend.status();
    }
    backends_.push_back(*std::move(backend));
  }
  if (backends_.size() > 1) pool_ = std::make_unique<PartPool>(backends_.size() - 1);
  if (options_.make_host_group && options_.size > 1) {
    absl::StatusOr<std::unique_ptr<ShmGroup>> group = options_.make_host_group();
    if (!group.ok()) {
      backends_.clear();
      return group.status();
    }
    host_group_ = *std::move(group);
    if (host_group_ != nullptr) {
      // From now on Abort reaches the group; an Abort that came during the connection applies.
      absl::MutexLock lock(&abort_mu_);
      abortable_ = host_group_.get();
      if (aborted_.has_value()) host_group_->Abort(*aborted_);
    }
    if (host_group_ != nullptr && options_.local_negotiation &&
        host_group_->local_round_state() != nullptr &&
        host_group_->size() <= LocalRoundState::kMaxRanks) {
      local_rounds_ = std::make_unique<LocalRounds>(host_group_->local_round_state(),
                                                    host_group_->rank(), host_group_->size());
    }
    if (host_group_ != nullptr && host_group_->hosts() > 1) {
      // Hierarchical: local rank i of every host reduces the same slices; they allreduce them
      // among themselves.
      absl::StatusOr<std::unique_ptr<Backend>> cross =
          options_.make_set_backend
              ? options_.make_set_backend(absl::StrCat("cross", host_group_->rank()),
                                          host_group_->host_index(), host_group_->hosts())
              : absl::FailedPreconditionError(
                    "hierarchical allreduce needs process-set communicators");
      if (!cross.ok()) {
        // The host's other ranks may have theirs: fail the group they share, so that none of them
        // waits for this rank. The group lives on until the executor goes (Abort may hold it).
        host_group_->Abort(std::string(cross.status().message()));
        backends_.clear();
        return cross.status();
      }
      cross_ = *std::move(cross);
    }
    if (host_group_ != nullptr && options_.rank == 0) {
      if (cross_ != nullptr) {
        if (options_.hierarchical_allreduce) {
          spdlog::info(
              "allreduce is hierarchical: through shared memory among each host's {} ranks, "
              "then across {} hosts",
              host_group_->size(), host_group_->hosts());
        }
        if (options_.hierarchical_allgather) {
          spdlog::info(
              "allgather is hierarchical: across {} hosts among the ranks of each local index, "
              "then through shared memory among each host's {} ranks",
              host_group_->hosts(), host_group_->size());
        }
      } else {
        spdlog::info("allreduce and allgather go through shared memory among this host's {} ranks",
                     host_group_->size());
      }
    }
  }
  return absl::OkStatus();
}

CpuExecutor::~CpuExecutor() {
  absl::MutexLock lock(&abort_mu_);
  abortable_ = nullptr;
}

void CpuExecutor::Abort(const std::string& why) {
  absl::MutexLock lock(&abort_mu_);
  if (!aborted_.has_value()) aborted_ = why;
  if (abortable_ != nullptr) abortable_->Abort(why);
}

uint8_t* CpuExecutor::Scratch(size_t bytes) {
  fusion_buffer_.resize(std::max(fusion_buffer_.size(), bytes));
  return fusion_buffer_.data();
}

void CpuExecutor::ReleaseProcessSet(int32_t id) {
  const std::string prefix = absl::StrCat("ps", id, "-");
  for (auto it = set_backends_.lower_bound(prefix);
       it != set_backends_.end() && absl::StartsWith(it->first, prefix);) {
    it = set_backends_.erase(it);
  }
  if (released_.size() < kMaxReleased) released_.insert(id);
}

absl::StatusOr<Backend*> CpuExecutor::BackendFor(const Collective& c) {
  if (c.process_set_ranks.empty()) return backends_.front().get();
  if (released_.contains(c.process_set_id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("process set ", c.process_set_id, " was removed"));
  }
  std::string key =
      absl::StrCat("ps", c.process_set_id, "-", absl::StrJoin(c.process_set_ranks, "_"));
  if (auto it = set_backends_.find(key); it != set_backends_.end()) return it->second.get();
  const auto me =
      std::lower_bound(c.process_set_ranks.begin(), c.process_set_ranks.end(), options_.rank);
  if (me == c.process_set_ranks.end() || *me != options_.rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options_.rank, " is not in process set ", c.process_set_id));
  }
  if (!options_.make_set_backend) {
    return absl::UnimplementedError("process sets are not available on this worker");
  }
  if (set_backends_.size() >= kMaxProcessSets) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a rank keeps the communicators of at most ", kMaxProcessSets,
                     " process sets: remove the ones no longer used (hvd.remove_process_set)"));
  }
  absl::StatusOr<std::unique_ptr<Backend>> made =
      options_.make_set_backend(key, static_cast<int>(me - c.process_set_ranks.begin()),
                                static_cast<int>(c.process_set_ranks.size()));
  if (!made.ok()) return made.status();
  Backend* backend = made->get();
  set_backends_[key] = *std::move(made);
  return backend;
}

absl::StatusOr<Executed> CpuExecutor::Execute(const Collective& c, ExecutionTrace& trace) {
  if (backends_.empty()) return absl::FailedPreconditionError("no communicator");
  absl::StatusOr<Backend*> chosen = BackendFor(c);
  if (!chosen.ok()) return chosen.status();
  Backend& backend = **chosen;
  switch (c.type) {
    case Collective::Type::kAllreduce: {
      absl::Status s = Allreduce(c, trace);
      if (!s.ok()) return s;
      return Executed();
    }
    case Collective::Type::kAllgather: {
      absl::StatusOr<Executed> executed = Allgather(c, backend, backend.size());
      trace.End(!HostGroupGathers(c) ? "GLOO_ALLGATHER"
                : cross_ != nullptr  ? "HIERARCHICAL_ALLGATHER"
                                     : "SHM_ALLGATHER");
      return executed;
    }
    case Collective::Type::kBroadcast: {
      const int64_t bytes = c.sizes.empty() ? 0 : c.sizes[0] * DataTypeSize(c.dtype);
      const bool mine = !c.tensors.empty() && c.tensors[0].offset >= 0;
      // A joined rank takes part with scratch memory.
      uint8_t* data = mine ? options_.arena + c.tensors[0].offset : Scratch(bytes);
      // A process set's root is a job rank: its place among the members.
      int root = c.root;
      if (!c.process_set_ranks.empty()) {
        root = static_cast<int>(
            std::lower_bound(c.process_set_ranks.begin(), c.process_set_ranks.end(), c.root) -
            c.process_set_ranks.begin());
      }
      absl::Status s = backend.Broadcast(data, bytes, root);
      trace.End("GLOO_BCAST");
      if (!s.ok()) return s;
      return Executed();
    }
    case Collective::Type::kBarrier: {
      absl::Status s = backend.Barrier();
      trace.End("GLOO_BARRIER");
      if (!s.ok()) return s;
      return Executed();
    }
  }
  return absl::InternalError(absl::StrCat("unknown collective ", static_cast<int>(c.type)));
}

namespace {

// Moves `bytes` between `local` and process `pid`'s memory at `address` (cross-memory attach:
// process_vm_readv/writev, one copy): a tensor of a training process with direct access.
absl::Status RemoteCopy(int pid, uint64_t address, uint8_t* local, size_t bytes, bool read) {
  size_t done = 0;
  while (done < bytes) {
    iovec here{local + done, bytes - done};
    iovec there{reinterpret_cast<void*>(address + done), bytes - done};
    const ssize_t n = read ? process_vm_readv(pid, &here, 1, &there, 1, 0)
                           : process_vm_writev(pid, &here, 1, &there, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot ", read ? "read" : "write", " the training process's tensor (pid ",
                       pid, ", ", bytes, " bytes at 0x", absl::Hex(address),
                       "): ", n < 0 ? std::strerror(errno) : "nothing moved"));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// Copies `bytes` of tensor `t`, from byte `in_tensor` on, to `to`: from the arena, from the
// training process's memory (direct access), or zeros for a joined rank's missing tensor.
absl::Status ReadTensor(const Collective::Tensor& t, const uint8_t* arena, int64_t in_tensor,
                        uint8_t* to, size_t bytes) {
  if (t.address != 0) return RemoteCopy(t.pid, t.address + in_tensor, to, bytes, /*read=*/true);
  if (t.offset >= 0) {
    std::memcpy(to, arena + t.offset + in_tensor, bytes);
  } else {
    std::memset(to, 0, bytes);  // a joined rank contributes zeros
  }
  return absl::OkStatus();
}

// The reverse: `bytes` at `from` into tensor `t` from byte `in_tensor` on (nowhere for a joined
// rank).
absl::Status WriteTensor(const Collective::Tensor& t, uint8_t* arena, int64_t in_tensor,
                         const uint8_t* from, size_t bytes) {
  if (t.address != 0) {
    return RemoteCopy(t.pid, t.address + in_tensor, const_cast<uint8_t*>(from), bytes,
                      /*read=*/false);
  }
  if (t.offset >= 0) std::memcpy(arena + t.offset + in_tensor, from, bytes);
  return absl::OkStatus();
}

}  // namespace

absl::Status CpuExecutor::Allreduce(const Collective& c, ExecutionTrace& trace) {
  const DataType dtype = c.dtype;
  const int64_t elem = DataTypeSize(dtype);
  const size_t n = c.tensors.size();
  std::vector<int64_t> counts(n);
  int64_t total = 0;
  bool contiguous = true;
  for (size_t i = 0; i < n; ++i) {
    counts[i] = i < c.sizes.size() ? c.sizes[i] : 0;
    total += counts[i];
    if (c.tensors[i].offset < 0 || c.tensors[i].address != 0) {
      contiguous = false;
    } else if (i > 0 && c.tensors[i - 1].offset >= 0 &&
               c.tensors[i - 1].offset + counts[i - 1] * elem != c.tensors[i].offset) {
      contiguous = false;
    }
  }
  const bool average = c.average();
  const ReduceOp backend_op = average ? ReduceOp::kSum : c.op;
  // A process set has one communicator, and averages over its members.
  const bool global = c.process_set_ranks.empty();
  const int divisor =
      average ? (global ? options_.size : static_cast<int>(c.process_set_ranks.size())) : 1;
  if (global && host_group_ != nullptr && (cross_ == nullptr || options_.hierarchical_allreduce)) {
    absl::Status s = ShmAllreduce(c, counts, total, backend_op, divisor);
    trace.End(cross_ != nullptr ? "HIERARCHICAL_ALLREDUCE" : "SHM_ALLREDUCE");
    return s;
  }
  uint8_t* buffer;
  const bool packed = !(contiguous && n > 0);
  if (!packed) {
    buffer = options_.arena + c.tensors[0].offset;  // already one buffer: no pack, no unpack
  } else {
    buffer = Scratch(total * elem);
    int64_t at = 0;
    for (size_t i = 0; i < n; ++i) {
      const size_t bytes = counts[i] * elem;
      if (absl::Status s = ReadTensor(c.tensors[i], options_.arena, 0, buffer + at, bytes);
          !s.ok()) {
        return s;
      }
      at += bytes;
    }
    trace.End("MEMCPY_IN_FUSION_BUFFER");
  }
  absl::StatusOr<Backend*> set_backend = BackendFor(c);
  if (!set_backend.ok()) return set_backend.status();
  if (absl::Status s =
          NetworkAllreduce(c, buffer, total, backend_op, divisor, **set_backend, trace);
      !s.ok()) {
    return s;
  }
  if (packed) {
    int64_t at = 0;
    for (size_t i = 0; i < n; ++i) {
      const size_t bytes = counts[i] * elem;
      if (absl::Status s = WriteTensor(c.tensors[i], options_.arena, 0, buffer + at, bytes);
          !s.ok()) {
        return s;
      }
      at += bytes;
    }
    trace.End("MEMCPY_OUT_FUSION_BUFFER");
  }
  return absl::OkStatus();
}

absl::Status CpuExecutor::ShmAllreduce(const Collective& c, const std::vector<int64_t>& counts,
                                       int64_t total, ReduceOp backend_op, int divisor) {
  const DataType dtype = c.dtype;
  const int64_t elem = DataTypeSize(dtype);
  const size_t n = c.tensors.size();
  // Through shared memory, each tensor read straight into the segment and the result written
  // straight back, wherever the tensor is (arena, a training process's memory): no fusion
  // buffer. Scaled in the segment, chunk by chunk, while the data is in cache; hierarchical,
  // each reduced slice is allreduced across hosts before it is scaled.
  auto pieces = [&](int64_t first, int64_t count, auto&& move) -> absl::Status {
    int64_t at = 0;  // where tensor i begins, in elements
    for (size_t i = 0; i < n && at < first + count; at += counts[i], ++i) {
      const int64_t from = std::max(first, at), to = std::min(first + count, at + counts[i]);
      if (from >= to) continue;
      if (absl::Status s = move(c.tensors[i], (from - at) * elem, (from - first) * elem,
                                static_cast<size_t>((to - from) * elem));
          !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  };
  absl::Status s = host_group_->Allreduce(
      total, dtype, backend_op,
      [&](int64_t first, int64_t count, void* slot) {
        return pieces(
            first, count,
            [&](const Collective::Tensor& t, int64_t in_tensor, int64_t in_slot, size_t bytes) {
              return ReadTensor(t, options_.arena, in_tensor, static_cast<uint8_t*>(slot) + in_slot,
                                bytes);
            });
      },
      [&](void* p, int64_t count) { Scale(p, count, dtype, c.prescale, 1); },
      [&](void* p, int64_t count) {
        if (cross_ != nullptr && count > 0) {
          if (absl::Status s = cross_->Allreduce(p, count, dtype, backend_op); !s.ok()) return s;
        }
        Scale(p, count, dtype, c.postscale, divisor);
        return absl::OkStatus();
      },
      [&](int64_t first, int64_t count, const void* reduced) {
        return pieces(
            first, count,
            [&](const Collective::Tensor& t, int64_t in_tensor, int64_t in_slot, size_t bytes) {
              return WriteTensor(t, options_.arena, in_tensor,
                                 static_cast<const uint8_t*>(reduced) + in_slot, bytes);
            });
      });
  return s;
}

absl::Status CpuExecutor::NetworkAllreduce(const Collective& c, uint8_t* buffer, int64_t total,
                                           ReduceOp backend_op, int divisor, Backend& set_backend,
                                           ExecutionTrace& trace) {
  const DataType dtype = c.dtype;
  const int64_t elem = DataTypeSize(dtype);
  const bool global = c.process_set_ranks.empty();
  // One chunk per communicator (the same split on every rank), run concurrently; each chunk is
  // scaled by the thread that reduces it.
  const int parts =
      global && total * elem >= options_.split_bytes ? static_cast<int>(backends_.size()) : 1;
  std::vector<absl::Status> statuses(parts);
  auto run = [&](int part) {
    const int64_t begin = total * part / parts, end = total * (part + 1) / parts;
    uint8_t* data = buffer + begin * elem;
    Scale(data, end - begin, dtype, c.prescale, 1);
    Backend& backend = global ? *backends_[part] : set_backend;
    statuses[part] = backend.Allreduce(data, end - begin, dtype, backend_op);
    if (statuses[part].ok()) Scale(data, end - begin, dtype, c.postscale, divisor);
  };
  if (parts > 1) {
    pool_->Run(parts, run);
  } else {
    run(0);
  }
  trace.End("GLOO_ALLREDUCE");  // failed or not: the timeline shows where the time went
  for (const absl::Status& status : statuses) {
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

absl::StatusOr<Executed> CpuExecutor::Allgather(const Collective& c, Backend& backend, int size) {
  absl::StatusOr<std::vector<AllgatherPart>> parts = PlanAllgather(c, size);
  if (!parts.ok()) return parts.status();
  Executed executed;
  executed.outputs.resize(c.tensors.size());
  // On failure, outputs already allocated for earlier tensors go back to the arena.
  auto fail = [&](const absl::Status& status) {
    for (const Executed::Output& out : executed.outputs) {
      if (out.offset >= 0) options_.outputs->Free(out.offset).IgnoreError();
    }
    return status;
  };
  // An output that does not fit this rank's arena fails this allgather alone: the rank still takes
  // part (gathering into scratch memory), so its peers and the communicator stay in step, and the
  // next collective works.
  absl::Status no_room;
  for (size_t t = 0; t < c.tensors.size(); ++t) {
    const AllgatherPart& part = (*parts)[t];
    const bool mine = c.tensors[t].offset >= 0;
    uint8_t* output;
    int64_t offset = -1;
    if (mine) {
      absl::StatusOr<size_t> allocated = options_.outputs->Allocate(part.total);
      if (!allocated.ok() && no_room.ok()) {
        no_room = FailedAlone(absl::ResourceExhaustedError(
            AllgatherOutputTooLarge(part.total, allocated.status().message())));
      }
      if (allocated.ok()) {
        offset = static_cast<int64_t>(*allocated);
        output = options_.arena + offset;
      } else {
        output = Scratch(part.total);
      }
    } else {
      output = Scratch(part.total);
    }
    const uint8_t* input = mine ? options_.arena + c.tensors[t].offset : output;
    absl::Status status =
        HostGroupGathers(c)
            ? host_group_->Allgatherv(
                  input, output, part.bytes,
                  [&](const void* in, void* out, absl::Span<const int64_t> bytes) -> absl::Status {
                    if (cross_ == nullptr) {
                      return absl::InternalError("no cross-host communicator");
                    }
                    return cross_->Allgatherv(in, out, bytes);
                  })
            : backend.Allgatherv(input, output, part.bytes);
    if (!status.ok()) {
      if (offset >= 0) options_.outputs->Free(offset).IgnoreError();
      return fail(status);
    }
    if (offset >= 0) executed.outputs[t] = GatheredOutput(part, offset);
  }
  if (!no_room.ok()) return fail(no_room);
  return executed;
}

}  // namespace ringmaster
