#include "worker/cpu/gloo_backend.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gloo/allgatherv.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/common/logging.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"
#include "worker/cpu/reduce_kernels.h"

namespace ringmaster {
namespace {

// ---- Error translation: the one place Gloo's exceptions become absl::Status ----

// Gloo signals every timeout as an IoException; only the message tells them apart ("Timed out
// waiting 2000ms for recv operation to complete", "Connect timeout ...", and on the other pairs of
// the same context "Application timeout caused pair closure").
bool IsTimeoutMessage(absl::string_view message) {
  const std::string lower = absl::AsciiStrToLower(message);
  return absl::StrContains(lower, "timed out") || absl::StrContains(lower, "timeout");
}

// Runs `fn`, turning whatever it throws into "gloo <what> failed on rank <rank>: <message>".
template <typename Fn>
absl::Status CallGloo(absl::string_view what, int rank, Fn&& fn) {
  absl::StatusCode code;
  std::string message;
  try {
    fn();
    return absl::OkStatus();
  } catch (const gloo::IoException& e) {
    code = IsTimeoutMessage(e.what()) ? absl::StatusCode::kDeadlineExceeded
                                      : absl::StatusCode::kUnavailable;
    message = e.what();
  } catch (const gloo::EnforceNotMet& e) {
    code = absl::StatusCode::kInternal;
    message = e.what();
  } catch (const gloo::Exception& e) {
    code = absl::StatusCode::kInternal;
    message = e.what();
  } catch (const std::exception& e) {
    code = absl::StatusCode::kInternal;
    message = e.what();
  }
  return absl::Status(code, absl::StrCat("gloo ", what, " failed on rank ", rank, ": ", message));
}

std::chrono::milliseconds ToChrono(absl::Duration d) {
  // Gloo reads 0 ms as "no timeout"; never hand it that.
  return std::max(absl::ToChronoMilliseconds(d), std::chrono::milliseconds(1));
}

// ---- Rendezvous: KeyValueStore as Gloo's Store ----

// Gloo's Store contract: get() blocks until the key exists, wait() blocks until all keys exist, and
// failures are thrown. All waits together are bounded by one deadline, the backend timeout from
// construction (Gloo's untimed wait() included). The first failure is kept so that the caller can
// report the store's status code rather than the exception Gloo rethrows.
//
// Used only for the duration of connectFullMesh(), on one thread.
class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  StoreAdapter(KeyValueStore& store, std::string prefix, absl::Duration timeout)
      : store_(store), prefix_(std::move(prefix)), deadline_(absl::Now() + timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Check(store_.Set(prefix_ + key, std::string(data.begin(), data.end())));
  }

  std::vector<char> get(const std::string& key) override {
    absl::StatusOr<std::vector<std::string>> values = store_.Wait({prefix_ + key}, Remaining());
    Check(values.status());
    const std::string& value = values->front();
    return std::vector<char>(value.begin(), value.end());
  }

  void wait(const std::vector<std::string>& keys) override { Wait(keys, Remaining()); }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    // Gloo passes kNoTimeout (0) for "forever"; the deadline bounds that too.
    Wait(keys, timeout == gloo::kNoTimeout ? Remaining()
                                           : std::min(Remaining(), absl::FromChrono(timeout)));
  }

  const absl::Status& first_failure() const { return first_failure_; }

 private:
  absl::Duration Remaining() const {
    return std::max(deadline_ - absl::Now(), absl::ZeroDuration());
  }

  void Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
    std::vector<std::string> prefixed;
    prefixed.reserve(keys.size());
    for (const std::string& key : keys) prefixed.push_back(prefix_ + key);
    Check(store_.Wait(prefixed, timeout).status());
  }

  // Gloo expects I/O trouble in its store as gloo::IoException.
  void Check(const absl::Status& status) {
    if (status.ok()) return;
    if (first_failure_.ok()) first_failure_ = status;
    throw gloo::IoException(absl::StrCat("key-value store: ", status.message()));
  }

  KeyValueStore& store_;
  const std::string prefix_;
  const absl::Time deadline_;
  absl::Status first_failure_;
};

// Gloo's options are typed only by element size; pick an unsigned integer of the right width.
template <typename Options>
void SetOutputBySize(Options& opts, void* data, size_t count, int element_size) {
  switch (element_size) {
    case 1:
      opts.template setOutput<uint8_t>(static_cast<uint8_t*>(data), count);
      break;
    case 2:
      opts.template setOutput<uint16_t>(static_cast<uint16_t*>(data), count);
      break;
    case 4:
      opts.template setOutput<uint32_t>(static_cast<uint32_t*>(data), count);
      break;
    case 8:
      opts.template setOutput<uint64_t>(static_cast<uint64_t*>(data), count);
      break;
  }
}

// ---- The backend ----

class GlooBackend final : public Backend {
 public:
  GlooBackend(int rank, int size, std::chrono::milliseconds timeout,
              std::shared_ptr<gloo::transport::Device> device,
              std::shared_ptr<gloo::Context> context)
      : rank_(rank),
        size_(size),
        timeout_(timeout),
        device_(std::move(device)),
        context_(std::move(context)) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  absl::Status Allreduce(void* data, int64_t count, DataType dtype, ReduceOp op) override {
    absl::StatusOr<ReduceFn> reduce = ReduceFunction(dtype, op);
    if (!reduce.ok()) return reduce.status();
    if (count < 0) {
      return absl::InvalidArgumentError(absl::StrCat("gloo allreduce: negative count ", count));
    }
    if (count == 0) return absl::OkStatus();
    return Run("allreduce", [&] {
      gloo::AllreduceOptions opts(context_);
      SetOutputBySize(opts, data, static_cast<size_t>(count), DataTypeSize(dtype));
      opts.setReduceFunction(*reduce);
      opts.setTag(next_tag_++);
      opts.setTimeout(timeout_);
      gloo::allreduce(opts);
    });
  }

  absl::Status Broadcast(void* data, int64_t bytes, int root) override {
    if (root < 0 || root >= size_) {
      return absl::InvalidArgumentError(
          absl::StrCat("gloo broadcast: root ", root, " is not a rank of ", size_));
    }
    if (bytes < 0) {
      return absl::InvalidArgumentError(absl::StrCat("gloo broadcast: negative size ", bytes));
    }
    if (bytes == 0) return absl::OkStatus();
    return Run("broadcast", [&] {
      gloo::BroadcastOptions opts(context_);
      opts.setOutput<uint8_t>(static_cast<uint8_t*>(data), static_cast<size_t>(bytes));
      opts.setRoot(root);
      opts.setTag(next_tag_++);
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    });
  }

  absl::Status Allgatherv(const void* in, void* out, absl::Span<const int64_t> bytes) override {
    if (static_cast<int>(bytes.size()) != size_) {
      return absl::InvalidArgumentError(
          absl::StrCat("gloo allgatherv: ", bytes.size(), " part sizes for ", size_, " ranks"));
    }
    std::vector<size_t> elements;
    elements.reserve(bytes.size());
    int64_t total = 0;
    for (int64_t part : bytes) {
      if (part < 0) {
        return absl::InvalidArgumentError(absl::StrCat("gloo allgatherv: negative size ", part));
      }
      elements.push_back(static_cast<size_t>(part));
      total += part;
    }
    if (total == 0) return absl::OkStatus();
    return Run("allgatherv", [&] {
      gloo::AllgathervOptions opts(context_);
      // Gloo only reads the input; its buffer type just is not const.
      if (elements[rank_] > 0) {
        opts.setInput<uint8_t>(static_cast<uint8_t*>(const_cast<void*>(in)), elements[rank_]);
      }
      opts.setOutput<uint8_t>(static_cast<uint8_t*>(out), std::move(elements));
      opts.setTag(next_tag_++);
      opts.setTimeout(timeout_);
      gloo::allgatherv(opts);
    });
  }

  absl::Status Barrier() override {
    return Run("barrier", [&] {
      gloo::BarrierOptions opts(context_);
      opts.setTag(next_tag_++);
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
    });
  }

 private:
  // Runs one collective unless an earlier one failed; a failure closes Gloo's pairs for good.
  template <typename Fn>
  absl::Status Run(absl::string_view collective, Fn&& fn) {
    if (!failure_.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "gloo ", collective, " refused on rank ", rank_,
          ": the communicator is unusable after an earlier failure: ", failure_.message()));
    }
    absl::Status status = CallGloo(collective, rank_, std::forward<Fn>(fn));
    if (!status.ok()) failure_ = status;
    return status;
  }

  const int rank_;
  const int size_;
  const std::chrono::milliseconds timeout_;
  // The device runs the event loop the context's pairs are registered with, so it outlives them.
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  // Every rank issues the same collectives in the same order, so counters agree across ranks.
  uint32_t next_tag_ = 0;
  absl::Status failure_;
};

void IgnoreSigpipeIfDefault() {
  struct sigaction current = {};
  if (sigaction(SIGPIPE, nullptr, &current) != 0) return;
  if (current.sa_handler != SIG_DFL || (current.sa_flags & SA_SIGINFO)) return;
  struct sigaction ignore = {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGPIPE, &ignore, nullptr);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateGlooBackend(GlooBackendOptions options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo backend: rank ", options.rank, " of size ", options.size));
  }
  if (options.store == nullptr) {
    return absl::InvalidArgumentError("gloo backend: no rendezvous store");
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("gloo backend: timeout must be positive, not ",
                                                   absl::FormatDuration(options.timeout)));
  }
  IgnoreSigpipeIfDefault();
  const int rank = options.rank;
  const std::chrono::milliseconds timeout = ToChrono(options.timeout);

  gloo::transport::tcp::attr attr;
  if (!options.iface.empty()) {
    attr.iface = options.iface;
  } else {
    attr.hostname = options.hostname.empty() ? "127.0.0.1" : options.hostname;
  }
  const std::string where = attr.iface.empty() ? absl::StrCat("host ", attr.hostname)
                                               : absl::StrCat("interface ", attr.iface);
  std::shared_ptr<gloo::transport::Device> device;
  absl::Status status = CallGloo(absl::StrCat("device creation on ", where), rank,
                                 [&] { device = gloo::transport::tcp::CreateDevice(attr); });
  if (!status.ok()) return status;

  auto context = std::make_shared<gloo::rendezvous::Context>(rank, options.size);
  context->setTimeout(timeout);
  StoreAdapter store(*options.store, options.prefix, options.timeout);
  status = CallGloo("rendezvous", rank, [&] { context->connectFullMesh(store, device); });
  if (!status.ok()) {
    // Gloo rethrows the store's failure as an I/O error; the store's own code says more (a rank
    // that never showed up is DEADLINE_EXCEEDED, not UNAVAILABLE).
    if (!store.first_failure().ok()) {
      return absl::Status(store.first_failure().code(), status.message());
    }
    return status;
  }
  return std::make_unique<GlooBackend>(rank, options.size, timeout, std::move(device),
                                       std::move(context));
}

}  // namespace ringmaster
