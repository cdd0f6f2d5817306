#include "ringmaster/client.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/client_internal.h"
#include "client/staging.h"
#include "common/framing.h"
#include "common/shared_memory.h"
#include "common/tensor.h"
#include "ringmaster/v1/local.pb.h"

namespace ringmaster {
namespace {

absl::StatusOr<int> Dial(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path '", path, "' is too long"));
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  timeval send_timeout{10, 0};  // every write has a deadline, even to a wedged daemon
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof(send_timeout));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    absl::Status s = absl::UnavailableError(
        absl::StrCat("cannot connect to the worker at ", path, ": ", std::strerror(errno)));
    close(fd);
    return s;
  }
  return fd;
}

// How long a tensor to stage waits for arena memory held by operations in flight.
constexpr absl::Duration kArenaWait = absl::Seconds(60);

// The stream each thread set with SetCudaStream, and for which client.
struct ThreadStream {
  const void* client = nullptr;
  void* stream = nullptr;
};
thread_local ThreadStream thread_stream;

// The process set each thread set with SetProcessSet, and for which client.
struct ThreadProcessSet {
  const void* client = nullptr;
  int32_t id = 0;
  std::vector<int32_t> ranks;
};
thread_local ThreadProcessSet thread_process_set;

class ClientImpl : public Client {
 public:
  // `arena`: the host arena (mapped on GPU slots too); `staging`: where tensors are staged (the
  // host arena, or the device's).
  ClientImpl(int fd, const v1::LocalWelcome& welcome, std::unique_ptr<SharedMemory> arena,
             std::unique_ptr<Staging> staging)
      : fd_(fd),
        arena_(std::move(arena)),
        staging_(std::move(staging)),
        base_(staging_->base()),
        allocator_(staging_->allocator()) {
    topology_.device = staging_->device();
    topology_.job_id = welcome.job_id();
    topology_.epoch = welcome.epoch();
    direct_access_ = welcome.direct_access() && welcome.device() == 0;
    topology_.direct_access = direct_access_;
    topology_.rank = welcome.rank();
    topology_.size = welcome.size();
    topology_.local_rank = welcome.local_rank();
    topology_.local_size = welcome.local_size();
    topology_.cross_rank = welcome.cross_rank();
    topology_.cross_size = welcome.cross_size();
    topology_.host = welcome.host();
    topology_.arena_bytes = static_cast<size_t>(welcome.client_bytes());
    reader_ = std::thread([this] { ReadLoop(); });
  }

  ~ClientImpl() override { Shutdown(); }

  const Topology& topology() const override { return topology_; }
  bool hosts_updated() const override { return hosts_updated_.load(std::memory_order_relaxed); }

  void* Allocate(size_t bytes) override {
    absl::StatusOr<size_t> offset = AllocateArena(bytes, /*wait=*/false);
    return offset.ok() ? base_ + *offset : nullptr;
  }

  void Free(void* data) override {
    if (data == nullptr) return;
    staging_->Release(static_cast<size_t>(static_cast<uint8_t*>(data) - base_), CurrentStream());
  }

  void SetCudaStream(void* stream) override { thread_stream = {this, stream}; }
  void SetProcessSet(int32_t id, std::vector<int32_t> ranks) override {
    thread_process_set = {this, id, std::move(ranks)};
  }

  absl::StatusOr<Handle> AllreduceAsync(const std::string& name, void* data, DataType dtype,
                                        absl::Span<const int64_t> shape, ReduceOp op,
                                        double prescale, double postscale) override {
    v1::TensorRequest r = Request(name, v1::REQUEST_TYPE_ALLREDUCE, dtype, shape);
    r.set_reduce_op(static_cast<v1::ReduceOp>(op));
    r.set_prescale_factor(prescale);
    r.set_postscale_factor(postscale);
    return Submit(std::move(r), data, /*copy_out=*/true);
  }

  absl::StatusOr<std::vector<Handle>> GroupedAllreduceAsync(
      const std::vector<std::string>& names, const std::vector<void*>& data, DataType dtype,
      const std::vector<std::vector<int64_t>>& shapes, ReduceOp op, double prescale,
      double postscale, int32_t reserved_group) override {
    if (names.empty() || names.size() != data.size() || names.size() != shapes.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("grouped allreduce needs as many names, tensors and shapes (got ",
                       names.size(), ", ", data.size(), ", ", shapes.size(), ")"));
    }
    // Every member must fit in the arena at once (they complete together): refuse up front rather
    // than after submitting some of them.
    size_t staged = 0;
    for (size_t i = 0; i < names.size(); ++i) {
      int64_t count = 1;
      for (int64_t d : shapes[i]) count *= d;
      const size_t bytes = static_cast<size_t>(std::max<int64_t>(0, count * DataTypeSize(dtype)));
      if (!direct_access_ && !staging_->InArena(data[i], bytes)) {
        staged += (bytes + ArenaAllocator::kAlignment - 1) / ArenaAllocator::kAlignment *
                  ArenaAllocator::kAlignment;
      }
    }
    if (staged > allocator_.end()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "shared arena full: the grouped allreduce needs ", staged,
          " bytes staged at once; the arena holds ", allocator_.end(),
          " bytes for this process: start the workers with a larger --arena-mb (ringmaster local "
          "--arena-mb)"));
    }
    const int32_t group = reserved_group > 0 ? reserved_group : ReserveGroup();
    std::vector<Handle> handles;
    for (size_t i = 0; i < names.size(); ++i) {
      v1::TensorRequest r = Request(names[i], v1::REQUEST_TYPE_ALLREDUCE, dtype, shapes[i]);
      r.set_reduce_op(static_cast<v1::ReduceOp>(op));
      r.set_prescale_factor(prescale);
      r.set_postscale_factor(postscale);
      r.set_group_id(group);
      r.set_group_size(static_cast<int32_t>(names.size()));
      absl::StatusOr<Handle> h = Submit(std::move(r), data[i], /*copy_out=*/true);
      if (!h.ok()) return h.status();
      handles.push_back(*h);
    }
    return handles;
  }

  absl::StatusOr<Handle> BroadcastAsync(const std::string& name, void* data, DataType dtype,
                                        absl::Span<const int64_t> shape, int root) override {
    v1::TensorRequest r = Request(name, v1::REQUEST_TYPE_BROADCAST, dtype, shape);
    r.set_root_rank(root);
    return Submit(std::move(r), data, /*copy_out=*/true);
  }

  absl::StatusOr<Handle> AllgatherAsync(const std::string& name, const void* data, DataType dtype,
                                        absl::Span<const int64_t> shape) override {
    return Submit(Request(name, v1::REQUEST_TYPE_ALLGATHER, dtype, shape), const_cast<void*>(data),
                  /*copy_out=*/false);
  }

  int32_t ReserveGroup() override { return static_cast<int32_t>(++groups_); }

  bool Poll(Handle handle) override {
    absl::MutexLock lock(&mu_);
    auto it = ops_.find(handle);
    return it == ops_.end() || it->second.done;
  }

  absl::Status Wait(Handle handle, absl::Duration timeout) override {
    void* op_stream = nullptr;
    absl::Status status = WaitLocked(handle, timeout, &op_stream);
    // GPU: the result is ordered on the stream the operation was submitted on; a caller waiting on
    // another stream (another thread, or the stream changed) has its stream wait for that one.
    if (status.ok() && op_stream != CurrentStream()) {
      status = staging_->JoinStreams(op_stream, CurrentStream());
    }
    return status;
  }

  absl::Status WaitLocked(Handle handle, absl::Duration timeout, void** op_stream) {
    absl::MutexLock lock(&mu_);
    auto it = ops_.find(handle);
    if (it == ops_.end()) {
      return absl::NotFoundError(absl::StrCat("no operation in flight with handle ", handle));
    }
    Op* op = &it->second;
    auto done = [op]() { return op->done; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&done), timeout)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "operation '", op->name, "' did not complete within ", absl::FormatDuration(timeout)));
    }
    it = ops_.find(handle);  // another waiter on the same handle may have taken it
    if (it == ops_.end()) {
      return absl::NotFoundError(absl::StrCat("no operation in flight with handle ", handle));
    }
    *op_stream = it->second.stream;
    return TakeLocked(handle);
  }

  absl::Status Then(Handle handle, std::function<void(absl::Status)> done) override {
    absl::Status status;
    {
      absl::MutexLock lock(&mu_);
      auto it = ops_.find(handle);
      if (it == ops_.end()) {
        return absl::NotFoundError(absl::StrCat("no operation in flight with handle ", handle));
      }
      if (!it->second.done) {
        it->second.then = std::move(done);
        return absl::OkStatus();
      }
      status = TakeLocked(handle);
    }
    done(std::move(status));
    return absl::OkStatus();
  }

  // A completed operation's status; its allgather output goes to gathered_, and it is forgotten.
  absl::Status TakeLocked(Handle handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = ops_.find(handle);
    Op& op = it->second;
    absl::Status status = op.status;
    if (op.allgather && status.ok()) gathered_[it->first] = std::move(op.gathered);
    last_joined_rank_ = op.last_joined_rank;
    ops_.erase(it);
    return status;
  }

  absl::StatusOr<AllgatherOutput> TakeAllgather(Handle handle) override {
    absl::MutexLock lock(&mu_);
    auto it = gathered_.find(handle);
    if (it == gathered_.end()) {
      return absl::NotFoundError(absl::StrCat("no completed allgather with handle ", handle));
    }
    AllgatherOutput out = std::move(it->second);
    gathered_.erase(it);
    return out;
  }

  absl::StatusOr<int> Join() override {
    absl::StatusOr<Handle> h = JoinAsync();
    if (!h.ok()) return h.status();
    if (absl::Status s = Wait(*h, absl::InfiniteDuration()); !s.ok()) return s;
    return last_joined_rank();
  }

  absl::StatusOr<Handle> JoinAsync() override {
    v1::TensorRequest r;
    r.set_name(absl::StrCat("join.", ++joins_));
    r.set_type(v1::REQUEST_TYPE_JOIN);
    return Submit(std::move(r), nullptr, false);
  }

  int last_joined_rank() const override {
    absl::MutexLock lock(&mu_);
    return last_joined_rank_;
  }

  absl::Status ReleaseProcessSet(int32_t id) override {
    absl::StatusOr<Handle> h = ReleaseProcessSetAsync(id);
    if (!h.ok()) return h.status();
    return Wait(*h, absl::InfiniteDuration());
  }

  absl::StatusOr<Handle> ReleaseProcessSetAsync(int32_t id) override {
    if (id <= 0) return absl::InvalidArgumentError(absl::StrCat("process set id ", id));
    v1::TensorRequest r;
    r.set_name(absl::StrCat(kReleaseProcessSetPrefix, id));
    r.set_type(v1::REQUEST_TYPE_BARRIER);
    return Submit(std::move(r), nullptr, false);
  }

  absl::Status Barrier() override {
    absl::StatusOr<Handle> h = BarrierAsync();
    if (!h.ok()) return h.status();
    return Wait(*h, absl::InfiniteDuration());
  }

  absl::StatusOr<Handle> BarrierAsync() override {
    v1::TensorRequest r;
    // Counted per process set: a set's barriers are its members' alone.
    const int32_t set = thread_process_set.client == this ? thread_process_set.id : 0;
    int64_t n;
    {
      absl::MutexLock lock(&mu_);
      n = ++barriers_[set];
    }
    r.set_name(set == 0 ? absl::StrCat("barrier.", n) : absl::StrCat("barrier.ps", set, ".", n));
    r.set_type(v1::REQUEST_TYPE_BARRIER);
    return Submit(std::move(r), nullptr, false);
  }

  void Shutdown() override {
    {
      absl::MutexLock lock(&mu_);
      if (closed_) {
        if (!reader_.joinable()) return;
      }
      closed_ = true;
    }
    shutdown(fd_, SHUT_RDWR);
    if (reader_.joinable()) reader_.join();
    close(fd_);
    FailAll(absl::CancelledError("the client shut down"));
  }

 private:
  struct Op {
    std::string name;
    bool done = false;
    absl::Status status;
    void* user = nullptr;  // where the caller's tensor is
    size_t offset = 0;     // where it is in the arena
    uint64_t address = 0;  // direct access: the caller's tensor, read and written by the daemon
    size_t bytes = 0;
    bool staged = false;        // copied into the arena: copy back and free on completion
    bool user_on_host = false;  // GPU slot, staged from host memory: the copy back is waited for
    bool copy_out = false;
    bool allgather = false;
    int64_t elem = 0;
    AllgatherOutput gathered;
    int last_joined_rank = -1;
    std::function<void(absl::Status)> then;  // Then()'s callback, called once it is done
    int ready_slot = -1;                     // GPU: the ready event in use until completion
    int32_t group = 0;                       // grouped allreduce: its group id
    void* stream = nullptr;  // GPU: the caller's stream at submission (cudaStream_t)
  };

  static v1::TensorRequest Request(const std::string& name, v1::RequestType type, DataType dtype,
                                   absl::Span<const int64_t> shape) {
    v1::TensorRequest r;
    r.set_name(name);
    r.set_type(type);
    r.set_dtype(static_cast<v1::DataType>(dtype));
    for (int64_t d : shape) r.add_shape(d);
    r.set_device(-1);
    return r;
  }

  absl::StatusOr<Handle> Submit(v1::TensorRequest request, void* data, bool copy_out) {
    const int64_t elem = DataTypeSize(static_cast<DataType>(request.dtype()));
    int64_t count = 1;
    for (int64_t d : request.shape()) count *= d;
    const size_t bytes = static_cast<size_t>(std::max<int64_t>(0, count * elem));
    Op op;
    op.name = request.name();
    op.user = data;
    op.bytes = bytes;
    op.copy_out = copy_out;
    op.elem = elem;
    op.allgather = request.type() == v1::REQUEST_TYPE_ALLGATHER;
    op.group = request.group_id();
    op.stream = CurrentStream();
    std::unique_ptr<Staging::DeviceScope> scope = staging_->EnterDevice();
    const bool direct = direct_access_ && request.type() == v1::REQUEST_TYPE_ALLREDUCE;
    if (data != nullptr && staging_->InArena(data, bytes)) {
      op.offset = static_cast<size_t>(static_cast<const uint8_t*>(data) - base_);  // zero copy
    } else if (data != nullptr && direct) {
      op.address = reinterpret_cast<uint64_t>(data);  // the daemon reads and writes it there
    } else if (data != nullptr) {
      absl::StatusOr<size_t> offset = AllocateArena(bytes, /*wait=*/true, request.group_id());
      if (!offset.ok()) return offset.status();
      op.offset = *offset;
      op.staged = true;
      op.user_on_host = staging_->HostMemory(data);
      if (absl::Status s = staging_->Copy(base_ + op.offset, data, bytes, op.stream,
                                          "staging a tensor into the arena", /*wait=*/false);
          !s.ok()) {
        allocator_.Free(op.offset).IgnoreError();
        return s;
      }
    }
    v1::LocalRequest m;
    v1::LocalEnqueue* e = m.mutable_enqueue();
    request.set_device(staging_->device());
    // A join is the job's (Horovod's join knows no process sets).
    if (thread_process_set.client == this && thread_process_set.id != 0 &&
        request.type() != v1::REQUEST_TYPE_JOIN) {
      request.set_process_set_id(thread_process_set.id);
      for (int32_t r : thread_process_set.ranks) request.add_process_set_ranks(r);
    }
    absl::StatusOr<int> slot = staging_->RecordReady(op.stream);
    if (!slot.ok()) {
      if (op.staged) staging_->Release(op.offset, op.stream);  // once the staging copy is done
      return slot.status();
    }
    op.ready_slot = *slot;
    e->set_ready_event(*slot + 1);  // 1-based; 0: none
    *e->mutable_request() = std::move(request);
    e->set_offset(static_cast<int64_t>(op.offset));
    e->set_address(op.address);
    Handle handle = 0;
    bool closed = false;
    {
      absl::MutexLock lock(&mu_);
      closed = closed_;
      if (!closed) {
        handle = next_handle_++;
        e->set_handle(handle);
        ops_[handle] = std::move(op);
      }
    }
    if (closed) {
      staging_->ReadyDone(op.ready_slot);
      if (op.staged) staging_->Release(op.offset, op.stream);
      return absl::UnavailableError("the connection to the worker is closed");
    }
    absl::Status written;
    {
      absl::MutexLock write_lock(&write_mu_);
      written = WriteFrame(fd_, m);
    }
    if (!written.ok()) {
      // A partial frame may be on the socket: the stream is unusable. The reader then fails
      // everything in flight.
      shutdown(fd_, SHUT_RDWR);
      absl::MutexLock lock(&mu_);
      ops_.erase(handle);
      return absl::UnavailableError(absl::StrCat("cannot reach the worker: ", written.message()));
    }
    return handle;
  }

  void ReadLoop() {
    // Completions queue stream waits and copies from this thread: on the slot's device.
    staging_->BindThread();
    v1::LocalReply reply;
    absl::Status status;
    while ((status = ReadFrame(fd_, &reply)).ok()) {
      if (reply.kind_case() != v1::LocalReply::kCompletion) continue;
      Complete(reply.completion());
    }
    FailAll(absl::UnavailableError(
        absl::StrCat("the worker daemon closed the connection (", status.message(), ")")));
  }

  void Complete(const v1::LocalCompletion& c) {
    if (c.hosts_updated()) hosts_updated_.store(true, std::memory_order_relaxed);
    Op* op;
    {
      absl::MutexLock lock(&mu_);
      auto it = ops_.find(c.handle());
      if (it == ops_.end() || it->second.done) return;
      // Stable (node-based map), and only Wait() erases it, once it is done; FailAll() runs on
      // this thread or after it has been joined.
      op = &it->second;
    }
    staging_->ReadyDone(op->ready_slot);
    // Copies and stream waits (for an allgather output, a CUDA synchronisation) with mu_ released,
    // so other threads' enqueues and waits go on meanwhile.
    absl::Status status(static_cast<absl::StatusCode>(c.code()), c.message());
    absl::Status waited = staging_->WaitDone(c.done_event(), op->stream);
    if (status.ok()) status = waited;
    AllgatherOutput gathered;
    std::function<void(absl::Status)> then;
    absl::Status then_status;
    int64_t release_offset = -1;
    if (status.ok() && op->allgather) {
      gathered.shape.assign(c.output_shape().begin(), c.output_shape().end());
      int64_t n = op->elem;
      for (int64_t d : gathered.shape) n *= d;
      gathered.data.resize(static_cast<size_t>(n));
      status = staging_->Copy(gathered.data.data(), base_ + c.output_offset(),
                              static_cast<size_t>(n), op->stream, "copying an allgather output",
                              /*wait=*/true);
      release_offset = c.output_offset();
    }
    const bool free_staged = op->staged && (status.ok() || staging_->ReusableAfterFailure());
    if (free_staged) {
      // GPU: reusable once the copy out queued on the op's stream is done (ReleaseAfter). After a
      // failure the memory stays allocated: the daemon may still write it (as in FailAll).
      if (status.ok() && op->copy_out) {
        // Into host memory (a CPU tensor on a GPU slot) the copy is complete before the operation
        // is: the caller reads it on the CPU, with no stream to order it (a copy into pinned memory
        // would otherwise still be in flight).
        status = staging_->Copy(op->user, base_ + op->offset, op->bytes, op->stream,
                                "copying a result out of the arena", /*wait=*/op->user_on_host);
      }
      staging_->Release(op->offset, op->stream);
    }
    {
      absl::MutexLock lock(&mu_);
      op->status = status;
      op->gathered = std::move(gathered);
      if (free_staged) {
        op->staged = false;
        ++releases_;
      }
      op->last_joined_rank = c.last_joined_rank();
      op->done = true;
      if (op->then) {
        then = std::move(op->then);
        then_status = TakeLocked(c.handle());  // op is gone from here on
      }
    }
    if (then) then(std::move(then_status));
    if (release_offset >= 0) {
      // Give the daemon its output memory back (the write may block: no lock but the writer's).
      v1::LocalRequest release;
      release.mutable_release()->set_offset(release_offset);
      absl::MutexLock write_lock(&write_mu_);
      WriteFrame(fd_, release).IgnoreError();
    }
  }

  // This thread's stream (SetCudaStream), nullptr (the legacy default stream) if it set none.
  void* CurrentStream() const {
    return thread_stream.client == this ? thread_stream.stream : nullptr;
  }

  // Arena memory (for the caller, or a staged tensor). GPU: released memory whose last use on its
  // stream is done is reclaimed first; when the arena is full, the pending releases are waited for,
  // then it is tried again. With `wait` (staging), a full arena waits for the tensors staged in
  // flight to come back (their operations complete), up to kArenaWait: a model whose tensors do
  // not all fit at once still trains, a little slower.
  absl::StatusOr<size_t> AllocateArena(size_t bytes, bool wait, int32_t own_group = 0) {
    auto full = [&](absl::string_view why) {
      return absl::ResourceExhaustedError(
          absl::StrCat("shared arena full: ", bytes, " bytes requested", why, "; the arena holds ",
                       allocator_.end(),
                       " bytes for this process: start the workers with a larger --arena-mb "
                       "(ringmaster local --arena-mb)"));
    };
    if (bytes > allocator_.end()) return full(", more than the whole arena");
    const absl::Time deadline = absl::Now() + kArenaWait;
    while (true) {
      const int64_t seen = releases_.load();
      staging_->Reclaim(/*wait=*/false);
      absl::StatusOr<size_t> offset = allocator_.Allocate(bytes);
      if (offset.ok()) return offset;
      if (staging_->Reclaim(/*wait=*/true)) continue;  // something came back: try again
      if (!wait) return offset;
      absl::MutexLock lock(&mu_);
      if (closed_) return absl::UnavailableError("the connection to the worker is closed");
      if (releases_ != seen) continue;  // memory came back meanwhile: try again
      // Only other operations give memory back: a group's own members complete together.
      const bool in_flight = std::any_of(ops_.begin(), ops_.end(), [&](const auto& entry) {
        const Op& op = entry.second;
        return op.staged && !op.done && (own_group == 0 || op.group != own_group);
      });
      if (!in_flight) return full(absl::StrCat(", ", offset.status().message()));
      if (absl::Now() >= deadline) {
        return full(absl::StrCat(" and none came back in ", absl::FormatDuration(kArenaWait),
                                 " from the operations in flight"));
      }
      // Staged memory comes back as operations complete (Complete counts releases).
      auto released = [&] { return releases_ != seen || closed_; };
      mu_.AwaitWithTimeout(absl::Condition(&released), absl::Milliseconds(20));
    }
  }

  void FailAll(const absl::Status& status) {
    std::vector<std::function<void(absl::Status)>> thens;
    {
      absl::MutexLock lock(&mu_);
      closed_ = true;
      for (auto it = ops_.begin(); it != ops_.end();) {
        Op& op = it->second;
        if (op.done) {
          ++it;
          continue;
        }
        op.status = status;
        op.done = true;
        // A staged buffer stays allocated: the daemon may still write it.
        if (!op.then) {
          ++it;
          continue;
        }
        thens.push_back(std::move(op.then));
        ops_.erase(it++);
      }
    }
    for (auto& then : thens) then(status);
  }

  const int fd_;
  std::unique_ptr<SharedMemory> arena_;
  std::unique_ptr<Staging> staging_;
  uint8_t* const base_;        // staging_'s arena: where the client allocates (host or device)
  ArenaAllocator& allocator_;  // staging_'s
  Topology topology_;
  std::thread reader_;
  std::atomic<int64_t> joins_{0};
  std::atomic<bool> hosts_updated_{false};
  // The daemon reads and writes this process's allreduce tensors where they are (CPU slots).
  bool direct_access_ = false;
  std::map<int32_t, int64_t> barriers_ ABSL_GUARDED_BY(mu_);  // by process set
  std::atomic<int64_t> groups_{0};

  absl::Mutex write_mu_;
  mutable absl::Mutex mu_ ABSL_ACQUIRED_BEFORE(write_mu_);
  Handle next_handle_ ABSL_GUARDED_BY(mu_) = 1;
  // Node-based: Wait() keeps a pointer to its Op across AwaitWithTimeout, which releases mu_ while
  // other threads insert.
  absl::node_hash_map<Handle, Op> ops_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Handle, AllgatherOutput> gathered_ ABSL_GUARDED_BY(mu_);
  int last_joined_rank_ ABSL_GUARDED_BY(mu_) = -1;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  // Staged buffers given back so far: incremented under mu_ (waits on it are conditions on mu_),
  // read without it.
  std::atomic<int64_t> releases_{0};
};

}  // namespace

absl::StatusOr<AttachClaim> AttachClaimFromEnvironment() {
  AttachClaim claim;
  const char* job = std::getenv("RINGMASTER_ATTACH_JOB");
  if (job == nullptr || *job == '\0') return claim;
  claim.job_name = job;
  for (const char* name : {"RINGMASTER_ATTACH_RANK", "JOB_COMPLETION_INDEX"}) {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0') continue;
    if (!absl::SimpleAtoi(value, &claim.rank) || claim.rank < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, "='", value, "' is not a rank (a number from 0)"));
    }
    return claim;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "RINGMASTER_ATTACH_JOB='", job,
      "' names an attached job but neither RINGMASTER_ATTACH_RANK nor JOB_COMPLETION_INDEX says "
      "which rank this process is"));
}

absl::StatusOr<std::unique_ptr<Client>> Handshake(int fd, bool* retry, const AttachClaim& attach,
                                                  int64_t after_epoch) {
  *retry = false;
  v1::LocalRequest hello;
  hello.mutable_hello()->set_pid(getpid());
  hello.mutable_hello()->set_after_epoch(after_epoch);
  // Lets a CPU daemon that can read this process's memory reduce tensors where they are
  // (LocalWelcome.direct_access); RINGMASTER_DIRECT_ACCESS=0 keeps every tensor staged.
  static const uint64_t probe = static_cast<uint64_t>(getpid()) * 0x9E3779B97F4A7C15ull | 1;
  if (const char* direct = std::getenv("RINGMASTER_DIRECT_ACCESS");
      direct == nullptr || std::string(direct) != "0") {
    hello.mutable_hello()->set_probe_address(reinterpret_cast<uint64_t>(&probe));
    hello.mutable_hello()->set_probe_value(probe);
  }
  if (!attach.job_name.empty()) {
    hello.mutable_hello()->set_attach_job(attach.job_name);
    hello.mutable_hello()->set_attach_rank(attach.rank);
  }
  v1::LocalReply reply;
  absl::Status status = WriteFrame(fd, hello);
  if (status.ok()) status = ReadFrame(fd, &reply);
  if (status.ok() && reply.kind_case() != v1::LocalReply::kWelcome) {
    status = absl::Status(static_cast<absl::StatusCode>(reply.completion().code()),
                          reply.completion().message());
    if (status.ok()) status = absl::InternalError("the worker answered the hello with no welcome");
  }
  if (!status.ok()) {
    // Refused for good (another process holds this rank; this process may not attach): waiting
    // would not change that.
    *retry = status.code() != absl::StatusCode::kFailedPrecondition &&
             status.code() != absl::StatusCode::kPermissionDenied;
    close(fd);
    return status;
  }
  const v1::LocalWelcome& welcome = reply.welcome();
  absl::StatusOr<int> arena_fd = ReceiveFd(fd);
  absl::StatusOr<std::unique_ptr<SharedMemory>> arena =
      arena_fd.ok() ? SharedMemory::Map(*arena_fd, welcome.arena_name())
                    : absl::StatusOr<std::unique_ptr<SharedMemory>>(arena_fd.status());
  if (!arena.ok()) {
    close(fd);
    return arena.status();
  }
  const size_t bytes = static_cast<size_t>(welcome.client_bytes());
  std::unique_ptr<Staging> staging;
  if (welcome.device() > 0) {
    DeviceArena device;
    device.device = welcome.device() - 1;
    device.pci_bus_id = welcome.device_pci_bus_id();
    device.arena_handle = welcome.device_arena();
    device.done_events.assign(welcome.done_events().begin(), welcome.done_events().end());
    device.bytes = bytes;
    absl::StatusOr<std::unique_ptr<Staging>> opened = OpenDeviceStaging(device);
    if (opened.ok()) {
      v1::LocalRequest ready;
      for (std::string& h : (*opened)->ReadyEventHandles()) {
        ready.mutable_ready_events()->add_handles(std::move(h));
      }
      if (absl::Status s = WriteFrame(fd, ready); !s.ok()) opened = s;
    }
    if (!opened.ok()) {
      close(fd);
      return opened.status();
    }
    staging = *std::move(opened);
  } else if (bytes > (*arena)->size()) {
    close(fd);
    return absl::InternalError(absl::StrCat("the worker gave this process ", bytes,
                                            " bytes of an arena of ", (*arena)->size()));
  } else {
    staging = MakeHostStaging((*arena)->data(), bytes);
  }
  return std::unique_ptr<Client>(
      new ClientImpl(fd, welcome, *std::move(arena), std::move(staging)));
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(std::string socket_path,
                                                        absl::Duration timeout,
                                                        int64_t after_epoch) {
  if (socket_path.empty()) {
    const char* env = std::getenv("RINGMASTER_SOCKET");
    if (env == nullptr || *env == '\0') {
      return absl::FailedPreconditionError(
          "RINGMASTER_SOCKET is not set: run under `ringmaster local` or a ringmaster worker, or "
          "pass the worker's socket path");
    }
    socket_path = env;
  }
  absl::StatusOr<AttachClaim> attach = AttachClaimFromEnvironment();
  if (!attach.ok()) return attach.status();
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status last;
  while (true) {
    absl::StatusOr<int> fd = Dial(socket_path);
    if (fd.ok()) {
      bool retry = false;
      absl::StatusOr<std::unique_ptr<Client>> client = Handshake(*fd, &retry, *attach, after_epoch);
      if (client.ok() || !retry) return client;
      last = client.status();
    } else {
      last = fd.status();
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("no job from the worker at ", socket_path,
                                                      " within ", absl::FormatDuration(timeout),
                                                      ": ", last.message()));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

}  // namespace ringmaster
