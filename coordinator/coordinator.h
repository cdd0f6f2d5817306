// The coordinator's composition root and the glue between its parts: it owns the job registry, the
// worker registry, the rendezvous store, the jobs' output (logs) and artifacts, and one JobRuntime
// per running job (coordinator/job_runtime.h: its negotiator, throughput, timeline, autotuner), in
// dependency order, and implements the operations the services expose. Transport-free: services
// translate messages and call it; it talks to workers through WorkerChannel.
//
// Where each part is implemented: jobs, registration and scheduling in coordinator.cc; workers'
// sessions (heartbeats, request batches, rank updates) in coordinator_sessions.cc; logs and
// artifacts in coordinator_outputs.cc; the rendezvous store in coordinator_rendezvous.cc; the
// ticker and housekeeping (leases, settled failures, start timeouts) in coordinator_liveness.cc;
// resuming the jobs a durable store says were running when the coordinator restarted in
// coordinator_restore.cc.
// A job's negotiation state is its JobRuntime's.
//
// Thread-safe. mu_ guards the job runtimes, the pending failures and the worker channels. Channels
// are called with mu_ held: their methods only queue a message (they never block or call back), and
// holding mu_ keeps a closing session's channel alive. Watchers, log followers and runtimes are
// called with mu_ released. Slow work (opening a placed job's runtime, ending a job: file I/O) goes
// to the injected executor, so a gRPC callback that triggers it never blocks on it.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "common/executor.h"
#include "common/metrics.h"
#include "common/source_archive.h"
#include "coordinator/artifact_store.h"
#include "coordinator/job_registry.h"
#include "coordinator/job_runtime.h"
#include "coordinator/log_store.h"
#include "coordinator/rendezvous_store.h"
#include "coordinator/source_store.h"
#include "coordinator/worker_channel.h"
#include "coordinator/worker_registry.h"

namespace ringmaster {

struct CoordinatorOptions {
  Clock* clock = Clock::Real();  // borrowed; must outlive the coordinator
  // Runs what gRPC callback threads must not (opening and closing jobs' files, ending jobs); null:
  // Executor::Inline(), at once on the caller's thread (tests). Borrowed; must outlive the
  // coordinator, and every task posted must have run before it is destroyed.
  Executor* executor = nullptr;
  std::unique_ptr<JobStore> store = JobStore::InMemory();
  absl::Duration lease = absl::Seconds(10);
  absl::Duration heartbeat_interval = absl::Seconds(2);
  // A busy worker whose session broke (a daemon killed, a host gone) is lost after this long unless
  // it reconnects; its job fails then, well before the lease would run out.
  absl::Duration reconnect_grace = absl::Seconds(2);
  // A rank's non-zero exit fails its job after this long, unless a worker of the job disconnects
  // meanwhile: then the failure names that worker first (the exit was most likely its consequence).
  absl::Duration failure_settle = absl::Milliseconds(300);
  // A job still STARTING this long after it was placed (some rank never reported STARTED) fails,
  // naming those ranks.
  absl::Duration start_timeout = absl::Minutes(5);
  // After a restart, how long a job that was running waits for its ranks' daemons to reattach;
  // a rank not back by then fails the job, named.
  absl::Duration resume_timeout = absl::Minutes(1);
  // How often Tick() expires leases, checks stalls and expires rendezvous waiters.
  absl::Duration housekeeping_interval = absl::Milliseconds(100);
  // Ended jobs are kept this long after they ended, and at most this many, then removed with their
  // logs and artifacts (the oldest first; checked every `retention_check` on the executor).
  absl::Duration job_retention = absl::Hours(24 * 7);
  // At most this many jobs that have not ended (RegisterJob: RESOURCE_EXHAUSTED past it).
  int64_t max_active_jobs = 1000;
  // One user's share (JobRegistry::Limits): jobs not ended, and registrations in any minute
  // (0: no bound).
  int64_t max_active_jobs_per_user = 0;
  int64_t max_registrations_per_minute = 0;
  int64_t max_ended_jobs = 10'000;
  absl::Duration retention_check = absl::Minutes(1);
  // Output kept per rank (oldest dropped first), and by all jobs together (ended jobs' logs
  // dropped, oldest first, beyond it).
  int64_t log_bytes_per_rank = int64_t{4} << 20;
  int64_t log_bytes_total = int64_t{1} << 30;
  // How long output of a job's ranks is still accepted after the job ended, unless every rank had
  // exited: when one rank fails, the others' last words (printed just before) may still be on their
  // way. Followers of the job's logs end after it.
  absl::Duration log_linger = absl::Seconds(7);
  // Where the logs are also written, to survive a restart (null: memory alone).
  std::unique_ptr<LogJournal> log_journal;
  // Where jobs' artifacts (timelines, autotune logs) are kept: <dir>/<job id>/<name>. Jobs' code
  // archives go to <dir>/.sources.
  std::string artifacts_dir = DefaultArtifactsDir(ArtifactsInstanceName(""));
  // The largest code archive a job may carry (SubmitJob).
  int64_t max_source_bytes = kDefaultMaxSourceBytes;
  // What one rank may leave in its output directory (PutRankOutput): bytes and files.
  int64_t max_output_bytes_per_rank = int64_t{1} << 30;
  int64_t max_output_files_per_rank = 10'000;
};

// Most output bytes one RankOutput message may carry.
inline constexpr int64_t kMaxOutputMessageBytes = int64_t{1} << 20;

struct RankResume {
  std::string job_id;
  int64_t epoch = 0;
  int32_t rank = 0;
  uint64_t last_response_seq = 0;
  // For a restarted coordinator: the last batch the rank numbered, and the lists it applied that
  // not every rank was known to have.
  uint64_t last_request_seq = 0;
  std::vector<std::shared_ptr<CycleBroadcast>> retained;
};

struct RankUpdate {
  std::string job_id;
  int64_t epoch = 0;
  int32_t rank = 0;
  RankState state = RankState::kStarted;
  int32_t exit_code = 0;
  std::string message;
  bool failed = false;  // the rank's data plane failed (its process may still run)
};

class Coordinator {
 public:
  explicit Coordinator(CoordinatorOptions options);
  ~Coordinator();

  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // Coordinator metrics (jobs and workers by state, negotiation cycles and latency, tensors,
  // response cache, stalls); served at /metrics by the server.
  MetricsRegistry& metrics() { return metrics_; }

  absl::Duration lease() const { return workers_.lease(); }
  // The number of ranks of a job with a runtime (placed and not ended), else 0.
  int RanksOf(const std::string& job_id) const;
  const std::string& artifacts_dir() const { return artifacts_.root(); }
  // Jobs' code archives; SubmitJob uploads into it, then registers the job.
  SourceStore& sources() { return sources_; }
  int64_t max_output_bytes_per_rank() const { return max_output_bytes_per_rank_; }
  int64_t max_output_files_per_rank() const { return max_output_files_per_rank_; }
  absl::Duration heartbeat_interval() const { return heartbeat_interval_; }

  // Jobs.
  // Owned by `owner`: the authenticated user's name ("" without authentication).
  absl::StatusOr<Job> RegisterJob(JobSpec spec, std::string owner = "");
  // With live throughput while the job has a runtime.
  absl::StatusOr<Job> GetJob(const std::string& id) const;
  // Who owns the job (Job::owner); NOT_FOUND for an unknown one.
  absl::StatusOr<std::string> JobOwner(const std::string& id) const {
    absl::StatusOr<Job> job = jobs_.Get(id);
    if (!job.ok()) return job.status();
    return job->owner;
  }
  // Newest first; PENDING jobs with their waiting reason.
  std::vector<Job> ListJobs(const std::vector<JobState>& states) const;
  // Ends the job CANCELLED on the caller's thread (file I/O: closing its timeline).
  absl::StatusOr<Job> CancelJob(const std::string& id, std::string reason);
  // The same, for callers that must not block: checks the request at once, then cancels on the
  // executor and calls `done` there (or at once, with the error).
  void CancelJob(const std::string& id, std::string reason,
                 std::function<void(absl::StatusOr<Job>)> done);
  absl::StatusOr<int64_t> WatchJob(const std::string& id, JobRegistry::Watcher watcher) {
    return jobs_.Watch(id, std::move(watcher));
  }
  void UnwatchJob(const std::string& id, int64_t watch_id) { jobs_.Unwatch(id, watch_id); }

  // Workers.
  absl::StatusOr<Worker> RegisterWorker(std::string host, std::string device,
                                        std::map<std::string, std::string> labels,
                                        uint64_t incarnation = 0, std::string address = "",
                                        std::string identity = "", std::string slot = "");
  // Whether `identity`, holding `secret`, may open the session of `worker_id`
  // (WorkerRegistry::CheckSessionProof).
  absl::Status CheckSessionProof(const std::string& worker_id, const std::string& identity,
                                 const std::string& secret) {
    return workers_.CheckSessionProof(worker_id, identity, secret);
  }
  std::vector<Worker> ListWorkers() const { return workers_.List(); }
  // Attaches the worker's session. `channel` is borrowed until CloseSession(). NOT_FOUND for an
  // unknown worker (or one that another daemon `incarnation` registered), FAILED_PRECONDITION for
  // one whose lease expired.
  absl::Status OpenSession(const std::string& worker_id, WorkerChannel* channel,
                           uint64_t incarnation = 0);
  // After OpenSession, a reconnected worker's `resume` (what it received of the ranks it serves):
  // the response lists each rank missed are re-sent on `channel`, then SendResumed says which
  // request batch the runtime has last, so the worker re-sends the later ones. A rank too far
  // behind (lists no longer kept) fails its job.
  void ResumeRanks(const std::string& worker_id, WorkerChannel* channel,
                   const std::vector<RankResume>& resume);
  void CloseSession(const std::string& worker_id, WorkerChannel* channel);
  absl::Status Heartbeat(const std::string& worker_id);
  // FAILED_PRECONDITION when the worker does not serve that rank of that job; ABORTED for a stale
  // epoch.
  absl::Status SubmitRequests(const std::string& worker_id, RequestBatch batch);
  // Negotiation relay: batches of ranks relayed by worker `relay_id`, sent by it. Each is taken as
  // its rank's own worker's (SubmitRequests) when the relay serves a rank of the same job epoch,
  // the job's relay plan (common/relay_plan.h: its host's lowest rank, or its group of hosts' with
  // negotiation_relay_hosts) names that rank the batch's rank's relay, and the batch's rank's
  // worker registered the relay's identity; the rank's lists then go back through the relay. The
  // others are dropped, and the first such error is returned (PERMISSION_DENIED naming the ranks
  // and both hosts; as SubmitRequests otherwise).
  // `shared_cached_ids` (RelayedBatches.shared_cached_ids) count as part of every batch: they are
  // submitted for the ranks whose batches were taken, ahead of those batches' full requests (see
  // JobRuntime::SubmitRelayed). One flush follows the whole lot.
  absl::Status SubmitRelayed(const std::string& relay_id, std::vector<RequestBatch> batches,
                             absl::Span<const uint32_t> shared_cached_ids = {});
  absl::Status UpdateRank(const std::string& worker_id, const RankUpdate& update);
  // Elastic jobs: rank `rank` of epoch `epoch` reset (its training process left the epoch and waits
  // for the next): the job starts a new epoch (after CoordinatorOptions::failure_settle, so that a
  // dead peer's broken session is seen first and it is left out). FAILED_PRECONDITION for a job
  // that is not elastic or a rank the worker does not serve; ABORTED for a stale epoch.
  absl::Status ResetRank(const std::string& worker_id, const std::string& job_id, int64_t epoch,
                         int32_t rank, const std::string& reason);
  // A training process attached to idle worker `worker_id` claims rank `rank` of the pending
  // attached job named `job_name` (JobSpec::attached). Claiming the same rank again is a no-op;
  // the job is placed, ranks on the claiming workers, when all its ranks are claimed. NOT_FOUND:
  // no such job is pending; INVALID_ARGUMENT: no such rank; ALREADY_EXISTS: another worker holds
  // it; FAILED_PRECONDITION: the worker is busy or holds another rank.
  absl::Status ClaimRank(const std::string& worker_id, const std::string& job_name, int32_t rank);
  // A whole line of a rank's output that begins with this becomes one of the job's events
  // ("rank R: TEXT", TEXT at most kMaxRankNoticeBytes; the same one once; at most kMaxRankNotices
  // per job): how a rank's own tooling says something to whoever watches the job.
  static constexpr absl::string_view kRankNoticePrefix = "ringmaster-notice: ";
  static constexpr size_t kMaxRankNoticeBytes = 512;
  // Stores output of a rank's training process. Validated like SubmitRequests (FAILED_PRECONDITION,
  // ABORTED); INVALID_ARGUMENT for more than kMaxOutputMessageBytes. After the job ended, output
  // from the worker that served the rank is accepted for CoordinatorOptions::log_linger, then
  // refused (FAILED_PRECONDITION): a worker forwards a rank's output before reporting it EXITED.
  // `seq`: the rank's chunk number (0: none); a re-sent chunk already stored is dropped.
  absl::Status AppendOutput(const std::string& worker_id, const std::string& job_id, int64_t epoch,
                            int32_t rank, OutputStream stream, std::string data, uint64_t seq = 0);

  // Logs: the jobs' output, kept after they end. A reader checks its query once (NOT_FOUND for an
  // unknown job, INVALID_ARGUMENT for a rank outside [0, np); LogStore::kAllRanks: every rank),
  // then reads from a cursor; a follower also subscribes to be woken by more output or the end.
  absl::Status CheckLogQuery(const std::string& job_id, int32_t rank) const;
  LogRead ReadLogs(const std::string& job_id, int32_t rank, int64_t after, int64_t max_bytes,
                   int64_t until = std::numeric_limits<int64_t>::max()) const {
    return logs_.Read(job_id, rank, after, max_bytes, until);
  }
  int64_t LogHead(const std::string& job_id) const { return logs_.Head(job_id); }
  // NOT_FOUND for an unknown job. See LogStore::Subscriber for what `wake` may do.
  absl::StatusOr<int64_t> FollowLogs(const std::string& job_id, LogStore::Subscriber wake);
  void UnfollowLogs(const std::string& job_id, int64_t id) { logs_.Unsubscribe(job_id, id); }

  // What rank `rank`'s worker executed, for the job's timeline (ignored when the job has none).
  // Validated like SubmitRequests.
  // `skew_us`: the coordinator's clock minus the worker's, as seen when the spans arrived.
  absl::Status RecordTimeline(const std::string& worker_id, const std::string& job_id,
                              int64_t epoch, int32_t rank, std::vector<ExecutionSpan> spans,
                              int64_t skew_us = 0);
  // What rank `rank`'s worker measured of its collectives (who is slow: a slow link). Validated
  // like SubmitRequests; INVALID_ARGUMENT for bad totals.
  absl::Status RecordRankExecution(const std::string& worker_id, const std::string& job_id,
                                   int64_t epoch, int32_t rank,
                                   const ExecutionTracker::Sample& sample);

  // Artifacts. NOT_FOUND for an unknown job (or artifact).
  absl::StatusOr<std::vector<ArtifactInfo>> ListArtifacts(const std::string& job_id) const;
  // What to serve of an artifact: its first `size` bytes, then `tail`. For a timeline being
  // written that is a consistent snapshot (valid JSON).
  struct ArtifactSnapshot {
    int64_t size = 0;
    std::string tail;
  };
  absl::StatusOr<ArtifactSnapshot> SnapshotArtifact(const std::string& job_id,
                                                    const std::string& name) const;
  absl::StatusOr<std::string> ReadArtifact(const std::string& job_id, const std::string& name,
                                           int64_t offset, int64_t max_bytes) const {
    return artifacts_.Read(job_id, name, offset, max_bytes);
  }

  // A rank's worker fetching the job's code: the archive's path. Checked like the rendezvous
  // (CheckScope); FAILED_PRECONDITION for a job without code.
  absl::StatusOr<std::string> JobSourcePath(const std::string& job_id, int64_t epoch,
                                            const std::string* token) const;
  // A rank's worker about to send what the rank left in its output directory: NOT_FOUND (job),
  // ABORTED (another epoch), INVALID_ARGUMENT (rank), PERMISSION_DENIED (token), whatever the
  // job's state (a worker sends the output of a rank that exited before reporting the exit, and
  // that of a rank it stopped after the job ended). Then empties the rank's artifact directory.
  absl::Status BeginRankOutput(const std::string& job_id, int64_t epoch, int32_t rank,
                               const std::string& token) const;
  // Where file `path` (checked by ValidateRelativePath) of the rank's output goes.
  std::string RankOutputPath(const std::string& job_id, int32_t rank,
                             const std::string& path) const {
    return artifacts_.RankFilePath(job_id, rank, path);
  }

  // Rendezvous, scoped by job and epoch: NOT_FOUND (job), ABORTED (stale epoch),
  // FAILED_PRECONDITION (job not starting or running), PERMISSION_DENIED when `token` is given and
  // is not the epoch's (Job::rendezvous_token, which only the job's workers are sent). Every check
  // is made on one reading of the job, so a call cannot slip between an epoch change and its
  // token check. In-process callers (tests) pass no token.
  absl::Status RendezvousSet(const std::string& job_id, int64_t epoch, const std::string& key,
                             std::string value, const std::string* token = nullptr);
  absl::StatusOr<std::string> RendezvousGet(const std::string& job_id, int64_t epoch,
                                            const std::string& key,
                                            const std::string* token = nullptr);
  void RendezvousWait(const std::string& job_id, int64_t epoch, std::vector<std::string> keys,
                      absl::Duration timeout, RendezvousStore::WaitCallback done,
                      const std::string* token = nullptr);

  // Flushes due negotiation cycles; every housekeeping interval also expires worker leases, reports
  // and acts on stalls, expires rendezvous waits and ends the logs whose linger is over. The server
  // calls it about every millisecond; tests call it after moving a FakeClock.
  void Tick();
  // The coordinator did not run for `gap` (the process was stopped, the machine stalled): its
  // workers' silence meanwhile was its own. Every lease and reconnect grace starts again now, so
  // the next Tick() blames no worker for it. The server calls it when its ticker finds such a gap.
  void Resumed(absl::Duration gap);

  // The earliest negotiation deadline of any job (InfiniteFuture when none).
  absl::Time NextDeadline() const;

  // For the server's ticker thread: blocks until `deadline` (real time), or until a negotiation
  // cycle falls due earlier (SubmitRequests wakes it), or WakeTicker(). The ticker thus sleeps
  // until there is work instead of polling.
  void WaitForTick(absl::Time deadline);
  // Makes WaitForTick() return by `when`.
  void WakeTicker(absl::Time when);

  // Graceful server stop: ends every worker's session with UNAVAILABLE (the daemons stay up and
  // reconnect) and fails pending rendezvous waits with UNAVAILABLE.
  void Shutdown(const std::string& reason);

 private:
  // A rank's non-zero exit waiting for failure_settle before it fails the job.
  struct PendingFailure {
    std::string reason;
    std::string worker_id;  // the exiting rank's worker (needs no stop); empty: stop every rank
    absl::Time deadline;
    // Elastic jobs: the epoch it happened in (a new epoch makes it moot); 0: any.
    int64_t epoch = 0;
  };
  // Elastic jobs: the HostsUpdated sent to epoch `epoch`'s ranks; they reset by `deadline`, or the
  // new epoch starts anyway.
  struct GrowNotice {
    int64_t epoch = 0;
    absl::Time deadline;
  };

  // "; its last output:\n  LINE..." with the last lines of the rank's output and the command that
  // shows the rest, or "" when it printed nothing.
  std::string OutputTail(const std::string& job_id, int32_t rank) const;
  // "worker W serving rank R on host H disconnected (its session broke)" for the first worker of
  // `job` other than `except` that is not connected, or "".
  std::string DisconnectedWorkerOf(const Job& job, const std::string& except);
  // Fails the jobs whose pending failure is due (or belongs to `disconnected_job`).
  void SettleFailures(absl::Time now, const std::string& disconnected_job);
  // Jobs and workers by state, computed at each scrape.
  void RegisterCollectors();
  // Places pending jobs on idle workers, oldest first; a job that stays pending gets an event
  // saying why whenever that changes. Opens each placed job's runtime (file I/O) with no lock held.
  void Schedule();
  // Places the oldest pending job that fits, under schedule_mu_; nullopt when none does.
  std::optional<Job> PlaceOne();
  // Opens a placed job's runtime (file I/O) and sends its ranks their assignments; on the executor.
  void StartPlaced(const Job& placed);
  // One rank of a reconnected worker: re-sends the lists it missed and says what the runtime has.
  void Resume(const std::string& worker_id, WorkerChannel* channel, const RankResume& r);
  // Finish() on the executor.
  void FinishLater(const std::string& job_id, JobState state, std::string reason,
                   const std::string& except_worker = "");
  // Ends the job in `state` (FAILED or CANCELLED or SUCCEEDED) with `reason`: stops its other
  // ranks, frees its workers and drops its rendezvous scope.
  absl::StatusOr<Job> Finish(const std::string& job_id, JobState state, std::string reason,
                             const std::string& except_worker = "");
  // The job's runtime, or null when it has none.
  std::shared_ptr<JobRuntime> RuntimeOf(const std::string& job_id) const;
  absl::StatusOr<std::shared_ptr<JobRuntime>> RuntimeFor(const std::string& worker_id,
                                                         const std::string& job_id, int64_t epoch,
                                                         int32_t rank);
  absl::Status CheckScope(const std::string& job_id, int64_t epoch, const std::string* token) const;
  // Elastic jobs (coordinator_elastic.cc). A lost or reset rank, settled like a failure.
  void NoteMembershipChange(const std::string& job_id, int64_t epoch, std::string reason);
  // Idle workers that may join `job` (which has `members` ranks, `per_host` of them on each host),
  // up to max_np and processes_per_host, leaving out attached jobs' claims.
  std::vector<Worker> AddableWorkers(const Job& job, int members,
                                     const std::map<std::string, int>& per_host)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(schedule_mu_);
  // The job's next epoch (unless it moved past `from_epoch` already; 0: any): the surviving ranks
  // and free workers, renumbered; below min_np it waits for workers instead; past the reset limit
  // it fails. On the executor.
  void Reshape(const std::string& job_id, int64_t from_epoch, std::string why);
  // Opens the new epoch's runtime and sends every rank its assignment.
  void StartNextEpoch(const Job& job);
  // Housekeeping: running jobs grow (HostsUpdated) when workers are free; jobs below min_np get
  // their epoch when workers come, or fail after their elastic timeout.
  void TendElasticJobs(absl::Time now);
  // Flushes the job's due cycle to its ranks' channels.
  void Flush(JobRuntime& runtime, absl::Time now);
  // A batch for `runtime` from `worker_id` (the rank's own worker), checked: taken (true), or a
  // re-sent one it has, or one of an old cache generation (false; the rank is sent the lists it
  // lacks).
  bool Submit(JobRuntime& runtime, const std::string& worker_id, RequestBatch batch,
              absl::Time now);
  // A batch the runtime dropped: when it was of an old cache generation, the rank is sent the
  // lists after `acked` on its own session.
  // A rank of an ended job that was stopped at its end reports its exit: true when that was it
  // (the job's log ends once every such rank has), false for any other update.
  bool EndedRankExited(const std::string& worker_id, const RankUpdate& update)
      ABSL_LOCKS_EXCLUDED(mu_);
  void ResendIfStale(JobRuntime& runtime, const std::string& worker_id, int32_t rank,
                     uint64_t acked, uint64_t generation);
  void Housekeeping(absl::Time now);
  // The job's straggler_action, when a rank is newly named as holding it back: a job event (warn),
  // or the job failed naming the rank (fail).
  void ActOnStragglers(JobRuntime& runtime);
  // --straggler-action evict (elastic jobs): the named rank leaves the job, or every rank of its
  // host for a slow link (their workers are released and their processes stopped), its host is
  // kept out of the job for the knob straggler_cooldown_seconds, and the job goes on in a new
  // epoch (a membership change).
  void Evict(JobRuntime& runtime, const JobRuntime::StragglerNotice& notice);
  // Fails the jobs STARTING for longer than the start timeout, naming the ranks that never started.
  void FailJobsThatDidNotStart(absl::Time now);
  // Adds the notices (kRankNoticePrefix lines) of rank `rank`'s output `data` to the job's events.
  void NoteRankNotices(const std::string& job_id, int32_t rank, absl::string_view data);
  // Stops, FAILED, each job still running past its spec's max_run_seconds.
  void FailJobsPastTheirTimeLimit(absl::Time now);
  // Notes when `job`, whose ranks were first assigned at `started`, reaches its time limit (if it
  // has one, and unless noted already).
  void SetRunDeadline(const Job& job, absl::Time started) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // At construction: the jobs the store says were starting or running get their workers back (as
  // not yet connected) and a runtime that restores (JobRuntime::BeginRestore).
  void RestoreJobs();
  // Ends the job's restore once every rank that has not exited reattached.
  void TryEndRestore(const std::string& job_id);
  // A reattaching worker's rank of a restoring job: what it holds (`r`), or nothing (null: the
  // worker did not resume it).
  void GatherRank(const std::string& worker_id, JobRuntime& runtime, int32_t rank,
                  const RankResume* r);
  // The job's event for its first negotiated cycle after the restore (bench/chaos.sh reads it).
  void NoteFirstCycleAfterRestore(JobRuntime& runtime);
  // Fails the restoring jobs whose ranks did not all reattach within the resume timeout.
  void FailJobsThatDidNotResume(absl::Time now);
  // Removes the ended jobs past the retention, with their logs and artifacts. On the executor
  // (store writes, file removal).
  void EvictEndedJobs(absl::Time now);
  WorkerChannel* ChannelOf(const std::string& worker_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `worker_id` is busy serving `job_id`.
  bool ServesJob(const std::string& worker_id, const std::string& job_id) const;

  Clock* const clock_;
  Executor& slow_;
  MetricsRegistry metrics_;
  const absl::Duration heartbeat_interval_;
  const absl::Duration housekeeping_interval_;
  const absl::Duration job_retention_;
  const int64_t max_ended_jobs_;
  const absl::Duration retention_check_;
  const absl::Duration failure_settle_;
  const absl::Duration start_timeout_;
  const absl::Duration resume_timeout_;
  // When this coordinator started, and the cache generation of the jobs it restores (its start
  // time in microseconds: new at every restart).
  const absl::Time started_;
  const uint64_t generation_;
  const absl::Duration log_linger_;
  JobRegistry jobs_;
  WorkerRegistry workers_;
  RendezvousStore rendezvous_;
  LogStore logs_;
  const ArtifactStore artifacts_;
  SourceStore sources_;
  const int64_t max_output_bytes_per_rank_;
  const int64_t max_output_files_per_rank_;

  absl::Mutex tick_mu_;
  absl::CondVar tick_cv_;
  absl::Time tick_wake_ ABSL_GUARDED_BY(tick_mu_) = absl::InfiniteFuture();

  // Serialises scheduling decisions (read idle workers, assign, start), which span registries.
  absl::Mutex schedule_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  // The last waiting reason reported for each pending job (no others), and how many events said it.
  struct Waiting {
    std::string reason;
    int events = 0;
  };
  static constexpr int kMaxWaitingEvents = 16;
  absl::flat_hash_map<std::string, Waiting> waiting_ ABSL_GUARDED_BY(schedule_mu_);
  // Pending attached jobs' claims: job id -> rank -> worker id (at most np per job). Claimed
  // workers are left out of other jobs' placement.
  absl::flat_hash_map<std::string, std::map<int32_t, std::string>> claims_
      ABSL_GUARDED_BY(schedule_mu_);
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<JobRuntime>> runtimes_ ABSL_GUARDED_BY(mu_);
  // A rank's non-zero exit waiting for failure_settle before it fails its job, by job (running jobs
  // only).
  absl::flat_hash_map<std::string, PendingFailure> pending_failures_ ABSL_GUARDED_BY(mu_);
  // Ended jobs whose log lingers for the ranks that were still running (stopped at the end): their
  // log ends as soon as the last of them reports its exit (its output forwarded before), or at the
  // linger's end. By job id: those ranks.
  absl::flat_hash_map<std::string, absl::flat_hash_set<int32_t>> stopping_ranks_
      ABSL_GUARDED_BY(mu_);
  // When each STARTING job was placed (until it runs or ends).
  absl::flat_hash_map<std::string, absl::Time> starting_since_ ABSL_GUARDED_BY(mu_);
  // Jobs with a time limit (JobSpec::max_run_seconds): when it is reached.
  absl::flat_hash_map<std::string, absl::Time> run_deadlines_ ABSL_GUARDED_BY(mu_);
  // When each restoring job stops waiting for its ranks (until its restore ends).
  absl::flat_hash_map<std::string, absl::Time> resume_deadlines_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, WorkerChannel*> channels_ ABSL_GUARDED_BY(mu_);
  // Elastic jobs below min_np (no epoch running), since when; and the growth notices out.
  absl::flat_hash_map<std::string, absl::Time> below_min_since_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, GrowNotice> grow_notices_ ABSL_GUARDED_BY(mu_);
  // Elastic jobs: the hosts --straggler-action evict keeps out of each job, until when (a job's
  // hosts at most: its entry goes when it ends).
  absl::flat_hash_map<std::string, absl::flat_hash_map<std::string, absl::Time>> evicted_hosts_
      ABSL_GUARDED_BY(mu_);
  // ... and the epoch of each job's last eviction: one an epoch (the next epoch's ranks are named
  // afresh).
  absl::flat_hash_map<std::string, int64_t> evicted_epoch_ ABSL_GUARDED_BY(mu_);
  // Per job, the notices its ranks' output gave (NoteRankNotices), at most kMaxRankNotices.
  absl::flat_hash_map<std::string, absl::flat_hash_set<std::string>> rank_notices_
      ABSL_GUARDED_BY(mu_);
  static constexpr int kMaxRankNotices = 16;
  absl::Time last_housekeeping_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time last_retention_check_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace ringmaster
