#include "coordinator/service/job_service.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/service/grpc_status.h"
#include "coordinator/service/proto_convert.h"
#include "grpc/grpc_security_constants.h"
#include "grpcpp/security/auth_context.h"

namespace ringmaster {
namespace {

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* context, const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// A job as a caller sees it: its environment's values redacted, no secrets.
void ToClient(const Job& in, v1::Job* out) {
  ToProto(in, out);
  RedactForClient(out);
}

// The number of a job id ("job-000042": 42).
bool JobNumber(const std::string& id, int64_t* number) {
  return absl::StartsWith(id, "job-") && absl::SimpleAtoi(id.substr(4), number);
}

// A stream refused before it started (the caller may not read it).
template <typename T>
class RefusedWriter : public grpc::ServerWriteReactor<T> {
 public:
  explicit RefusedWriter(const absl::Status& status) { this->Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

// Streams a job's events. The registry's watcher may fire on any thread, even after the client went
// away, so it reaches the reactor only through `State`, which OnDone() closes.
class WatchReactor : public grpc::ServerWriteReactor<v1::WatchJobResponse> {
 public:
  WatchReactor(Coordinator& coordinator, std::string job_id)
      : coordinator_(coordinator), job_id_(std::move(job_id)), state_(std::make_shared<State>()) {
    state_->reactor = this;
    std::shared_ptr<State> state = state_;
    absl::StatusOr<int64_t> watch =
        coordinator_.WatchJob(job_id_, [state](const Job& job, const JobEvent& event) {
          v1::WatchJobResponse message;
          ToClient(job, message.mutable_job());
          ToProto(event, message.mutable_event());
          state->Push(std::move(message), IsTerminal(job.state));
        });
    if (!watch.ok()) {
      state_->Fail(ToGrpcStatus(watch.status()));
      return;
    }
    watch_id_ = *watch;
    absl::StatusOr<Job> job = coordinator_.GetJob(job_id_);
    if (!job.ok()) {
      state_->Fail(ToGrpcStatus(job.status()));
      return;
    }
    v1::WatchJobResponse first;
    ToClient(*job, first.mutable_job());
    state_->PushFront(std::move(first), IsTerminal(job->state));
  }

  void OnWriteDone(bool ok) override { state_->WriteDone(ok); }
  void OnCancel() override { state_->Fail(grpc::Status::CANCELLED); }
  void OnDone() override {
    if (watch_id_ != 0) coordinator_.UnwatchJob(job_id_, watch_id_);
    if (untrack_) untrack_();
    state_->Close();
    delete this;
  }
  // Ends the stream from any thread (its State outlives it).
  std::function<void(const grpc::Status&)> Ender() {
    return [state = state_](const grpc::Status& s) { state->Fail(s); };
  }
  void SetUntrack(std::function<void()> untrack) { untrack_ = std::move(untrack); }

 private:
  struct State {
    absl::Mutex mu;
    WatchReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;  // null once done
    std::deque<v1::WatchJobResponse> queue ABSL_GUARDED_BY(mu);
    bool writing ABSL_GUARDED_BY(mu) = false;
    bool finishing ABSL_GUARDED_BY(mu) = false;  // finish once the queue drains
    bool finished ABSL_GUARDED_BY(mu) = false;

    void Push(v1::WatchJobResponse m, bool last) { Enqueue(std::move(m), last, false); }
    void PushFront(v1::WatchJobResponse m, bool last) { Enqueue(std::move(m), last, true); }

    void Enqueue(v1::WatchJobResponse m, bool last, bool front) {
      absl::MutexLock lock(&mu);
      if (reactor == nullptr || finished || finishing) return;
      if (front && !writing) {
        queue.push_front(std::move(m));
      } else {
        queue.push_back(std::move(m));
      }
      if (last) finishing = true;
      PumpLocked();
    }
    void WriteDone(bool ok) {
      absl::MutexLock lock(&mu);
      writing = false;
      if (!queue.empty()) queue.pop_front();
      if (!ok) {
        FinishLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE, "write failed"));
        return;
      }
      PumpLocked();
    }
    void PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      if (writing || finished) return;
      if (!queue.empty()) {
        writing = true;
        reactor->StartWrite(&queue.front());
      } else if (finishing) {
        FinishLocked(grpc::Status::OK);
      }
    }
    void Fail(const grpc::Status& status) {
      absl::MutexLock lock(&mu);
      FinishLocked(status);
    }
    void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      if (finished || reactor == nullptr) return;
      finished = true;
      reactor->Finish(status);
    }
    void Close() {
      absl::MutexLock lock(&mu);
      reactor = nullptr;
    }
  };

  Coordinator& coordinator_;
  const std::string job_id_;
  std::shared_ptr<State> state_;
  int64_t watch_id_ = 0;
  std::function<void()> untrack_;
};

// Streams a job's output: what is stored when the call starts, then, with follow, new output as it
// arrives, ending once the job's log has ended and everything was written. Nothing is queued here:
// the reactor keeps a cursor into the coordinator's log store and reads the next batch when the
// last write completed, so a slow client falls behind (possibly past output the store dropped)
// instead of growing memory. The store's wake-up may fire on any thread, even after the client went
// away, so it reaches the reactor only through `State`, which OnDone() closes.
class LogsReactor : public grpc::ServerWriteReactor<v1::GetLogsResponse> {
 public:
  // Data per response: chunks are at most 1 MiB, so a response stays well under gRPC's default
  // 4 MiB receive limit.
  static constexpr int64_t kBatchBytes = int64_t{1} << 20;

  LogsReactor(Coordinator& coordinator, const v1::GetLogsRequest& request)
      : coordinator_(coordinator), job_id_(request.job_id()) {
    const int32_t rank =
        request.all_ranks() || request.rank() == -1 ? LogStore::kAllRanks : request.rank();
    state_ = std::make_shared<State>(coordinator, job_id_, rank, request.follow());
    state_->Attach(this);
    if (absl::Status s = coordinator_.CheckLogQuery(job_id_, rank); !s.ok()) {
      state_->Fail(ToGrpcStatus(s));
      return;
    }
    if (request.follow()) {
      std::shared_ptr<State> state = state_;
      absl::StatusOr<int64_t> id = coordinator_.FollowLogs(job_id_, [state] { state->Pump(); });
      if (!id.ok()) {
        state_->Fail(ToGrpcStatus(id.status()));
        return;
      }
      follow_id_ = *id;
    } else {
      state_->SetUntil(coordinator_.LogHead(job_id_));
    }
    state_->Pump();
  }

  void OnWriteDone(bool ok) override { state_->WriteDone(ok); }
  void OnCancel() override { state_->Fail(grpc::Status::CANCELLED); }
  void OnDone() override {
    if (follow_id_ != 0) coordinator_.UnfollowLogs(job_id_, follow_id_);
    if (untrack_) untrack_();
    state_->Close();
    delete this;
  }
  // Ends the stream from any thread (its State outlives it).
  std::function<void(const grpc::Status&)> Ender() {
    return [state = state_](const grpc::Status& s) { state->Fail(s); };
  }
  void SetUntrack(std::function<void()> untrack) { untrack_ = std::move(untrack); }

 private:
  class State {
   public:
    State(Coordinator& coordinator, std::string job_id, int32_t rank, bool follow)
        : coordinator_(coordinator), job_id_(std::move(job_id)), rank_(rank), follow_(follow) {}

    void Attach(LogsReactor* reactor) {
      absl::MutexLock lock(&mu_);
      reactor_ = reactor;
    }
    // Without follow, the stream ends at the chunk that was newest when the call started.
    void SetUntil(int64_t until) {
      absl::MutexLock lock(&mu_);
      until_ = until;
    }
    // Writes the next batch if none is in flight, finishes when everything is written, or parks
    // until the store wakes it. Reading takes the store's lock briefly; it never waits.
    void Pump() {
      absl::MutexLock lock(&mu_);
      PumpLocked();
    }
    void WriteDone(bool ok) {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) {
        FinishLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE, "write failed"));
        return;
      }
      PumpLocked();
    }
    void Fail(const grpc::Status& status) {
      absl::MutexLock lock(&mu_);
      FinishLocked(status);
    }
    void Close() {
      absl::MutexLock lock(&mu_);
      reactor_ = nullptr;
    }

   private:
    void PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (reactor_ == nullptr || writing_ || finished_) return;
      LogRead read = coordinator_.ReadLogs(job_id_, rank_, cursor_, kBatchBytes, until_);
      if (!read.chunks.empty()) {
        cursor_ = read.cursor;
        out_.Clear();
        for (const LogChunk& c : read.chunks) ToProto(c, out_.add_chunks());
        writing_ = true;
        reactor_->StartWrite(&out_);
      } else if (!follow_ || read.end) {
        FinishLocked(grpc::Status::OK);
      }
    }
    void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (finished_ || reactor_ == nullptr) return;
      finished_ = true;
      reactor_->Finish(status);
    }

    Coordinator& coordinator_;
    const std::string job_id_;
    const int32_t rank_;
    const bool follow_;
    absl::Mutex mu_;
    LogsReactor* reactor_ ABSL_GUARDED_BY(mu_) = nullptr;  // null once done
    int64_t until_ ABSL_GUARDED_BY(mu_) = std::numeric_limits<int64_t>::max();
    int64_t cursor_ ABSL_GUARDED_BY(mu_) = 0;
    v1::GetLogsResponse out_ ABSL_GUARDED_BY(mu_);  // the message in flight
    bool writing_ ABSL_GUARDED_BY(mu_) = false;
    bool finished_ ABSL_GUARDED_BY(mu_) = false;
  };

  Coordinator& coordinator_;
  const std::string job_id_;
  std::shared_ptr<State> state_;
  int64_t follow_id_ = 0;
  std::function<void()> untrack_;
};

// Streams an artifact in chunks of at most 1 MiB, reading the next chunk as the previous one is
// written: the snapshot's first `size` bytes from the store, then its tail. The snapshot and every
// read are file I/O: they run on the service's I/O executor, never on a gRPC callback thread. At
// most one task of a reactor is pending at a time, and none once it has finished (so none after
// OnDone).
class ArtifactReactor : public grpc::ServerWriteReactor<v1::GetArtifactResponse> {
 public:
  ArtifactReactor(Coordinator& coordinator, Executor& io, const v1::GetArtifactRequest& request)
      : coordinator_(coordinator), io_(io), job_id_(request.job_id()), name_(request.name()) {
    io_.Post([this] { Begin(); });
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::CANCELLED);
      return;
    }
    io_.Post([this] { Next(); });
  }
  void OnDone() override { delete this; }

 private:
  static constexpr int64_t kChunk = int64_t{1} << 20;

  void Begin() {
    absl::StatusOr<Coordinator::ArtifactSnapshot> snapshot =
        coordinator_.SnapshotArtifact(job_id_, name_);
    if (!snapshot.ok()) {
      Finish(ToGrpcStatus(snapshot.status()));
      return;
    }
    snapshot_ = *std::move(snapshot);
    Next();
  }

  void Next() {
    if (offset_ >= snapshot_.size && tail_sent_) {
      Finish(grpc::Status::OK);
      return;
    }
    out_.Clear();
    const int64_t want = std::min(kChunk, snapshot_.size - offset_);
    if (want > 0) {
      absl::StatusOr<std::string> data = coordinator_.ReadArtifact(job_id_, name_, offset_, want);
      if (!data.ok()) {
        Finish(ToGrpcStatus(data.status()));
        return;
      }
      if (data->empty()) {  // the file shrank (a reused job id reset it): end here
        offset_ = snapshot_.size;
      }
      offset_ += static_cast<int64_t>(data->size());
      out_.set_data(*std::move(data));
    }
    if (offset_ >= snapshot_.size) {
      out_.mutable_data()->append(snapshot_.tail);
      tail_sent_ = true;
    }
    if (out_.data().empty()) {
      Finish(grpc::Status::OK);
      return;
    }
    StartWrite(&out_);
  }

  Coordinator& coordinator_;
  Executor& io_;
  const std::string job_id_;
  const std::string name_;
  Coordinator::ArtifactSnapshot snapshot_;
  int64_t offset_ = 0;
  bool tail_sent_ = false;
  v1::GetArtifactResponse out_;
};

// SubmitJob: the spec, then the archive's chunks, each appended to the upload on the I/O
// executor before the next read starts (at most one read or one task outstanding, so the reactor
// lives until the last of them has run). At the end of the stream the archive is checked, stored
// and the job registered, on the executor.
class SubmitReactor : public grpc::ServerReadReactor<v1::SubmitJobRequest> {
 public:
  SubmitReactor(Coordinator& coordinator, Executor& io, grpc::CallbackServerContext* context,
                std::string owner, v1::RegisterJobResponse* response)
      : coordinator_(coordinator),
        io_(io),
        context_(context),
        owner_(std::move(owner)),
        response_(response) {
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client's stream ended (or the call was cancelled)
      io_.Post([this] { Complete(); });
      return;
    }
    if (!have_spec_) {
      if (in_.kind_case() != v1::SubmitJobRequest::kSpec) {
        Finish(ToGrpcStatus(absl::InvalidArgumentError(
            "SubmitJob: the first message must carry spec; the archive's chunks follow it")));
        return;
      }
      if (in_.spec().has_source()) {
        Finish(ToGrpcStatus(absl::InvalidArgumentError(
            "spec.source is filled in by the coordinator: send the archive as source_chunk "
            "messages after the spec")));
        return;
      }
      absl::Status s = FromProto(in_.spec(), &spec_);
      // Checked now, so that a bad spec does not wait for its archive to arrive.
      if (s.ok()) {
        FillElasticDefaults(spec_);
        s = ValidateJobSpec(spec_);
      }
      if (!s.ok()) {
        Finish(ToGrpcStatus(s));
        return;
      }
      have_spec_ = true;
      StartRead(&in_);
      return;
    }
    if (in_.kind_case() != v1::SubmitJobRequest::kSourceChunk) {
      Finish(ToGrpcStatus(
          absl::InvalidArgumentError("SubmitJob: spec may come only once, as the first message")));
      return;
    }
    if (upload_ == nullptr) {
      absl::StatusOr<std::unique_ptr<SourceStore::Upload>> upload = coordinator_.sources().Begin();
      if (!upload.ok()) {
        Finish(ToGrpcStatus(upload.status()));
        return;
      }
      upload_ = *std::move(upload);
    }
    io_.Post([this, data = std::move(*in_.mutable_source_chunk())] {
      if (absl::Status s = upload_->Append(data); !s.ok()) {
        upload_.reset();
        Finish(ToGrpcStatus(s));
        return;
      }
      StartRead(&in_);
    });
  }

  void OnDone() override { delete this; }

 private:
  void Complete() {
    if (context_->IsCancelled()) {
      upload_.reset();
      Finish(grpc::Status::CANCELLED);
      return;
    }
    if (!have_spec_) {
      Finish(ToGrpcStatus(absl::InvalidArgumentError("SubmitJob: the stream carried no spec")));
      return;
    }
    if (upload_ != nullptr) {
      absl::StatusOr<SourceArchive> source = upload_->Commit();
      upload_.reset();
      if (!source.ok()) {
        Finish(ToGrpcStatus(source.status()));
        return;
      }
      spec_.source = *std::move(source);
    }
    absl::StatusOr<Job> job = coordinator_.RegisterJob(std::move(spec_), owner_);
    if (job.ok()) ToClient(*job, response_->mutable_job());
    Finish(ToGrpcStatus(job.status()));
  }

  Coordinator& coordinator_;
  Executor& io_;
  grpc::CallbackServerContext* const context_;
  const std::string owner_;
  v1::RegisterJobResponse* const response_;
  v1::SubmitJobRequest in_;
  bool have_spec_ = false;
  JobSpec spec_;
  std::unique_ptr<SourceStore::Upload> upload_;
};

}  // namespace

const Authenticator JobService::kNoAuthentication;

absl::Status JobService::AuthorizeJob(const grpc::CallbackServerContext& context,
                                      const std::string& job_id) const {
  absl::StatusOr<Principal> caller = auth_.Authenticate(context);
  if (!caller.ok()) return caller.status();
  absl::StatusOr<std::string> owner = coordinator_.JobOwner(job_id);
  if (!owner.ok()) return owner.status();
  return MayAccessJob(*caller, job_id, *owner, auth_.options().admin_group);
}

grpc::ServerUnaryReactor* JobService::RegisterJob(grpc::CallbackServerContext* context,
                                                  const v1::RegisterJobRequest* request,
                                                  v1::RegisterJobResponse* response) {
  absl::StatusOr<Principal> caller = auth_.Authenticate(*context);
  if (!caller.ok()) return Done(context, caller.status());
  if (caller->worker && !caller->admin) {
    return Done(context, absl::PermissionDeniedError(absl::StrCat(
                             caller->Describe(), " is a worker identity (group ",
                             auth_.options().worker_group, "); workers may not register jobs")));
  }
  if (request->spec().has_source()) {
    return Done(context, absl::InvalidArgumentError(
                             "spec.source is filled in by the coordinator: send the job's code "
                             "with SubmitJob"));
  }
  JobSpec spec;
  if (absl::Status s = FromProto(request->spec(), &spec); !s.ok()) return Done(context, s);
  // Stored (a durable write) on the I/O executor, never on a callback thread: a flood of
  // registrations must not keep the threads that serve worker sessions and heartbeats.
  if (queued_registrations_.fetch_add(1) >= kMaxQueuedRegistrations) {
    queued_registrations_.fetch_sub(1);
    return Done(context, absl::ResourceExhaustedError(absl::StrCat(
                             "the coordinator has ", kMaxQueuedRegistrations,
                             " registrations waiting to be stored: retry in a moment")));
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  uploads_.Post([this, reactor, response, spec = std::move(spec), owner = caller->name]() mutable {
    absl::StatusOr<Job> job = coordinator_.RegisterJob(std::move(spec), std::move(owner));
    queued_registrations_.fetch_sub(1);
    if (job.ok()) ToClient(*job, response->mutable_job());
    reactor->Finish(ToGrpcStatus(job.status()));
  });
  return reactor;
}

grpc::ServerReadReactor<v1::SubmitJobRequest>* JobService::SubmitJob(
    grpc::CallbackServerContext* context, v1::RegisterJobResponse* response) {
  absl::StatusOr<Principal> caller = auth_.Authenticate(*context);
  if (!caller.ok()) return new RefusedReader<v1::SubmitJobRequest>(caller.status());
  if (caller->worker && !caller->admin) {
    return new RefusedReader<v1::SubmitJobRequest>(absl::PermissionDeniedError(
        absl::StrCat(caller->Describe(), " is a worker identity (group ",
                     auth_.options().worker_group, "); workers may not register jobs")));
  }
  return new SubmitReactor(coordinator_, uploads_, context, caller->name, response);
}

grpc::ServerUnaryReactor* JobService::GetJob(grpc::CallbackServerContext* context,
                                             const v1::GetJobRequest* request,
                                             v1::GetJobResponse* response) {
  if (absl::Status s = AuthorizeJob(*context, request->job_id()); !s.ok()) {
    return Done(context, s);
  }
  absl::StatusOr<Job> job = coordinator_.GetJob(request->job_id());
  if (job.ok()) ToClient(*job, response->mutable_job());
  return Done(context, job.status());
}

grpc::ServerUnaryReactor* JobService::ListJobs(grpc::CallbackServerContext* context,
                                               const v1::ListJobsRequest* request,
                                               v1::ListJobsResponse* response) {
  absl::StatusOr<Principal> caller = auth_.Authenticate(*context);
  if (!caller.ok()) return Done(context, caller.status());
  std::vector<JobState> states;
  for (int s : request->states()) {
    JobState state;
    if (absl::Status st = FromProto(static_cast<v1::JobState>(s), &state); !st.ok()) {
      return Done(context, st);
    }
    states.push_back(state);
  }
  constexpr int kDefaultPage = 100, kMaxPage = 1000;
  constexpr size_t kMaxReplyBytes = size_t{4} << 20;
  if (request->page_size() < 0 || request->page_size() > kMaxPage) {
    return Done(context,
                absl::InvalidArgumentError(absl::StrCat("page_size ", request->page_size(),
                                                        " is out of bounds [0, ", kMaxPage, "]")));
  }
  const int page = request->page_size() == 0 ? kDefaultPage : request->page_size();
  // Newest first, and job numbers only grow: a page starts below the token's job number, whether
  // or not that job is still listed (it may have ended, or been removed, since).
  int64_t below = std::numeric_limits<int64_t>::max();
  if (!request->page_token().empty() && !JobNumber(request->page_token(), &below)) {
    return Done(context, absl::InvalidArgumentError(
                             absl::StrCat("page_token '", request->page_token().substr(0, 64),
                                          "' is not a ListJobsResponse.next_page_token")));
  }
  size_t bytes = 0;
  for (const Job& job : coordinator_.ListJobs(states)) {
    // Each user sees their own jobs; admins see all.
    if (!caller->admin && (caller->worker || job.owner != caller->name)) continue;
    int64_t number = 0;
    if (!JobNumber(job.id, &number) || number >= below) continue;
    v1::Job out;
    ToClient(job, &out);
    const size_t size = out.ByteSizeLong();
    if (response->jobs_size() == page ||
        (response->jobs_size() > 0 && bytes + size > kMaxReplyBytes)) {
      response->set_next_page_token(response->jobs(response->jobs_size() - 1).id());
      break;
    }
    bytes += size;
    *response->add_jobs() = std::move(out);
  }
  return Done(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* JobService::CancelJob(grpc::CallbackServerContext* context,
                                                const v1::CancelJobRequest* request,
                                                v1::CancelJobResponse* response) {
  if (absl::Status s = AuthorizeJob(*context, request->job_id()); !s.ok()) {
    return Done(context, s);
  }
  // Cancelling closes the job's files: the coordinator's executor does it and finishes the call.
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  coordinator_.CancelJob(request->job_id(), request->reason(),
                         [reactor, response](absl::StatusOr<Job> job) {
                           if (job.ok()) ToClient(*job, response->mutable_job());
                           reactor->Finish(ToGrpcStatus(job.status()));
                         });
  return reactor;
}

grpc::ServerWriteReactor<v1::WatchJobResponse>* JobService::WatchJob(
    grpc::CallbackServerContext* context, const v1::WatchJobRequest* request) {
  if (absl::Status s = AuthorizeJob(*context, request->job_id()); !s.ok()) {
    return new RefusedWriter<v1::WatchJobResponse>(s);
  }
  auto* reactor = new WatchReactor(coordinator_, request->job_id());
  reactor->SetUntrack(TrackToken(*context, reactor->Ender()));
  return reactor;
}

grpc::ServerUnaryReactor* JobService::ListArtifacts(grpc::CallbackServerContext* context,
                                                    const v1::ListArtifactsRequest* request,
                                                    v1::ListArtifactsResponse* response) {
  if (absl::Status s = AuthorizeJob(*context, request->job_id()); !s.ok()) {
    return Done(context, s);
  }
  // Listing reads the job's directory: on the I/O executor, not this callback thread.
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  io_.Post([this, reactor, job_id = request->job_id(), response] {
    absl::StatusOr<std::vector<ArtifactInfo>> list = coordinator_.ListArtifacts(job_id);
    if (list.ok()) {
      for (const ArtifactInfo& a : *list) {
        v1::Artifact* out = response->add_artifacts();
        out->set_name(a.name);
        out->set_size_bytes(a.size_bytes);
      }
    }
    reactor->Finish(ToGrpcStatus(list.status()));
  });
  return reactor;
}

grpc::ServerWriteReactor<v1::GetArtifactResponse>* JobService::GetArtifact(
    grpc::CallbackServerContext* context, const v1::GetArtifactRequest* request) {
  if (absl::Status s = AuthorizeJob(*context, request->job_id()); !s.ok()) {
    return new RefusedWriter<v1::GetArtifactResponse>(s);
  }
  return new ArtifactReactor(coordinator_, io_, *request);
}

grpc::ServerWriteReactor<v1::GetLogsResponse>* JobService::GetLogs(
    grpc::CallbackServerContext* context, const v1::GetLogsRequest* request) {
  if (absl::Status s = AuthorizeJob(*context, request->job_id()); !s.ok()) {
    return new RefusedWriter<v1::GetLogsResponse>(s);
  }
  auto* reactor = new LogsReactor(coordinator_, *request);
  reactor->SetUntrack(TrackToken(*context, reactor->Ender()));
  return reactor;
}

std::function<void()> JobService::TrackToken(const grpc::CallbackServerContext& context,
                                             std::function<void(const grpc::Status&)> end) {
  std::string token = auth_.BearerToken(context);
  std::string certificate;
  if (const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
      token.empty() && auth != nullptr && auth->IsPeerAuthenticated()) {
    std::vector<grpc::string_ref> pem = auth->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME);
    if (!pem.empty()) certificate.assign(pem.front().data(), pem.front().size());
  }
  if (token.empty() && certificate.empty()) return nullptr;
  int64_t id;
  {
    absl::MutexLock lock(&streams_mu_);
    id = next_stream_++;
    token_streams_.emplace(id,
                           TokenStream{std::move(token), std::move(certificate), std::move(end)});
  }
  return [this, id] {
    absl::MutexLock lock(&streams_mu_);
    token_streams_.erase(id);
  };
}

void JobService::EndStreamsWhere(absl::FunctionRef<bool(const TokenStream&)> ends,
                                 const grpc::Status& why) {
  // Judged with the lock released: a judgement may read the token file or verify a certificate
  // chain, and opening and closing streams must not wait for that.
  std::vector<std::pair<int64_t, TokenStream>> open;
  {
    absl::MutexLock lock(&streams_mu_);
    open.reserve(token_streams_.size());
    for (const auto& [id, stream] : token_streams_) {
      open.emplace_back(id, TokenStream{stream.token, stream.certificate, nullptr});
    }
  }
  std::vector<int64_t> judged;
  for (const auto& [id, stream] : open) {
    if (ends(stream)) judged.push_back(id);
  }
  std::vector<std::function<void(const grpc::Status&)>> ending;
  {
    absl::MutexLock lock(&streams_mu_);
    for (int64_t id : judged) {
      auto it = token_streams_.find(id);  // gone meanwhile: it ended by itself
      if (it == token_streams_.end()) continue;
      ending.push_back(std::move(it->second.end));
      token_streams_.erase(it);
    }
  }
  // Outside the lock: ending a stream may call back into OnDone (and so into streams_mu_).
  for (const auto& end : ending) end(why);
}

void JobService::EndStreamsOfRevokedTokens() {
  EndStreamsWhere(
      [this](const TokenStream& s) { return !s.token.empty() && !auth_.TokenValid(s.token); },
      grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                   "the bearer token that opened this stream was revoked (it is no longer in the "
                   "coordinator's token file)"));
}

void JobService::EndStreamsOfUntrustedCertificates(const CertificateTrust& trust) {
  EndStreamsWhere(
      [&trust](const TokenStream& s) {
        return !s.certificate.empty() && !trust.Trusted(s.certificate);
      },
      grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                   "the certificate that opened this stream is no longer trusted (its CA left the "
                   "coordinator's --tls-ca bundle, or it expired)"));
}

}  // namespace ringmaster
