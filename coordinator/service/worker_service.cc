#include "coordinator/service/worker_service.h"

#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "coordinator/service/grpc_status.h"
#include "coordinator/service/proto_convert.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpc/grpc_security_constants.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/security/auth_context.h"
#include "spdlog/spdlog.h"

namespace ringmaster {

// What a reconnecting worker may say it has (SessionOpen.resume), and the lists it may have
// retained per rank (RankResume.retained; the worker keeps at most 1024).
constexpr int kMaxResumeEntries = 4;
constexpr int kMaxRetainedLists = 1024;
// At most this many messages wait to be written to one worker. A worker that reads its session
// more slowly than the coordinator writes to it (or not at all: its transport stops taking data)
// has its session ended past it, rather than the coordinator's memory growing: a worker that was
// merely slow reconnects and resumes (the reliable session re-sends what it lacks). Below the 4096
// lists a job keeps for a rank that has not acknowledged them, so a reader that acknowledges lists
// it never reads is cut too.
constexpr size_t kMaxQueuedMessages = 2048;
namespace {

// Messages travel as bytes: the session parses what it reads itself (a message that does not parse
// ends the session INVALID_ARGUMENT, naming it), and a cycle's response list, the same for every
// rank, is serialized once for all of them.
using Outbound = std::shared_ptr<const grpc::ByteBuffer>;

Outbound Serialize(const v1::CoordinatorMessage& message) {
  auto bytes = std::make_shared<grpc::ByteBuffer>();
  bool own = false;
  // Serializing a message we built cannot fail but for its size, which is bounded.
  grpc::SerializationTraits<v1::CoordinatorMessage>::Serialize(message, bytes.get(), &own)
      .IgnoreError();
  return bytes;
}

// A cycle's list as every rank receives it: the message (a rank with a notice of its own gets a
// copy with it added) and its bytes.
struct EncodedCycle {
  v1::CoordinatorMessage message;
  Outbound bytes;
  // The list alone (the ResponseList's bytes), for relayed messages: set once, under the cycle's
  // mutex, by the first relay's send.
  std::shared_ptr<const std::string> list;
};

// The cycle's encoding, made by the first channel that sends it (with the list's bytes alone too,
// when `list` is asked for: relays').
std::shared_ptr<const EncodedCycle> EncodedLocked(CycleBroadcast& cycle, bool list)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(cycle.mu) {
  if (cycle.encoded == nullptr) {
    auto encoded = std::make_shared<EncodedCycle>();
    ToProto(cycle, encoded->message.mutable_responses());
    encoded->bytes = Serialize(encoded->message);
    cycle.encoded = encoded;
  }
  auto encoded = std::const_pointer_cast<EncodedCycle>(
      std::static_pointer_cast<const EncodedCycle>(cycle.encoded));
  if (list && encoded->list == nullptr) {
    encoded->list =
        std::make_shared<const std::string>(encoded->message.responses().SerializeAsString());
  }
  return encoded;
}

// Relayed batches in one message, at most.
constexpr int kMaxRelayedBatches = 512;
// Most cache ids one batch reports used in local negotiation (RequestBatch.used_ids).
constexpr int kMaxUsedIds = 1024;
// Shared cache ids times batches in one relayed message, at most
// (RelayedBatches.shared_cached_ids).
constexpr int64_t kMaxRelayedSharedIds = int64_t{1} << 20;

// CoordinatorMessage{relayed: RelayedResponses{list, ranks, notices}}, written field by field so
// that the list's bytes, the same for every relay, are not encoded again for each.
Outbound EncodeRelayed(const std::string& list, const std::vector<int>& ranks,
                       const std::vector<std::string>& notices) {
  using google::protobuf::io::CodedOutputStream;
  using WireFormat = google::protobuf::internal::WireFormatLite;
  std::string packed;
  for (int r : ranks) {
    char buf[10];
    uint8_t* end = CodedOutputStream::WriteVarint32ToArray(static_cast<uint32_t>(r),
                                                           reinterpret_cast<uint8_t*>(buf));
    packed.append(buf, reinterpret_cast<char*>(end) - buf);
  }
  std::string body;
  {
    google::protobuf::io::StringOutputStream raw(&body);
    CodedOutputStream out(&raw);
    out.WriteTag(WireFormat::MakeTag(1, WireFormat::WIRETYPE_LENGTH_DELIMITED));
    out.WriteVarint32(static_cast<uint32_t>(list.size()));
    out.WriteString(list);
    out.WriteTag(WireFormat::MakeTag(2, WireFormat::WIRETYPE_LENGTH_DELIMITED));
    out.WriteVarint32(static_cast<uint32_t>(packed.size()));
    out.WriteString(packed);
    for (const std::string& bytes : notices) {  // RelayedNotice
      out.WriteTag(WireFormat::MakeTag(3, WireFormat::WIRETYPE_LENGTH_DELIMITED));
      out.WriteVarint32(static_cast<uint32_t>(bytes.size()));
      out.WriteString(bytes);
    }
  }
  std::string message;
  {
    google::protobuf::io::StringOutputStream raw(&message);
    CodedOutputStream out(&raw);
    out.WriteTag(WireFormat::MakeTag(v1::CoordinatorMessage::kRelayedFieldNumber,
                                     WireFormat::WIRETYPE_LENGTH_DELIMITED));
    out.WriteVarint32(static_cast<uint32_t>(body.size()));
    out.WriteString(body);
  }
  grpc::Slice slice(message);
  return std::make_shared<grpc::ByteBuffer>(&slice, 1);
}

// One worker's session. Reads are handled one at a time (the next read starts when the last message
// was handed to the coordinator); writes are queued and sent one at a time. Nothing here blocks.
class SessionReactor : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
                       public WorkerChannel {
 public:
  // `caller`: who opened the stream; an error ends it at once.
  SessionReactor(Coordinator& coordinator, grpc::CallbackServerContext* context,
                 absl::StatusOr<Principal> caller,
                 std::shared_ptr<WorkerService::CertifiedSessions> certified)
      : coordinator_(coordinator), context_(context), certified_(std::move(certified)) {
    // The client certificate it was opened with: a session lives only while that is trusted.
    if (const std::shared_ptr<const grpc::AuthContext> auth = context->auth_context();
        caller.ok() && auth != nullptr && auth->IsPeerAuthenticated()) {
      std::vector<grpc::string_ref> pem =
          auth->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME);
      if (!pem.empty()) {
        absl::MutexLock lock(&certified_->mu);
        certified_->pem.emplace(this, std::string(pem.front().data(), pem.front().size()));
      }
    }
    if (!caller.ok()) {
      absl::MutexLock lock(&mu_);
      finishing_ = true;
      final_status_ = ToGrpcStatus(caller.status());
      FinishLocked();
      return;
    }
    identity_ = caller->name;
    StartRead(&in_);
  }

  // WorkerChannel. Called by the coordinator (with its lock held): queue only.
  void SendAssignment(const Job& job, int rank) override {
    v1::CoordinatorMessage message;
    v1::JobAssignment* a = message.mutable_assignment();
    ToProto(job, a->mutable_job());
    // The token goes in its own field; no worker needs another's secret digest.
    a->mutable_job()->clear_rendezvous_token();
    for (v1::RankInfo& r : *a->mutable_job()->mutable_ranks()) r.clear_worker_secret_sha256();
    a->set_rendezvous_token(job.rendezvous_token);
    a->set_rank(rank);
    a->set_epoch(job.epoch);
    Enqueue(Serialize(message));
  }

  void SendResponses(const std::shared_ptr<CycleBroadcast>& cycle, int rank) override {
    std::shared_ptr<const EncodedCycle> shared;
    {
      absl::MutexLock lock(&cycle->mu);
      shared = EncodedLocked(*cycle, false);
    }
    const RankNotice& notice = cycle->output.notices[rank];
    if (notice.empty()) {
      Enqueue(shared->bytes);
      return;
    }
    v1::CoordinatorMessage own = shared->message;
    ToProto(notice, own.mutable_responses());
    Enqueue(Serialize(own));
  }

  void SendRelayedResponses(const std::shared_ptr<CycleBroadcast>& cycle,
                            const std::vector<int>& ranks) override {
    std::shared_ptr<const std::string> list;
    {
      absl::MutexLock lock(&cycle->mu);
      list = EncodedLocked(*cycle, true)->list;
    }
    std::vector<std::string> notices;
    for (int rank : ranks) {
      const RankNotice& notice = cycle->output.notices[rank];
      if (notice.empty()) continue;
      v1::RelayedNotice own;
      own.set_rank(rank);
      ToProto(notice, own.mutable_part());
      notices.push_back(own.SerializeAsString());
    }
    Enqueue(EncodeRelayed(*list, ranks, notices));
  }

  void SendResumed(const std::string& job_id, int64_t epoch, int rank,
                   uint64_t last_request_seq) override {
    v1::CoordinatorMessage message;
    v1::SessionResumed* r = message.mutable_resumed();
    r->set_job_id(job_id);
    r->set_epoch(epoch);
    r->set_rank(rank);
    r->set_last_request_seq(last_request_seq);
    Enqueue(Serialize(message));
  }

  void SendStopJob(const std::string& job_id, const std::string& reason) override {
    v1::CoordinatorMessage message;
    message.mutable_stop_job()->set_job_id(job_id);
    message.mutable_stop_job()->set_reason(reason);
    Enqueue(Serialize(message));
  }

  void SendStopEpoch(const std::string& job_id, int64_t epoch, const std::string& reason) override {
    v1::CoordinatorMessage message;
    message.mutable_stop_job()->set_job_id(job_id);
    message.mutable_stop_job()->set_reason(reason);
    message.mutable_stop_job()->set_epoch(epoch);
    Enqueue(Serialize(message));
  }

  void SendHostsUpdated(const std::string& job_id, int64_t epoch) override {
    v1::CoordinatorMessage message;
    message.mutable_hosts_updated()->set_job_id(job_id);
    message.mutable_hosts_updated()->set_epoch(epoch);
    Enqueue(Serialize(message));
  }

  void SendClaimRefused(const v1::RankClaim& claim, const absl::Status& why) {
    v1::CoordinatorMessage message;
    v1::ClaimRefused* refused = message.mutable_claim_refused();
    refused->set_job_name(claim.job_name());
    refused->set_rank(claim.rank());
    refused->set_code(static_cast<int32_t>(why.code()));
    refused->set_message(std::string(why.message()));
    Enqueue(Serialize(message));
  }

  void SendShutdown(const std::string& reason) override {
    v1::CoordinatorMessage message;
    message.mutable_shutdown()->set_reason(reason);
    Enqueue(Serialize(message));
  }

  void Close(const absl::Status& status) override {
    absl::MutexLock lock(&mu_);
    if (finishing_) return;
    finishing_ = true;
    final_status_ = ToGrpcStatus(status);
    if (!writing_) FinishLocked();
  }

  // Reactor.
  void OnReadDone(bool ok) override {
    if (!ok) {  // the worker closed its side, or the stream broke
      Close(absl::OkStatus());
      return;
    }
    v1::WorkerMessage message;
    if (!grpc::SerializationTraits<v1::WorkerMessage>::Deserialize(&in_, &message).ok()) {
      Close(absl::InvalidArgumentError(
          "a session message does not parse as ringmaster.v1.WorkerMessage; the session ends"));
      return;
    }
    if (absl::Status s = Handle(message); !s.ok()) {
      Close(s);
      return;
    }
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    queue_.pop_front();
    if (!ok) {
      finishing_ = true;
      final_status_ = grpc::Status(grpc::StatusCode::UNAVAILABLE, "write to worker failed");
    }
    PumpLocked();
  }

  void OnDone() override {
    {
      absl::MutexLock lock(&certified_->mu);
      certified_->pem.erase(this);
    }
    if (!worker_id_.empty()) coordinator_.CloseSession(worker_id_, this);
    delete this;
  }

 private:
  absl::Status Handle(const v1::WorkerMessage& m) {
    if (worker_id_.empty()) {
      if (m.kind_case() != v1::WorkerMessage::kOpen) {
        return absl::InvalidArgumentError("the first message of a session must be 'open'");
      }
      // A worker serves one rank at a time; a few entries allow for a job ending as it resumes.
      if (m.open().resume_size() > kMaxResumeEntries) {
        return absl::InvalidArgumentError(absl::StrCat("open.resume has ", m.open().resume_size(),
                                                       " entries; at most ", kMaxResumeEntries));
      }
      if (absl::Status s =
              coordinator_.CheckSessionProof(m.open().worker_id(), identity_, m.open().secret());
          !s.ok()) {
        spdlog::warn("session for {} refused: {}", m.open().worker_id(), s.ToString());
        return s;
      }
      {
        absl::MutexLock lock(&mu_);
        opening_ = m.open().worker_id();
      }
      if (absl::Status s =
              coordinator_.OpenSession(m.open().worker_id(), this, m.open().incarnation());
          !s.ok()) {
        return s;
      }
      worker_id_ = m.open().worker_id();
      v1::CoordinatorMessage accepted;
      v1::RegisterWorkerResponse* a = accepted.mutable_accepted();
      a->set_worker_id(worker_id_);
      a->set_lease_ms(absl::ToInt64Milliseconds(coordinator_.lease()));
      a->set_heartbeat_interval_ms(absl::ToInt64Milliseconds(coordinator_.heartbeat_interval()));
      Enqueue(Serialize(accepted));
      std::vector<RankResume> resume;
      for (const v1::RankResume& r : m.open().resume()) {
        if (r.retained_size() > kMaxRetainedLists) {
          return absl::InvalidArgumentError(absl::StrCat("open.resume.retained has ",
                                                         r.retained_size(), " lists; at most ",
                                                         kMaxRetainedLists));
        }
        RankResume& out = resume.emplace_back();
        out.job_id = r.job_id();
        out.epoch = r.epoch();
        out.rank = r.rank();
        out.last_response_seq = r.last_response_seq();
        out.last_request_seq = r.last_request_seq();
        const int np = coordinator_.RanksOf(r.job_id());
        for (const v1::ResponseList& list : r.retained()) {
          if (np <= 0) break;  // not a job the coordinator runs: nothing to restore
          absl::StatusOr<std::shared_ptr<CycleBroadcast>> cycle =
              CycleFromProto(list, r.job_id(), np);
          if (!cycle.ok()) return cycle.status();
          out.retained.push_back(*std::move(cycle));
        }
      }
      // After `accepted`: the lists re-sent, then `resumed`.
      coordinator_.ResumeRanks(worker_id_, this, resume);
      return absl::OkStatus();
    }
    // Every message proves the worker alive; a lost worker's session ends here.
    if (absl::Status s = coordinator_.Heartbeat(worker_id_); !s.ok()) return s;
    switch (m.kind_case()) {
      case v1::WorkerMessage::kHeartbeat:
        return absl::OkStatus();
      case v1::WorkerMessage::kRequests: {
        if (m.requests().used_ids_size() > kMaxUsedIds) {
          return absl::InvalidArgumentError(absl::StrCat("requests.used_ids has ",
                                                         m.requests().used_ids_size(),
                                                         " ids; at most ", kMaxUsedIds));
        }
        RequestBatch batch;
        FromProto(m.requests(), &batch);
        const std::string job_id = batch.job_id;
        const int64_t epoch = batch.epoch;
        if (absl::Status s = coordinator_.SubmitRequests(worker_id_, std::move(batch)); !s.ok()) {
          // Not this worker's job: tell it to stop that job; the session lives. A stale epoch
          // (an elastic job moved on): only that epoch ends, and the worker's rank of the new
          // one (if it has one) goes on.
          if (s.code() == absl::StatusCode::kAborted) {
            SendStopEpoch(job_id, epoch, s.ToString());
          } else {
            SendStopJob(job_id, s.ToString());
          }
        }
        return absl::OkStatus();
      }
      case v1::WorkerMessage::kRelayed: {
        const v1::RelayedBatches& relayed = m.relayed();
        if (relayed.batches_size() > kMaxRelayedBatches) {
          return absl::InvalidArgumentError(absl::StrCat("relayed.batches has ",
                                                         relayed.batches_size(),
                                                         " batches; at most ", kMaxRelayedBatches));
        }
        // Shared ids count once per batch: at most as many in all as one message's worth of ids
        // in the batches themselves.
        if (const int64_t shared =
                int64_t{relayed.shared_cached_ids_size()} * relayed.batches_size();
            shared > kMaxRelayedSharedIds) {
          return absl::InvalidArgumentError(absl::StrCat(
              "relayed.shared_cached_ids has ", relayed.shared_cached_ids_size(), " ids for ",
              relayed.batches_size(), " batches; at most ", kMaxRelayedSharedIds, " in all"));
        }
        for (int i = 0; i < relayed.batches_size(); ++i) {
          if (relayed.batches(i).used_ids_size() > kMaxUsedIds) {
            return absl::InvalidArgumentError(absl::StrCat("relayed.batches[", i, "].used_ids has ",
                                                           relayed.batches(i).used_ids_size(),
                                                           " ids; at most ", kMaxUsedIds));
          }
        }
        std::vector<RequestBatch> batches(relayed.batches_size());
        for (int i = 0; i < relayed.batches_size(); ++i) FromProto(relayed.batches(i), &batches[i]);
        // A batch of an epoch the relay no longer serves is dropped (its rank's own worker hears of
        // its job's end on its own session); the session goes on.
        if (absl::Status s = coordinator_.SubmitRelayed(
                worker_id_, std::move(batches),
                absl::MakeConstSpan(relayed.shared_cached_ids().data(),
                                    static_cast<size_t>(relayed.shared_cached_ids_size())));
            !s.ok()) {
          if (s.code() == absl::StatusCode::kPermissionDenied) {
            // A batch this relay may not carry (its daemon and the coordinator disagree on the
            // job's relay plan: another release) would leave its rank waiting for ever for lists.
            // The session ends instead (ABORTED: the daemon keeps its worker id and reconnects):
            // its daemon stops relaying, and every rank it carried resumes on its own session,
            // which re-sends what the coordinator lacks.
            return absl::AbortedError(
                absl::StrCat("relayed batches refused: ", s.message(), "; relaying ends"));
          }
          spdlog::log(s.code() == absl::StatusCode::kPermissionDenied ||
                              s.code() == absl::StatusCode::kInvalidArgument
                          ? spdlog::level::warn
                          : spdlog::level::debug,
                      "relayed batches from {} dropped: {}", worker_id_, s.ToString());
        }
        return absl::OkStatus();
      }
      case v1::WorkerMessage::kReset: {
        const v1::RankReset& r = m.reset();
        if (r.reason().size() > 4096) {
          return absl::InvalidArgumentError("reset.reason is longer than 4096 bytes");
        }
        if (absl::Status s =
                coordinator_.ResetRank(worker_id_, r.job_id(), r.epoch(), r.rank(), r.reason());
            !s.ok()) {
          spdlog::debug("reset from {} ignored: {}", worker_id_, s.ToString());
        }
        return absl::OkStatus();
      }
      case v1::WorkerMessage::kRankUpdate: {
        RankUpdate update;
        if (absl::Status s = FromProto(m.rank_update(), &update); !s.ok()) return s;
        if (absl::Status s = coordinator_.UpdateRank(worker_id_, update); !s.ok()) {
          spdlog::debug("rank update from {} ignored: {}", worker_id_, s.ToString());
        }
        return absl::OkStatus();
      }
      case v1::WorkerMessage::kOutput: {
        // Bad output (not this worker's rank, a stale epoch, too large, the job ended) is dropped;
        // the session and the rank's job go on.
        const v1::RankOutput& o = m.output();
        OutputStream stream;
        absl::Status s = FromProto(o.stream(), &stream);
        if (s.ok()) {
          s = coordinator_.AppendOutput(worker_id_, o.job_id(), o.epoch(), o.rank(), stream,
                                        o.data(), o.seq());
        }
        if (!s.ok()) {
          spdlog::debug("output of rank {} of job {} from {} dropped: {}", o.rank(), o.job_id(),
                        worker_id_, s.ToString());
        }
        return absl::OkStatus();
      }
      case v1::WorkerMessage::kTimeline: {
        // Like output: spans that do not belong (or are malformed) are dropped, nothing else.
        const v1::TimelineSpans& t = m.timeline();
        std::vector<ExecutionSpan> spans;
        absl::Status s = FromProto(t, &spans);
        if (s.ok()) {
          // Our clock against the worker's when it sent them (its host's may be minutes off).
          // A send time more than a day off is ignored (no host is that far off; nor may a worker
          // make the subtraction overflow).
          constexpr int64_t kDayUs = int64_t{86'400} * 1'000'000;
          const int64_t now_us = absl::ToUnixMicros(absl::Now());
          const int64_t sent_us = t.sent_unix_us();
          const int64_t skew_us =
              sent_us > now_us - kDayUs && sent_us < now_us + kDayUs ? now_us - sent_us : 0;
          s = coordinator_.RecordTimeline(worker_id_, t.job_id(), t.epoch(), t.rank(),
                                          std::move(spans), skew_us);
        }
        if (!s.ok()) {
          spdlog::debug("timeline of rank {} of job {} from {} dropped: {}", t.rank(), t.job_id(),
                        worker_id_, s.ToString());
        }
        return absl::OkStatus();
      }
      case v1::WorkerMessage::kExecution: {
        // Like timeline spans: a report that does not belong (or is malformed) is dropped.
        const v1::RankExecution& e = m.execution();
        const ExecutionTracker::Sample sample{
            .elapsed_ns = e.elapsed_ns(),
            .collectives = e.collectives(),
            .collective_ns = e.collective_ns(),
            .network_ns = e.network_ns(),
            .link_bytes_sent = e.link_bytes_sent(),
            .link_busy_ns = e.link_busy_ns(),
            .link_delivery_rate = e.link_delivery_rate(),
        };
        if (absl::Status s = coordinator_.RecordRankExecution(worker_id_, e.job_id(), e.epoch(),
                                                              e.rank(), sample);
            !s.ok()) {
          spdlog::debug("execution of rank {} of job {} from {} dropped: {}", e.rank(), e.job_id(),
                        worker_id_, s.ToString());
        }
        return absl::OkStatus();
      }
      case v1::WorkerMessage::kClaim: {
        // A refused claim is answered; the session goes on.
        if (absl::Status s =
                coordinator_.ClaimRank(worker_id_, m.claim().job_name(), m.claim().rank());
            !s.ok()) {
          SendClaimRefused(m.claim(), s);
        }
        return absl::OkStatus();
      }
      case v1::WorkerMessage::kOpen:
        return absl::InvalidArgumentError("'open' may only be the first message of a session");
      case v1::WorkerMessage::KIND_NOT_SET:
        break;
    }
    return absl::InvalidArgumentError("worker message has no kind set");
  }

  void Enqueue(Outbound message) {
    absl::MutexLock lock(&mu_);
    if (finishing_) return;
    if (queue_.size() >= kMaxQueuedMessages) {
      const std::string why = absl::StrCat(
          kMaxQueuedMessages, " messages wait to be written to worker ",
          opening_.empty() ? std::string("(not yet open)") : opening_,
          ": it reads its session too slowly, so the session ends (a worker that is merely slow "
          "reconnects and resumes)");
      spdlog::warn("{}", why);
      finishing_ = true;
      final_status_ = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, why);
      // The write in progress may never complete (the worker's transport takes nothing more):
      // cancel it; OnWriteDone then finishes the stream.
      if (writing_) {
        context_->TryCancel();
      } else {
        FinishLocked();
      }
      queue_.erase(queue_.begin() + (writing_ ? 1 : 0), queue_.end());
      return;
    }
    queue_.push_back(std::move(message));
    PumpLocked();
  }

  void PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || finished_) return;
    if (!queue_.empty() && !finishing_) {
      writing_ = true;
      StartWrite(queue_.front().get());
      return;
    }
    if (finishing_) FinishLocked();
  }

  void FinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    Finish(final_status_);
  }

  Coordinator& coordinator_;
  grpc::CallbackServerContext* const context_;  // gRPC's, valid until OnDone
  const std::shared_ptr<WorkerService::CertifiedSessions> certified_;
  grpc::ByteBuffer in_;
  std::string identity_;   // the authenticated caller ("" without authentication)
  std::string worker_id_;  // set once the session is open; read only by reactor callbacks

  absl::Mutex mu_;
  std::deque<Outbound> queue_ ABSL_GUARDED_BY(mu_);
  std::string opening_ ABSL_GUARDED_BY(mu_);  // the worker id the open asked for, for messages
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

const Authenticator WorkerService::kNoAuthentication;

grpc::ServerUnaryReactor* WorkerService::RegisterWorker(grpc::CallbackServerContext* context,
                                                        const v1::RegisterWorkerRequest* request,
                                                        v1::RegisterWorkerResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<Principal> caller = auth_.Authenticate(*context);
  if (!caller.ok()) {
    reactor->Finish(ToGrpcStatus(caller.status()));
    return reactor;
  }
  if (!caller->worker) {
    reactor->Finish(ToGrpcStatus(absl::PermissionDeniedError(
        absl::StrCat(caller->Describe(),
                     " may not register a worker: only a worker identity may (a "
                     "certificate with O=",
                     auth_.options().worker_group, "; a token never makes a worker)"))));
    return reactor;
  }
  absl::StatusOr<Worker> worker = coordinator_.RegisterWorker(
      request->host(), request->device(), {request->labels().begin(), request->labels().end()},
      request->incarnation(), request->address(), caller->name, request->slot());
  if (worker.ok()) {
    response->set_worker_id(worker->id);
    response->set_session_secret(worker->secret);
    response->set_lease_ms(absl::ToInt64Milliseconds(coordinator_.lease()));
    response->set_heartbeat_interval_ms(
        absl::ToInt64Milliseconds(coordinator_.heartbeat_interval()));
  }
  reactor->Finish(ToGrpcStatus(worker.status()));
  return reactor;
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* WorkerService::Session(
    grpc::CallbackServerContext* context) {
  absl::StatusOr<Principal> caller = auth_.Authenticate(*context);
  // Only a worker identity holds a session (the anonymous operator of a coordinator without
  // authentication aside): a user, a token above all, never serves ranks.
  if (caller.ok() && !caller->worker && caller->via != "none") {
    caller =
        absl::PermissionDeniedError(absl::StrCat(caller->Describe(),
                                                 " may not open a worker session: only a worker "
                                                 "certificate may (O=",
                                                 auth_.options().worker_group, ")"));
  }
  return new SessionReactor(coordinator_, context, std::move(caller), certified_);
}

int WorkerService::EndUntrustedSessions(const CertificateTrust& trust) {
  int ended = 0;
  // Under the lock: a session leaves the map (OnDone) before it is deleted, and Close() only
  // queues its end.
  absl::MutexLock lock(&certified_->mu);
  for (const auto& [session, pem] : certified_->pem) {
    if (trust.Trusted(pem)) continue;
    session->Close(absl::UnauthenticatedError(
        "the certificate that opened this session is no longer trusted (its CA left the "
        "coordinator's --tls-ca bundle, or it expired): reconnect with a trusted one"));
    ++ended;
  }
  return ended;
}

}  // namespace ringmaster
