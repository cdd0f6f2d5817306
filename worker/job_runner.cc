#include "worker/job_runner.h"

#include "absl/strings/str_cat.h"
#include "common/coordinator_channels.h"
#include "common/metrics.h"
#include "common/negotiation_wire.h"
#include "common/thread_list.h"
#include "spdlog/spdlog.h"
#include "worker/negotiation/coordinator_session.h"
#include "worker/negotiation/engine_wire.h"

namespace ringmaster {

JobRunner::JobRunner(v1::JobAssignment assignment, const WorkerContext& context, Owner& owner,
                     std::shared_ptr<RankProcess> process)
    : assignment_(std::move(assignment)),
      context_(context),
      options_(*context.options),
      owner_(owner),
      process_(std::move(process)) {
  if (process_ == nullptr) {
    CoordinatorSession* session = context_.session;
    process_ = std::make_shared<RankProcess>(
        [session](const v1::WorkerMessage& m) { session->Send(m).IgnoreError(); });
  } else {
    started_ = true;  // the process goes on from the previous epoch
  }
}

JobRunner::~JobRunner() = default;

bool JobRunner::elastic() const {
  return assignment_.job().spec().min_np() > 0 || assignment_.job().spec().max_np() > 0;
}

bool JobRunner::ready() const {
  absl::MutexLock lock(&state_mu_);
  return ready_;
}

bool JobRunner::DeferStop() {
  absl::MutexLock lock(&state_mu_);
  if (ready_) return false;
  stop_requested_ = true;
  return true;
}

bool JobRunner::CanHandOverProcess() const {
  return ready() && !stopped_ && process_->pid() != 0 && !process_->exited();
}

size_t JobRunner::client_bytes() const { return options_.arena_bytes / 4 * 3; }

void JobRunner::Start(const std::shared_ptr<JobRunner>& previous) {
  const v1::Job& spec = assignment_.job();
  if (previous != nullptr) {
    spdlog::info("job {} epoch {}: rank {} of {} (rank {} in epoch {})", spec.id(), epoch(), rank(),
                 spec.spec().np(), previous->rank(), previous->epoch());
    previous->HandOver(absl::AbortedError(absl::StrCat(
        "job ", spec.id(), " epoch ", previous->epoch(), " ended: its ranks changed (epoch ",
        epoch(), " has ", spec.spec().np(), "); reset into the new epoch (hvd.elastic)")));
    process_->FollowEpoch(assignment_);
  } else {
    spdlog::info("job {} rank {} of {}: starting", spec.id(), rank(), spec.spec().np());
  }
  if (absl::Status s = BuildArena(); !s.ok()) {
    FailStart(std::string(s.message()));
    return;
  }
  absl::StatusOr<LocalAddress> address = context_.data_address();
  if (!address.ok()) {
    FailStart(
        absl::StrCat("worker has no address for the data plane: ", address.status().message()));
    return;
  }
  EngineOptions e = EngineOptionsFor();
  // The device side fails the rank by itself (an NCCL error, a collective past its deadline): the
  // coordinator fails the job, and stops the other ranks, with this message. It lives inside this
  // runner, so the callback never outlives it.
  absl::StatusOr<ExecutorParts> executor = MakeExecutor(ExecutorSetup{
      .assignment = assignment_,
      .context = context_,
      .arena = arena_->data(),
      .outputs = outputs_.get(),
      .journal = rendezvous_,
      .address = *address,
      .on_device_failure =
          [this](const absl::Status& s) {
            SendRankUpdate(v1::RANK_STATE_EXITED, 1, std::string(s.message()), /*failed=*/true);
          },
      .clocks = clocks_,
  });
  if (!executor.ok()) {
    FailStart(absl::StrCat("worker could not set up cuda:", context_.cuda_device, ": ",
                           executor.status().message()));
    return;
  }
  e.executor = std::move(executor->executor);
  device_ = std::move(executor->device);
  engine_ = std::make_unique<Engine>(std::move(e));
  StartRelay();
  // Before the runner is ready: a stop may release it from then on, on another thread.
  StartReporter();
  // Ready before the engine starts: responses can only follow the requests it will send, and must
  // find it (Start may run on a cleanup thread, not the session thread).
  bool stop_requested;
  {
    absl::MutexLock lock(&state_mu_);
    ready_ = true;
    stop_requested = stop_requested_;
  }
  engine_->Start();
  if (stop_requested) {
    Stop(absl::AbortedError(absl::StrCat("job ", spec.id(), " stopped while starting")));
    return;
  }
  if (previous != nullptr) return;  // the rank's process runs on: it resets into this epoch
  if (spec.spec().command().empty()) {
    spdlog::info("job {} rank {}: waiting for a training process on {}", spec.id(), rank(),
                 options_.socket_path);
    return;  // STARTED when the process attaches
  }
  process_->StartWaiter([self = shared_from_this()]() mutable { RunRank(std::move(self)); });
}

absl::Status JobRunner::BuildArena() {
  const std::string name = absl::StrCat("ringmaster-", job_id(), "-", epoch(), "-rank-", rank());
  absl::StatusOr<std::unique_ptr<SharedMemory>> arena =
      SharedMemory::Create(name, options_.arena_bytes);
  if (!arena.ok()) {
    return absl::Status(arena.status().code(), absl::StrCat("worker could not create its arena: ",
                                                            arena.status().message()));
  }
  arena_ = *std::move(arena);
  outputs_ = std::make_unique<ArenaAllocator>(client_bytes(), options_.arena_bytes);
  return absl::OkStatus();
}

EngineOptions JobRunner::EngineOptionsFor() {
  const v1::Job& spec = assignment_.job();
  EngineOptions e;
  e.job_id = spec.id();
  e.epoch = epoch();
  e.rank = rank();
  e.size = spec.spec().np();
  e.host = options_.host_name;
  e.arena_bytes = arena_->size();
  e.cycle_time =
      absl::Microseconds(static_cast<int64_t>(spec.spec().knobs().cycle_time_ms() * 1000));
  // Horovod records the timeline's execution rows on rank 0.
  e.timeline = rank() == 0 && !spec.spec().knobs().timeline().empty();
  e.wall_clock_offset = context_.wall_clock_offset;
  e.metrics = options_.record_metrics ? context_.metrics : nullptr;
  e.clocks = clocks_;
  CoordinatorSession* session = context_.session;
  e.send_span = [session, job_id = spec.id(), epoch = epoch(), rank = rank()](
                    const ExecutionSpan& span, int64_t sent_unix_us) {
    v1::WorkerMessage m;
    v1::TimelineSpans* spans = m.mutable_timeline();
    spans->set_job_id(job_id);
    spans->set_epoch(epoch);
    spans->set_rank(rank);
    ToProto(span, spans->add_spans());
    spans->set_sent_unix_us(sent_unix_us);
    session->Send(m).IgnoreError();  // best effort
  };
  ledger_ = std::make_unique<SessionLedger>(rank());
  // The engine lives inside this runner: the hook never outlives it.
  e.send_requests = [this, session](const RequestBatch& batch) {
    // Request batches are numbered and kept until acknowledged: one that cannot go now goes when
    // the next session resumes.
    v1::WorkerMessage numbered;
    ToProto(batch, numbered.mutable_requests());
    absl::MutexLock send_lock(&send_mu_);
    if (!ledger_->Prepare(numbered)) return;
    // Through the host's relay while it relays (the relay itself sends its own with its peers').
    if (relay_hub_ != nullptr && relay_hub_->Submit(numbered.requests())) return;
    if (relay_link_ != nullptr) {
      const RelayLink::Sent sent = relay_link_->Send(numbered.requests());
      if (sent != RelayLink::Sent::kDirect) return;  // taken, or held for the resume
    }
    if (absl::Status s = session->Send(numbered); !s.ok()) {
      spdlog::info("request batch {} kept for the next session: {}", numbered.requests().seq(),
                   s.ToString());
      ledger_->Lost();
    }
  };
  return e;
}

void JobRunner::StartRelay() {
  const RelayPlan plan = PlanRelay(assignment_);
  if (plan.relay_rank < 0) return;
  auto store = std::make_shared<RendezvousClient>(context_.channel, job_id(), epoch(), rendezvous_,
                                                  assignment_.rendezvous_token());
  if (plan.relays(rank())) {
    StartRelayHub(plan, std::move(store));
  } else {
    StartRelayLink(plan, std::move(store));
  }
}

void JobRunner::StartRelayHub(const RelayPlan& plan, std::shared_ptr<RendezvousClient> store) {
  const v1::Job& spec = assignment_.job();
  RelayHub::Options o;
  o.job_id = spec.id();
  o.epoch = epoch();
  o.rank = rank();
  o.peers.assign(plan.ranks.begin() + 1, plan.ranks.end());
  o.token = assignment_.rendezvous_token();
  o.store = store;
  // Said off this thread (a session's): the rendezvous may take a while. Its peers find no relay
  // at once and negotiate on their own sessions.
  auto no_relay = [this, store](const absl::Status& why) {
    spdlog::warn("job {} rank {}: cannot relay for its group's ranks: {}", job_id(), rank(),
                 why.ToString());
    context_.finishers->Start(
        [store, rank = rank()] { store->Set(RelayKey(rank), "").IgnoreError(); });
  };
  if (plan.spans_hosts) {
    // Its group's other hosts reach it where they reach its data plane.
    absl::StatusOr<LocalAddress> address = context_.data_address();
    if (!address.ok()) {
      no_relay(address.status());
      return;
    }
    o.tcp_address = address->address;
  }
  CoordinatorSession* session = context_.session;
  o.send = [session](const v1::WorkerMessage& m) { return session->Send(m); };
  o.linger = absl::Microseconds(static_cast<int64_t>(spec.spec().knobs().cycle_time_ms() * 1000));
  if (options_.record_metrics) {
    o.metrics = context_.metrics;
    o.host = options_.host_name;
  }
  // What the hub held is lost: the rank's own batches wait for a resume, which re-sends them.
  o.on_failed = [this, session](const std::string&) {
    ledger_->Lost();
    if (!process_->exited() && !stopped_ && !epoch_ended_) session->Interrupt();
  };
  absl::StatusOr<std::unique_ptr<RelayHub>> hub = RelayHub::Start(std::move(o));
  if (!hub.ok()) {
    no_relay(hub.status());
    return;
  }
  relay_hub_ = *std::move(hub);
  spdlog::info(
      "job {} rank {}: relays the negotiation of {} ranks{}", spec.id(), rank(), plan.ranks.size(),
      plan.spans_hosts ? absl::StrCat(" of its hosts, at ", relay_hub_->name()) : " of its host");
}

void JobRunner::StartRelayLink(const RelayPlan& plan, std::shared_ptr<RendezvousClient> store) {
  RelayLink::Options o;
  o.job_id = job_id();
  o.epoch = epoch();
  o.rank = rank();
  o.relay_rank = plan.relay_rank;
  o.token = assignment_.rendezvous_token();
  o.store = std::move(store);
  o.on_list = [this](v1::ResponseList list) { ApplyLists(std::move(list)); };
  // The batches the link may have lost are in the ledger: held from now on, and re-sent by the
  // resume that interrupting the session brings.
  CoordinatorSession* session = context_.session;
  o.on_lost = [this, session, relay_rank = plan.relay_rank](const absl::Status& why) {
    ledger_->Lost();
    // A rank whose process has exited negotiates nothing more (the relay's rank may end first).
    if (process_->exited() || stopped_ || epoch_ended_) return;
    spdlog::warn(
        "job {} rank {}: negotiating on its own session from now on: the link to relay "
        "rank {} {}",
        job_id(), rank(), relay_rank, std::string(why.message()));
    session->Interrupt();
  };
  relay_link_ = RelayLink::Start(std::move(o));
}

void JobRunner::EndRelay(const std::string& why) {
  if (relay_hub_ != nullptr) relay_hub_->Fail(why);
  if (relay_link_ != nullptr) relay_link_->Stop();
}

void JobRunner::ApplyLists(v1::ResponseList list) {
  absl::MutexLock apply_lock(&apply_mu_);
  // In cycle order, once each (the reliable session).
  for (const v1::ResponseList& in_order : ledger_->Accept(std::move(list))) {
    RankCycle cycle;
    FromProto(in_order, &cycle);
    engine_->OnResponses(std::move(cycle));
  }
}

void JobRunner::DeliverRelayed(const v1::RelayedResponses& relayed) {
  if (relay_hub_ == nullptr) return;
  if (std::optional<v1::ResponseList> own = relay_hub_->Deliver(relayed)) {
    ApplyLists(*std::move(own));
  }
}

void JobRunner::Resumed(const v1::SessionResumed& r) {
  absl::MutexLock send_lock(&send_mu_);
  // Resumed on its own session: the rank negotiates on it for the rest of the epoch (its batches
  // must not take two paths, which could reorder them).
  if (relay_link_ != nullptr) relay_link_->EndRelaying();
  std::vector<v1::WorkerMessage> again = ledger_->Resumed(r.last_request_seq());
  spdlog::info("job {} rank {}: session resumed; re-sending {} request batches", r.job_id(),
               r.rank(), again.size());
  for (const v1::WorkerMessage& batch : again) {
    if (!context_.session->Send(batch).ok()) {
      ledger_->Lost();  // the next session resumes again
      break;
    }
  }
}

void JobRunner::FillResume(v1::SessionOpen* open) {
  v1::RankResume* resume = open->add_resume();
  resume->set_job_id(job_id());
  resume->set_epoch(epoch());
  ledger_->FillResume(resume);
  // A restarted coordinator lost the rendezvous keys set before: a rank still meeting its peers
  // would wait for them for ever. Set again (on a thread of its own: this one opens the session).
  if (rendezvous_->keys().empty()) return;
  context_.finishers->Start([channel = context_.channel, self = shared_from_this()] {
    // With the journal: a stop of the job cancels this too (recording its keys again is a no-op).
    RendezvousClient client(channel, self->job_id(), self->epoch(), self->rendezvous_,
                            self->assignment_.rendezvous_token());
    if (absl::Status s = client.Republish(*self->rendezvous_); !s.ok()) {
      spdlog::warn("job {} rank {}: rendezvous keys not published again: {}", self->job_id(),
                   self->rank(), s.ToString());
    }
  });
}

void JobRunner::SessionLost(const absl::Status& status) {
  ledger_->Lost();
  if (relay_hub_ != nullptr) {
    relay_hub_->Fail(absl::StrCat("its session ended: ", status.message()));
  }
}

void JobRunner::StopFor(const absl::Status& reason, int64_t epoch) {
  if (epoch > 0 && epoch < this->epoch()) return;  // an epoch this rank has left
  if (DeferStop()) return;                         // Start() stops it as soon as it is built
  if (epoch > 0 && elastic() && !stopped_) {
    EndEpochWaiting(reason);
    return;
  }
  Stop(reason);
}

void JobRunner::EndEpochWaiting(const absl::Status& reason) {
  // Too few ranks are left for a new epoch: the process waits (in its reset) for the next.
  if (epoch_ended_.exchange(true)) return;
  spdlog::info("job {} epoch {} ended: {}", job_id(), epoch(), reason.ToString());
  rendezvous_->Cancel();
  engine_->Abort(reason);
}

void JobRunner::Stop(const absl::Status& reason) {
  if (stopped_.exchange(true)) return;
  EndRelay("its rank stops");
  spdlog::info("stopping job {} epoch {}: {}", job_id(), epoch(), reason.ToString());
  // A rank still meeting its peers stops waiting for the coordinator.
  rendezvous_->Cancel();
  // Pending operations fail at once with the reason; the process gets SIGTERM, then SIGKILL.
  engine_->Abort(reason);
  if (process_->launched()) {
    // Not detached: the runner must not outlive the daemon (its engine's gauges live in its
    // metrics). The process's waiter finishes the rank.
    context_.finishers->Start(
        [self = shared_from_this()] { self->process_->Terminate(self->options_.stop_grace); });
  } else {
    Finish();
  }
}

void JobRunner::FailStart(const std::string& why) {
  SendRankUpdate(v1::RANK_STATE_EXITED, 1, why);
  if (process_->pid() == 0) {
    Finish();
    return;
  }
  // An elastic job's process from an earlier epoch: it stops, and its waiter finishes the rank.
  stopped_ = true;
  context_.finishers->Start(
      [process = process_, grace = options_.stop_grace] { process->Terminate(grace); });
}

void JobRunner::HandOver(const absl::Status& reason) {
  epoch_ended_ = true;
  EndRelay("its epoch ended");
  attachment_.Close();    // no welcome into it any more: its arena goes
  rendezvous_->Cancel();  // a rank still meeting its old peers stops
  engine_->Abort(reason);
  // The engine's threads (a Gloo pair still connecting to a peer that is gone ends within the
  // collective timeout) and the epoch's arena go on a thread of their own; the process does not.
  context_.finishers->Start([self = shared_from_this()] {
    self->engine_->Stop();
    self->arena_.reset();  // unmapped here; the process unmaps its view when it lets go of it
  });
}

void JobRunner::RequestReset(const std::string& why) {
  if (reset_sent_.exchange(true)) return;
  spdlog::info("job {} epoch {}: rank {} asks for a new epoch: {}", job_id(), epoch(), rank(), why);
  v1::WorkerMessage m;
  v1::RankReset* r = m.mutable_reset();
  r->set_job_id(job_id());
  r->set_epoch(epoch());
  r->set_rank(rank());
  r->set_reason(why.substr(0, 4096));
  if (absl::Status s = context_.session->Send(m); !s.ok()) {
    reset_sent_ = false;  // asked again at the process's next try
    spdlog::warn("reset of job {} not delivered: {}", job_id(), s.ToString());
  }
}

void JobRunner::SendRankUpdate(v1::RankState state, int exit_code, const std::string& text,
                               bool failed) {
  v1::WorkerMessage m;
  v1::RankUpdate* u = m.mutable_rank_update();
  u->set_job_id(job_id());
  u->set_epoch(epoch());
  u->set_rank(rank());
  u->set_state(state);
  u->set_exit_code(exit_code);
  u->set_message(text.substr(0, 4096));
  u->set_failed(failed);
  if (absl::Status s = context_.session->Send(m); !s.ok()) {
    spdlog::warn("rank update not delivered: {}", s.ToString());
  }
}

void JobRunner::RunRank(std::shared_ptr<JobRunner> first) {
  const v1::Job& spec = first->assignment_.job();
  absl::Status s = first->process_->MakeDir(
      first->options_.work_dir, first->assignment_, [&](const std::string& archive) {
        RendezvousClient client(first->context_.channel, spec.id(), first->epoch(),
                                first->rendezvous_, first->assignment_.rendezvous_token());
        return client.FetchSource(archive);
      });
  if (s.ok()) s = first->Launch();
  if (!s.ok()) {
    if (first->stopped_) return;  // the stop found no process: it finishes the rank
    first->SendRankUpdate(v1::RANK_STATE_EXITED, 127, std::string(s.message()));
    first->Finish();
    return;
  }
  // An elastic job's process outlives its first epoch: the first epoch's runner (its arena, its
  // GPU side) is not held while the process runs.
  std::shared_ptr<RankProcess> process = first->process_;
  Owner& owner = first->owner_;
  std::weak_ptr<JobRunner> weak_first = first;
  first.reset();
  const ChildExit exit = process->Wait();
  // Its exit is the current epoch's, once that is built (Start is quick; bounded here).
  std::shared_ptr<JobRunner> current;
  for (int i = 0; i < 500; ++i) {
    current = owner.Current();
    if (current != nullptr && current->process_ != process) current = nullptr;
    if (current == nullptr || current->ready() || current->stopped()) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  if (current == nullptr || (!current->ready() && !current->stopped())) current = weak_first.lock();
  if (current == nullptr) return;  // every epoch of it was cleaned up already
  current->Exited(exit);
}

absl::Status JobRunner::Launch() {
  const RankPlace place{options_.socket_path, options_.coordinator, process_->dir()};
  if (absl::Status s = process_->Launch(assignment_, place, [this] { return stopped_.load(); });
      !s.ok()) {
    return s;
  }
  started_ = true;
  SendRankUpdate(v1::RANK_STATE_STARTED, 0, "");
  return absl::OkStatus();
}

void JobRunner::Exited(const ChildExit& exit) {
  spdlog::info("job {} rank {}: process exited with {} {}", job_id(), rank(), exit.exit_code,
               exit.message);
  // Before the exit is reported: the job's end must find the rank's files among its artifacts.
  // A failed send costs the files, not the job.
  RendezvousClient files(context_.channel, job_id(), epoch(), nullptr,
                         assignment_.rendezvous_token());
  int32_t sent_files = 0;
  int64_t sent_bytes = 0;
  if (absl::Status put =
          files.PutOutput(rank(), process_->dir() + "/output", &sent_files, &sent_bytes);
      !put.ok()) {
    spdlog::warn("job {} rank {}: its output files were not all kept: {}", job_id(), rank(),
                 put.ToString());
  } else if (sent_files > 0) {
    spdlog::info("job {} rank {}: sent {} output files ({} bytes)", job_id(), rank(), sent_files,
                 sent_bytes);
  }
  // Peers in a collective with this rank learn why it ended (their error names it), not that a
  // job was "stopped".
  if (ready() && engine_ != nullptr && !stopped_) {
    const v1::RankInfo& me = assignment_.job().ranks(rank());
    engine_->Abort(absl::CancelledError(absl::StrCat(
        "rank ", rank(), " on host ", me.host(), " exited with status ", exit.exit_code,
        exit.message.empty() ? "" : absl::StrCat(" (", exit.message, ")"))));
  }
  // Also when the job stopped it: the coordinator then knows the rank's output is all there (it
  // came first) and ends the job's log without waiting out its linger.
  SendRankUpdate(v1::RANK_STATE_EXITED, exit.exit_code, exit.message);
  Finish();
}

void JobRunner::Finish() {
  // Cleanup joins the engine and the waiter, so it runs on a thread of its own.
  context_.finishers->Start([self = shared_from_this()] { self->Release(); });
}

void JobRunner::StartReporter() {
  CoordinatorSession* session = context_.session;
  reporter_ = std::make_unique<ExecutionReporter>(
      clocks_,
      [session, job_id = job_id(), epoch = epoch(),
       rank = rank()](const ExecutionClocks::Totals& t) {
        v1::WorkerMessage m;
        v1::RankExecution* e = m.mutable_execution();
        e->set_job_id(job_id);
        e->set_epoch(epoch);
        e->set_rank(rank);
        e->set_elapsed_ns(t.elapsed_ns);
        e->set_collectives(t.collectives);
        e->set_collective_ns(t.collective_ns);
        e->set_network_ns(t.network_ns);
        e->set_link_bytes_sent(t.link_bytes_sent);
        e->set_link_busy_ns(t.link_busy_ns);
        e->set_link_delivery_rate(t.link_delivery_rate);
        session->Send(m).IgnoreError();  // best effort: the next one says it all again
      },
      kReportEvery, options_.record_metrics ? context_.metrics : nullptr,
      Labels{{"job", job_id()}, {"rank", absl::StrCat(rank())}, {"host", options_.host_name}});
}

void JobRunner::Release() {
  if (reporter_ != nullptr) reporter_->Stop();
  rendezvous_->Cancel();  // its engine may still be meeting its peers
  EndRelay("its rank finished");
  // A Gloo pair connecting to a peer that is gone cannot be cancelled (it gives up after the
  // collective timeout): the slot does not wait for it. The runner, its arena included, stays
  // until the engine has stopped, on a thread of its own. A GPU slot waits: the old job's device
  // arena and NCCL setup would leave the next one short of GPU memory.
  bool stopped = true;
  const absl::Duration wait =
      device_.device != nullptr ? absl::InfiniteDuration() : absl::Seconds(1);
  if (engine_ != nullptr && !engine_->StopWithin(wait)) {
    stopped = false;
    spdlog::info(
        "job {} rank {}: its communicator setup ends within the collective timeout; the slot is "
        "free now",
        job_id(), rank());
    context_.finishers->Start([self = shared_from_this()] { self->engine_->Stop(); });
  }
  process_->JoinWaiter();
  attachment_.Close();  // no welcome into this rank any more
  owner_.DisconnectLocal();
  process_->RemoveDir();  // the rank's code and output (sent already)
  // The memory goes once the training process has unmapped it too (and, when the engine is still
  // stopping, once that thread drops the runner).
  if (stopped) arena_.reset();
  owner_.Finished(shared_from_this());
}

}  // namespace ringmaster
