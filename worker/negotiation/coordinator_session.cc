#include "worker/negotiation/coordinator_session.h"

#include <chrono>
#include <cstdlib>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "spdlog/spdlog.h"

namespace ringmaster {
namespace {

// Sleeps up to `d`, returning early once `stopping` is set.
void SleepUnless(const std::atomic<bool>& stopping, absl::Duration d) {
  for (absl::Duration slept; slept < d && !stopping; slept += absl::Milliseconds(20)) {
    absl::SleepFor(absl::Milliseconds(20));
  }
}

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

// A clock that never steps (the wall clock may, and must not cancel a healthy write). Never 0.
int64_t MonotonicNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
             .count() +
         1;
}

}  // namespace

CoordinatorSession::CoordinatorSession(std::shared_ptr<CoordinatorChannels> channels,
                                       v1::RegisterWorkerRequest registration, Listener* listener,
                                       absl::Duration write_timeout)
    : channels_(std::move(channels)),
      incarnation_([] {
        std::random_device device;
        const uint64_t n = (uint64_t{device()} << 32) ^ device() ^
                           static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
        return n == 0 ? 1 : n;
      }()),
      registration_([&] {
        v1::RegisterWorkerRequest r = std::move(registration);
        r.set_incarnation(incarnation_);
        return r;
      }()),
      listener_(listener),
      write_timeout_(write_timeout),
      drop_every_([] {
        const char* every = std::getenv("RINGMASTER_FAULT_DROP_SESSION");
        int64_t n = 0;
        if (every != nullptr && absl::SimpleAtoi(every, &n) && n > 0) {
          spdlog::warn(
              "fault injection: every {}th message to the coordinator is dropped and "
              "the session cut (RINGMASTER_FAULT_DROP_SESSION)",
              n);
          return n;
        }
        return int64_t{0};
      }()) {}

CoordinatorSession::~CoordinatorSession() { Stop(); }

void CoordinatorSession::Start() {
  thread_ = std::thread([this] { Run(); });
  heartbeat_ = std::thread([this] {
    while (!stopping_) {
      absl::Duration interval;
      {
        absl::MutexLock lock(&mu_);
        interval = heartbeat_interval_;
      }
      SleepUnless(stopping_, interval);
      v1::WorkerMessage m;
      m.mutable_heartbeat();
      Send(m).IgnoreError();
    }
  });
  watchdog_ = std::thread([this] {
    while (!stopping_) {
      SleepUnless(stopping_, std::min(write_timeout_ / 4, absl::Milliseconds(250)));
      const int64_t started = write_started_ns_.load();
      if (started == 0 || MonotonicNanos() - started < absl::ToInt64Nanoseconds(write_timeout_)) {
        continue;
      }
      absl::MutexLock lock(&mu_);
      // Still the same write (not one that finished meanwhile and a newer one that started).
      if (write_started_ns_.load() != started || context_ == nullptr) continue;
      spdlog::warn("a write to the coordinator has not completed in {}: cancelling the session",
                   absl::FormatDuration(write_timeout_));
      context_->TryCancel();
    }
  });
}

void CoordinatorSession::Stop() {
  if (stopping_.exchange(true)) return;
  {
    absl::MutexLock lock(&mu_);
    if (context_ != nullptr) context_->TryCancel();
  }
  if (thread_.joinable()) thread_.join();
  if (heartbeat_.joinable()) heartbeat_.join();
  if (watchdog_.joinable()) watchdog_.join();
}

std::string CoordinatorSession::worker_id() const {
  absl::MutexLock lock(&mu_);
  return worker_id_;
}

void CoordinatorSession::Interrupt() {
  absl::MutexLock lock(&mu_);
  if (context_ != nullptr) context_->TryCancel();
}

bool CoordinatorSession::connected() const {
  absl::MutexLock lock(&mu_);
  return stream_ != nullptr;
}

absl::Status CoordinatorSession::Send(const v1::WorkerMessage& message) {
  absl::MutexLock write_lock(&write_mu_);
  if (message.has_rank_update()) {
    if (!rank_updates_.empty() &&
        rank_updates_.front().rank_update().job_id() != message.rank_update().job_id()) {
      rank_updates_.clear();
    }
    if (rank_updates_.size() < 8) rank_updates_.push_back(message);
  }
  if (message.has_output() && message.output().seq() != 0) {
    if (!outputs_.empty() && outputs_.front().output().job_id() != message.output().job_id()) {
      outputs_.clear();
      output_bytes_ = 0;
    }
    outputs_.push_back(message);
    output_bytes_ += message.output().data().size();
    while (output_bytes_ > kKeptOutputBytes && outputs_.size() > 1) {
      output_bytes_ -= outputs_.front().output().data().size();
      outputs_.pop_front();
    }
  }
  grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>* stream;
  {
    // Not held while writing: Stop() and the watchdog take it to cancel a stuck write.
    absl::MutexLock lock(&mu_);
    stream = stream_;
  }
  if (stream == nullptr) return absl::UnavailableError("not connected to the coordinator");
  if (drop_every_ > 0 && ++sent_ % drop_every_ == 0) {
    spdlog::warn("fault injection: message {} to the coordinator dropped; cutting the session",
                 sent_);
    absl::MutexLock lock(&mu_);
    if (context_ != nullptr) context_->TryCancel();
    return absl::OkStatus();  // as a message lost in flight: the sender cannot tell
  }
  write_started_ns_.store(MonotonicNanos());
  const bool written = stream->Write(message);
  write_started_ns_.store(0);
  if (!written) return absl::UnavailableError("session stream closed");
  return absl::OkStatus();
}

grpc::Status CoordinatorSession::RunSession(bool* accepted) {
  *accepted = false;
  grpc::ClientContext context;
  const std::shared_ptr<grpc::Channel> channel = channels_->Current();
  auto stub = v1::WorkerService::NewStub(channel);
  std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>> stream;
  bool opened = false;
  std::string worker_id;
  std::string secret;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return grpc::Status::CANCELLED;
    context_ = &context;
    stream = stub->Session(&context);
    worker_id = worker_id_;
    secret = session_secret_;
  }
  {
    // Outside mu_, so the watchdog can cancel it: a coordinator that accepted the connection may
    // still not read.
    absl::MutexLock write_lock(&write_mu_);
    v1::WorkerMessage open;
    open.mutable_open()->set_worker_id(worker_id);
    open.mutable_open()->set_incarnation(incarnation_);
    open.mutable_open()->set_secret(secret);
    listener_->OnSessionOpen(open.mutable_open());
    write_started_ns_.store(MonotonicNanos());
    opened = stream->Write(open);
    // Before anything else is sent on this session: the output and the rank updates that may have
    // been lost (the output first: the coordinator stores a rank's output before its exit).
    for (size_t i = 0; opened && i < outputs_.size(); ++i) opened = stream->Write(outputs_[i]);
    for (size_t i = 0; opened && i < rank_updates_.size(); ++i) {
      opened = stream->Write(rank_updates_[i]);
    }
    write_started_ns_.store(0);
    absl::MutexLock lock(&mu_);
    if (opened) stream_ = stream.get();
  }
  v1::CoordinatorMessage m;
  while (opened && stream->Read(&m)) {
    *accepted = true;
    if (m.kind_case() == v1::CoordinatorMessage::kAccepted &&
        m.accepted().heartbeat_interval_ms() > 0) {
      absl::MutexLock lock(&mu_);
      heartbeat_interval_ = absl::Milliseconds(m.accepted().heartbeat_interval_ms());
    }
    listener_->OnMessage(m);
  }
  {
    absl::MutexLock lock(&mu_);
    stream_ = nullptr;
  }
  {
    // A write in progress returns once the stream has ended (cancelled, if it was stuck); only then
    // may the stream go.
    absl::MutexLock write_lock(&write_mu_);
  }
  grpc::Status status = stream->Finish();
  // A replica that does not lead, or one gone: the next call goes to the leader it named, or to
  // the next address. A session that was taken and then broke stays where it was (its coordinator
  // may be back at once).
  if (!*accepted) channels_->Failed(channel, context, status);
  absl::MutexLock lock(&mu_);
  context_ = nullptr;
  return status;
}

void CoordinatorSession::AwaitCoordinator(absl::Duration d) {
  const std::shared_ptr<grpc::Channel> channel = channels_->Current();
  if (channel->GetState(false) == GRPC_CHANNEL_READY) {
    // The coordinator is there, and ended the session (or refused it): the backoff it is.
    SleepUnless(stopping_, d);
    return;
  }
  const absl::Time end = absl::Now() + d;
  while (!stopping_ && absl::Now() < end) {
    const absl::Time slice = std::min(end, absl::Now() + absl::Milliseconds(100));
    if (channel->WaitForConnected(absl::ToChronoTime(slice))) return;
  }
}

void CoordinatorSession::Run() {
  absl::Duration backoff = absl::Milliseconds(100);
  // Replicas: one of them leads at once when another fails, so look again soon.
  const absl::Duration max_backoff =
      channels_->size() > 1 ? absl::Milliseconds(500) : absl::Seconds(5);
  while (!stopping_) {
    if (worker_id().empty()) {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      v1::RegisterWorkerResponse response;
      const std::shared_ptr<grpc::Channel> channel = channels_->Current();
      grpc::Status s =
          v1::WorkerService::NewStub(channel)->RegisterWorker(&context, registration_, &response);
      if (!s.ok()) {
        channels_->Failed(channel, context, s);
        // A coordinator starting beside the worker is not there for a moment: said quietly.
        spdlog::log(backoff >= absl::Milliseconds(800) ? spdlog::level::warn : spdlog::level::info,
                    "registering with the coordinator failed: {}; retrying in {}",
                    s.error_message(), absl::FormatDuration(backoff));
        if (s.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
            s.error_code() == grpc::StatusCode::PERMISSION_DENIED ||
            s.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
          // A bad --host-name or --device, or a certificate that is not a worker's, will not get
          // better by retrying.
          listener_->OnSessionLost(FromGrpc(s), true);
          return;
        }
        AwaitCoordinator(backoff);
        backoff = std::min(backoff * 2, max_backoff);
        continue;
      }
      absl::MutexLock lock(&mu_);
      worker_id_ = response.worker_id();
      session_secret_ = response.session_secret();
      heartbeat_interval_ = absl::Milliseconds(response.heartbeat_interval_ms());
      spdlog::info("registered as {}", worker_id_);
    }
    bool accepted = false;
    grpc::Status status = RunSession(&accepted);
    if (stopping_) return;
    // Unknown, lost, or not this daemon's to open (another identity's, a stale secret): a new
    // registration gives it a worker id of its own.
    const bool reregister = status.error_code() == grpc::StatusCode::NOT_FOUND ||
                            status.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
                            status.error_code() == grpc::StatusCode::PERMISSION_DENIED ||
                            status.error_code() == grpc::StatusCode::UNAUTHENTICATED;
    if (reregister) {
      absl::MutexLock lock(&mu_);
      worker_id_.clear();
      session_secret_.clear();
    }
    spdlog::warn("session with the coordinator ended: {} {}", static_cast<int>(status.error_code()),
                 status.error_message());
    listener_->OnSessionLost(FromGrpc(status), reregister);
    // A session the coordinator took that then broke (a connection reset) is retried soon, however
    // often it happens: a busy worker must be back within the coordinator's reconnect grace. The
    // backoff grows only while the coordinator cannot be reached.
    if (accepted) backoff = absl::Milliseconds(100);
    AwaitCoordinator(backoff);
    backoff = std::min(backoff * 2, max_backoff);
  }
}

}  // namespace ringmaster
