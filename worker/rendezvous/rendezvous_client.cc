#include "worker/rendezvous/rendezvous_client.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/rpc_metadata.h"
#include "grpcpp/client_context.h"

namespace ringmaster {
namespace {

constexpr absl::Duration kCallDeadline = absl::Seconds(10);
constexpr absl::Duration kPause = absl::Milliseconds(100);

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

// Runs `call(stub, context)` until it returns anything but UNAVAILABLE (or a CANCELLED it did not
// cause) or `until` passes. With one
// coordinator address each attempt waits for the channel to connect (wait_for_ready); with several
// (replicas) an attempt fails at once and the next goes where the failure pointed (the leader a
// follower named, or the next address). Each attempt ends by `per_call` or `until`; a journal (may
// be null) cancels them.
template <typename Call>
absl::Status Retrying(CoordinatorChannels& channels, RendezvousJournal* journal, absl::Time until,
                      absl::Duration per_call, Call call) {
  while (true) {
    grpc::ClientContext context;
    const std::shared_ptr<grpc::Channel> channel = channels.Current();
    auto stub = v1::RendezvousService::NewStub(channel);
    context.set_wait_for_ready(channels.size() == 1);
    const absl::Time attempt_until = std::min(until, absl::Now() + per_call);
    context.set_deadline(absl::ToChronoTime(attempt_until));
    if (journal != nullptr && !journal->Begin(&context)) {
      return absl::CancelledError("rendezvous cancelled: the job stopped");
    }
    const grpc::Status status = call(*stub, context);
    channels.Failed(channel, context, status);
    absl::Status s = FromGrpc(status);
    if (journal != nullptr) {
      journal->End(&context);
      if (journal->cancelled())
        return absl::CancelledError("rendezvous cancelled: the job stopped");
    }
    // Unreachable; cancelled by the server (not by us: a journal's cancel returned above), as a
    // coordinator replica does to its calls in flight when it shuts its server down; or this
    // attempt's own deadline passed waiting for a connection (not the server's answer that a wait
    // timed out, which comes before it).
    const bool retry = s.code() == absl::StatusCode::kUnavailable ||
                       s.code() == absl::StatusCode::kCancelled ||
                       (s.code() == absl::StatusCode::kDeadlineExceeded &&
                        absl::Now() >= attempt_until && absl::Now() < until);
    if (!retry || absl::Now() + kPause >= until) return s;
    absl::SleepFor(kPause);
  }
}

}  // namespace

void RendezvousJournal::Record(const std::string& key, const std::string& value) {
  absl::MutexLock lock(&mu_);
  keys_[key] = value;
}

std::map<std::string, std::string> RendezvousJournal::keys() const {
  absl::MutexLock lock(&mu_);
  return keys_;
}

void RendezvousJournal::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  for (grpc::ClientContext* c : calls_) c->TryCancel();
}

bool RendezvousJournal::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

bool RendezvousJournal::Begin(grpc::ClientContext* context) {
  absl::MutexLock lock(&mu_);
  if (cancelled_) return false;
  calls_.push_back(context);
  return true;
}

void RendezvousJournal::End(grpc::ClientContext* context) {
  absl::MutexLock lock(&mu_);
  calls_.erase(std::remove(calls_.begin(), calls_.end(), context), calls_.end());
}

RendezvousClient::RendezvousClient(std::shared_ptr<CoordinatorChannels> channels,
                                   std::string job_id, int64_t epoch,
                                   std::shared_ptr<RendezvousJournal> journal, std::string token)
    : channels_(std::move(channels)),
      job_id_(std::move(job_id)),
      epoch_(epoch),
      journal_(std::move(journal)),
      token_(std::move(token)) {}

void RendezvousClient::Authorize(grpc::ClientContext& context) const {
  if (!token_.empty()) context.AddMetadata(kRendezvousTokenMetadata, token_);
}

absl::Status RendezvousClient::SetOnce(const std::string& key, const std::string& value) {
  v1::SetRequest request;
  request.set_job_id(job_id_);
  request.set_epoch(epoch_);
  request.set_key(key);
  request.set_value(value);
  return Retrying(*channels_, journal_.get(), absl::Now() + kRetryFor, kCallDeadline,
                  [&](v1::RendezvousService::Stub& stub, grpc::ClientContext& context) {
                    v1::SetResponse response;
                    Authorize(context);
                    return stub.Set(&context, request, &response);
                  });
}

absl::Status RendezvousClient::Set(const std::string& key, const std::string& value) {
  // Recorded first: should the coordinator go away right after taking it, the daemon sets it again.
  if (journal_ != nullptr) journal_->Record(key, value);
  return SetOnce(key, value);
}

absl::Status RendezvousClient::Republish(const RendezvousJournal& journal) {
  absl::Status first;
  for (const auto& [key, value] : journal.keys()) first.Update(SetOnce(key, value));
  return first;
}

absl::StatusOr<std::string> RendezvousClient::Get(const std::string& key) {
  v1::GetRequest request;
  request.set_job_id(job_id_);
  request.set_epoch(epoch_);
  request.set_key(key);
  v1::GetResponse response;
  absl::Status s = Retrying(*channels_, journal_.get(), absl::Now() + kRetryFor, kCallDeadline,
                            [&](v1::RendezvousService::Stub& stub, grpc::ClientContext& context) {
                              Authorize(context);
                              return stub.Get(&context, request, &response);
                            });
  if (!s.ok()) return s;
  return response.value();
}

absl::StatusOr<std::vector<std::string>> RendezvousClient::Wait(
    const std::vector<std::string>& keys, absl::Duration timeout) {
  // The keys must appear within `timeout`, however often the coordinator is reconnected meanwhile.
  const absl::Time until = absl::Now() + timeout;
  v1::WaitRequest request;
  request.set_job_id(job_id_);
  request.set_epoch(epoch_);
  for (const std::string& k : keys) request.add_keys(k);
  v1::WaitResponse response;
  absl::Status s =
      Retrying(*channels_, journal_.get(), until + kCallDeadline, timeout + kCallDeadline,
               [&](v1::RendezvousService::Stub& stub, grpc::ClientContext& context) {
                 const absl::Duration left = std::max(absl::Milliseconds(1), until - absl::Now());
                 request.set_timeout_ms(absl::ToInt64Milliseconds(left));
                 Authorize(context);
                 return stub.Wait(&context, request, &response);
               });
  if (!s.ok()) return s;
  return std::vector<std::string>(response.values().begin(), response.values().end());
}

absl::Status RendezvousClient::FetchSource(const std::string& dest) {
  v1::GetJobSourceRequest request;
  request.set_job_id(job_id_);
  request.set_epoch(epoch_);
  return Retrying(
      *channels_, journal_.get(), absl::Now() + kFilesFor, kFilesFor,
      [&](v1::RendezvousService::Stub& stub, grpc::ClientContext& context) {
        Authorize(context);
        std::ofstream out(dest, std::ios::binary | std::ios::trunc);
        if (!out) {
          return grpc::Status(grpc::StatusCode::INTERNAL, absl::StrCat("cannot write ", dest));
        }
        std::unique_ptr<grpc::ClientReader<v1::GetJobSourceResponse>> reader =
            stub.GetJobSource(&context, request);
        v1::GetJobSourceResponse chunk;
        while (reader->Read(&chunk)) {
          out.write(chunk.data().data(), static_cast<std::streamsize>(chunk.data().size()));
        }
        grpc::Status status = reader->Finish();
        if (status.ok() && !out.flush()) {
          return grpc::Status(grpc::StatusCode::INTERNAL, absl::StrCat("cannot write ", dest));
        }
        return status;
      });
}

absl::Status RendezvousClient::PutOutput(int32_t rank, const std::string& dir, int32_t* files,
                                         int64_t* bytes) {
  namespace fs = std::filesystem;
  std::vector<std::string> paths;
  std::error_code error;
  for (auto it = fs::recursive_directory_iterator(dir, error);
       !error && it != fs::recursive_directory_iterator(); it.increment(error)) {
    if (it->is_regular_file(error) && !it->is_symlink(error)) {
      paths.push_back(it->path().lexically_relative(dir).generic_string());
    }
  }
  std::sort(paths.begin(), paths.end());
  if (paths.empty()) return absl::OkStatus();
  constexpr size_t kChunk = size_t{1} << 20;
  return Retrying(*channels_, nullptr, absl::Now() + kFilesFor, kFilesFor,
                  [&](v1::RendezvousService::Stub& stub, grpc::ClientContext& context) {
                    Authorize(context);
                    v1::PutRankOutputResponse response;
                    std::unique_ptr<grpc::ClientWriter<v1::PutRankOutputRequest>> writer =
                        stub.PutRankOutput(&context, &response);
                    v1::PutRankOutputRequest m;
                    m.mutable_header()->set_job_id(job_id_);
                    m.mutable_header()->set_epoch(epoch_);
                    m.mutable_header()->set_rank(rank);
                    bool open = writer->Write(m);
                    std::string buffer(kChunk, '\0');
                    for (const std::string& path : paths) {
                      if (!open) break;
                      std::ifstream in(fs::path(dir) / path, std::ios::binary);
                      if (!in) continue;  // removed meanwhile
                      bool first = true;
                      do {
                        in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
                        v1::PutRankOutputRequest c;
                        c.mutable_chunk()->set_path(path);
                        c.mutable_chunk()->set_first(first);
                        c.mutable_chunk()->set_data(buffer.data(),
                                                    static_cast<size_t>(in.gcount()));
                        first = false;
                        open = writer->Write(c);
                      } while (open && in && !in.eof());
                    }
                    if (open) writer->WritesDone();
                    grpc::Status status = writer->Finish();
                    if (status.ok()) {
                      if (files != nullptr) *files = response.files();
                      if (bytes != nullptr) *bytes = response.bytes();
                    }
                    return status;
                  });
}

}  // namespace ringmaster
