#include "coordinator/service/proto_convert.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace ringmaster {
namespace {

int64_t UnixMs(absl::Time t) { return absl::ToUnixMillis(t); }

}  // namespace

absl::Status FromProto(const v1::JobSpec& in, JobSpec* out) {
  out->name = in.name();
  out->np = in.np();
  out->processes_per_host = in.processes_per_host();
  out->command.assign(in.command().begin(), in.command().end());
  out->env = {in.env().begin(), in.env().end()};
  out->working_dir = in.working_dir();
  out->labels = {in.labels().begin(), in.labels().end()};
  out->attached = in.attached();
  out->min_np = in.min_np();
  out->max_np = in.max_np();
  out->reset_limit = in.reset_limit();
  out->elastic_timeout_seconds = in.elastic_timeout_seconds();
  out->request_id = in.request_id();
  out->max_run_seconds = in.max_run_seconds();
  out->source.sha256 = in.source().sha256();
  out->source.size_bytes = in.source().size_bytes();
  out->source.unpacked_bytes = in.source().unpacked_bytes();
  out->source.files = in.source().files();
  const v1::Knobs& k = in.knobs();
  Knobs& o = out->knobs;
  o = Knobs{};
  if (k.has_fusion_threshold_bytes()) o.fusion_threshold_bytes = k.fusion_threshold_bytes();
  if (k.has_cycle_time_ms()) o.cycle_time_ms = k.cycle_time_ms();
  if (k.has_cache_capacity()) o.cache_capacity = k.cache_capacity();
  o.autotune = k.autotune();
  if (k.has_autotune_warmup_samples()) o.autotune_warmup_samples = k.autotune_warmup_samples();
  if (k.has_autotune_steps_per_sample())
    o.autotune_steps_per_sample = k.autotune_steps_per_sample();
  if (k.has_autotune_bayes_opt_max_samples()) {
    o.autotune_bayes_opt_max_samples = k.autotune_bayes_opt_max_samples();
  }
  if (k.has_autotune_gaussian_process_noise()) {
    o.autotune_gaussian_process_noise = k.autotune_gaussian_process_noise();
  }
  o.autotune_log = k.autotune_log();
  o.timeline = k.timeline();
  o.timeline_mark_cycles = k.timeline_mark_cycles();
  if (k.has_stall_check_seconds()) o.stall_check_seconds = k.stall_check_seconds();
  if (k.has_stall_shutdown_seconds()) o.stall_shutdown_seconds = k.stall_shutdown_seconds();
  if (!v1::Backend_IsValid(k.backend())) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.knobs.backend = ", k.backend(), " is not a backend"));
  }
  o.backend = static_cast<Backend>(k.backend());
  o.autotune_fixed.assign(k.autotune_fixed().begin(), k.autotune_fixed().end());
  if (k.has_shm_allreduce()) o.shm_allreduce = k.shm_allreduce();
  if (k.has_local_negotiation()) o.local_negotiation = k.local_negotiation();
  if (k.has_hierarchical_allreduce()) o.hierarchical_allreduce = k.hierarchical_allreduce();
  if (k.has_hierarchical_allgather()) o.hierarchical_allgather = k.hierarchical_allgather();
  o.negotiation_relay = k.negotiation_relay();
  if (k.negotiation_relay_hosts() != 0) o.negotiation_relay_hosts = k.negotiation_relay_hosts();
  if (!k.straggler_action().empty()) o.straggler_action = k.straggler_action();
  if (k.has_straggler_cooldown_seconds()) {
    o.straggler_cooldown_seconds = k.straggler_cooldown_seconds();
  }
  return absl::OkStatus();
}

void ToProto(const JobSpec& in, v1::JobSpec* out) {
  out->set_name(in.name);
  out->set_np(in.np);
  out->set_processes_per_host(in.processes_per_host);
  for (const std::string& arg : in.command) out->add_command(arg);
  out->mutable_env()->insert(in.env.begin(), in.env.end());
  out->set_working_dir(in.working_dir);
  out->mutable_labels()->insert(in.labels.begin(), in.labels.end());
  out->set_attached(in.attached);
  out->set_min_np(in.min_np);
  out->set_max_np(in.max_np);
  out->set_reset_limit(in.reset_limit);
  out->set_elastic_timeout_seconds(in.elastic_timeout_seconds);
  out->set_max_run_seconds(in.max_run_seconds);
  out->set_request_id(in.request_id);
  if (!in.source.sha256.empty()) {
    v1::SourceArchive* source = out->mutable_source();
    source->set_sha256(in.source.sha256);
    source->set_size_bytes(in.source.size_bytes);
    source->set_unpacked_bytes(in.source.unpacked_bytes);
    source->set_files(in.source.files);
  }
  const Knobs& k = in.knobs;
  v1::Knobs* o = out->mutable_knobs();
  o->set_fusion_threshold_bytes(k.fusion_threshold_bytes);
  o->set_cycle_time_ms(k.cycle_time_ms);
  o->set_cache_capacity(k.cache_capacity);
  o->set_autotune(k.autotune);
  o->set_autotune_warmup_samples(k.autotune_warmup_samples);
  o->set_autotune_steps_per_sample(k.autotune_steps_per_sample);
  o->set_autotune_bayes_opt_max_samples(k.autotune_bayes_opt_max_samples);
  o->set_autotune_gaussian_process_noise(k.autotune_gaussian_process_noise);
  o->set_autotune_log(k.autotune_log);
  o->set_timeline(k.timeline);
  o->set_timeline_mark_cycles(k.timeline_mark_cycles);
  o->set_stall_check_seconds(k.stall_check_seconds);
  o->set_stall_shutdown_seconds(k.stall_shutdown_seconds);
  o->set_backend(static_cast<v1::Backend>(k.backend));
  for (const std::string& name : k.autotune_fixed) o->add_autotune_fixed(name);
  o->set_shm_allreduce(k.shm_allreduce);
  o->set_local_negotiation(k.local_negotiation);
  o->set_hierarchical_allreduce(k.hierarchical_allreduce);
  o->set_hierarchical_allgather(k.hierarchical_allgather);
  o->set_negotiation_relay(k.negotiation_relay);
  o->set_negotiation_relay_hosts(k.negotiation_relay_hosts);
  o->set_straggler_action(k.straggler_action);
  o->set_straggler_cooldown_seconds(k.straggler_cooldown_seconds);
}

v1::JobState ToProto(JobState state) { return static_cast<v1::JobState>(state); }

absl::Status FromProto(v1::JobState in, JobState* out) {
  if (in == v1::JOB_STATE_UNSPECIFIED || !v1::JobState_IsValid(in)) {
    return absl::InvalidArgumentError(absl::StrCat("states: ", in, " is not a job state"));
  }
  *out = static_cast<JobState>(in);
  return absl::OkStatus();
}

absl::Status FromProto(const v1::Job& in, Job* out) {
  out->id = in.id();
  out->owner = in.owner();
  out->rendezvous_token = in.rendezvous_token();
  if (absl::Status s = FromProto(in.spec(), &out->spec); !s.ok()) return s;
  if (absl::Status s = FromProto(in.state(), &out->state); !s.ok()) return s;
  out->reason = in.reason();
  out->epoch = in.epoch();
  out->resets = in.resets();
  out->create_time = absl::FromUnixMillis(in.create_time_unix_ms());
  out->update_time = absl::FromUnixMillis(in.update_time_unix_ms());
  out->ranks.clear();
  for (const v1::RankInfo& r : in.ranks()) {
    RankInfo o;
    o.rank = r.rank();
    o.worker_id = r.worker_id();
    o.host = r.host();
    o.device = r.device();
    o.address = r.address();
    o.worker_identity = r.worker_identity();
    o.worker_secret_sha256 = r.worker_secret_sha256();
    o.local_rank = r.local_rank();
    o.local_size = r.local_size();
    o.cross_rank = r.cross_rank();
    o.cross_size = r.cross_size();
    o.state = static_cast<RankState>(r.state());
    o.exit_code = r.exit_code();
    out->ranks.push_back(std::move(o));
  }
  out->events.clear();
  for (const v1::JobEvent& e : in.events()) {
    JobEvent o;
    o.time = absl::FromUnixMillis(e.time_unix_ms());
    if (absl::Status s = FromProto(e.state(), &o.state); !s.ok()) return s;
    o.message = e.message();
    out->events.push_back(std::move(o));
  }
  return absl::OkStatus();
}

void ToProto(const JobEvent& in, v1::JobEvent* out) {
  out->set_time_unix_ms(UnixMs(in.time));
  out->set_state(ToProto(in.state));
  out->set_message(in.message);
}

void ToProto(const Worker& in, v1::WorkerInfo* out) {
  out->set_worker_id(in.id);
  out->set_host(in.host);
  out->set_device(in.device);
  out->set_address(in.address);
  out->set_state(in.state == WorkerState::kLost   ? v1::WORKER_STATE_LOST
                 : !in.connected                  ? v1::WORKER_STATE_DISCONNECTED
                 : in.state == WorkerState::kBusy ? v1::WORKER_STATE_BUSY
                                                  : v1::WORKER_STATE_IDLE);
  out->set_job_id(in.job_id);
  out->set_rank(in.job_id.empty() ? -1 : in.rank);
  out->set_last_heartbeat_unix_ms(UnixMs(in.last_heartbeat));
  out->set_lost_reason(in.lost_reason);
  for (const auto& [k, v] : in.labels) (*out->mutable_labels())[k] = v;
}

void ToProto(const Job& in, v1::Job* out) {
  out->set_id(in.id);
  out->set_owner(in.owner);
  out->set_rendezvous_token(in.rendezvous_token);
  ToProto(in.spec, out->mutable_spec());
  out->set_state(ToProto(in.state));
  out->set_reason(in.reason);
  out->set_epoch(in.epoch);
  out->set_resets(in.resets);
  out->set_create_time_unix_ms(UnixMs(in.create_time));
  out->set_update_time_unix_ms(UnixMs(in.update_time));
  for (const RankInfo& r : in.ranks) {
    v1::RankInfo* o = out->add_ranks();
    o->set_rank(r.rank);
    o->set_worker_id(r.worker_id);
    o->set_host(r.host);
    o->set_device(r.device);
    o->set_address(r.address);
    o->set_worker_identity(r.worker_identity);
    o->set_worker_secret_sha256(r.worker_secret_sha256);
    o->set_local_rank(r.local_rank);
    o->set_local_size(r.local_size);
    o->set_cross_rank(r.cross_rank);
    o->set_cross_size(r.cross_size);
    o->set_state(static_cast<v1::RankState>(r.state));
    o->set_exit_code(r.exit_code);
  }
  for (const JobEvent& e : in.events) ToProto(e, out->add_events());
  out->set_waiting_reason(in.waiting_reason);
  if (in.stragglers.has_value()) {
    const JobStragglers& st = *in.stragglers;
    v1::Stragglers* o = out->mutable_stragglers();
    o->set_steps(st.steps);
    o->set_last_step(st.last_step);
    o->set_step_seconds(st.step_seconds);
    o->set_straggler_rank(st.straggler_rank);
    for (const RankLateness& l : st.slowest) {
      v1::RankLateness* r = o->add_slowest();
      r->set_rank(l.rank);
      if (l.rank >= 0 && static_cast<size_t>(l.rank) < in.ranks.size()) {
        r->set_host(in.ranks[l.rank].host);
        r->set_worker_id(in.ranks[l.rank].worker_id);
      }
      r->set_behind_first_seconds(l.behind_first_seconds);
      r->set_behind_median_seconds(l.behind_median_seconds);
      if (l.flagged) {
        r->set_verdict("late to submit");
      } else if (l.slow_link) {
        r->set_verdict("slow link");
      }
      r->set_measured(l.measured);
      r->set_collective_share(l.collective_share);
      r->set_network_share(l.network_share);
      r->set_link_bytes_per_second(l.link_bytes_per_second);
      r->set_host_link_bytes_per_second(l.host_link_bytes_per_second);
      r->set_others_link_bytes_per_second(l.others_link_bytes_per_second);
    }
  }
  if (in.throughput.has_value()) {
    const JobThroughput& t = *in.throughput;
    v1::JobThroughput* o = out->mutable_throughput();
    o->set_bytes_per_second(t.bytes_per_second);
    o->set_steps_per_second(t.steps_per_second);
    o->set_cycles_per_second(t.cycles_per_second);
    o->set_tensors_negotiated(t.tensors_negotiated);
    o->set_bytes_negotiated(t.bytes_negotiated);
    o->set_fusion_threshold_bytes(t.fusion_threshold_bytes);
    o->set_cycle_time_ms(t.cycle_time_ms);
    o->set_cache_enabled(t.cache_enabled);
    if (t.autotune.has_value()) {
      const AutotuneStatus& a = *t.autotune;
      v1::AutotuneStatus* p = o->mutable_autotune();
      p->set_phase(std::string(AutotunePhaseName(a.phase)));
      p->set_samples(a.samples);
      p->set_max_samples(a.max_samples);
      p->set_best_fusion_threshold_bytes(a.best.fusion_threshold_bytes);
      p->set_best_cycle_time_ms(a.best.cycle_time_ms);
      p->set_best_cache_enabled(a.best.cache_enabled);
      p->set_best_score_bytes_per_second(a.best_score);
    }
  }
}

absl::Status FromProto(const v1::TimelineSpans& in, std::vector<ExecutionSpan>* out) {
  if (in.spans_size() > 65536) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeline.spans has ", in.spans_size(), " entries; at most 65536"));
  }
  out->clear();
  out->reserve(in.spans_size());
  for (int i = 0; i < in.spans_size(); ++i) {
    const v1::ExecutionSpan& s = in.spans(i);
    const std::string field = absl::StrCat("timeline.spans[", i, "]");
    if (s.tensors_size() < 1 || s.tensors_size() > 4096) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".tensors has ", s.tensors_size(), " names; 1..4096 allowed"));
    }
    for (const std::string& t : s.tensors()) {
      if (t.empty() || t.size() > 1024) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".tensors: a name of ", t.size(), " bytes; 1..1024 allowed"));
      }
    }
    if (s.op().empty() || s.op().size() > 64) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".op must be 1..64 bytes"));
    }
    if (s.activities_size() != s.activity_end_unix_us_size() || s.activities_size() > 16) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": ", s.activities_size(), " activities and ",
                       s.activity_end_unix_us_size(), " end times; they must match, at most 16"));
    }
    ExecutionSpan span;
    span.tensors.assign(s.tensors().begin(), s.tensors().end());
    span.op = s.op();
    span.start_unix_us = s.start_unix_us();
    for (int a = 0; a < s.activities_size(); ++a) {
      if (s.activities(a).empty() || s.activities(a).size() > 64) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".activities[", a, "] must be 1..64 bytes"));
      }
      span.activities.emplace_back(s.activities(a), s.activity_end_unix_us(a));
    }
    out->push_back(std::move(span));
  }
  return absl::OkStatus();
}

absl::Status FromProto(const v1::RankUpdate& in, RankUpdate* out) {
  out->job_id = in.job_id();
  out->epoch = in.epoch();
  out->rank = in.rank();
  if (in.state() != v1::RANK_STATE_STARTED && in.state() != v1::RANK_STATE_EXITED) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank_update.state = ", in.state(), " must be STARTED or EXITED"));
  }
  out->state = static_cast<RankState>(in.state());
  out->exit_code = in.exit_code();
  out->failed = in.failed();
  out->message = in.message();
  return absl::OkStatus();
}

absl::Status FromProto(v1::RankOutput::Stream in, OutputStream* out) {
  switch (in) {
    case v1::RankOutput::STREAM_STDOUT:
      *out = OutputStream::kStdout;
      return absl::OkStatus();
    case v1::RankOutput::STREAM_STDERR:
      *out = OutputStream::kStderr;
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("output.stream = ", static_cast<int>(in), " must be STDOUT or STDERR"));
  }
}

void ToProto(const LogChunk& in, v1::LogChunk* out) {
  out->set_rank(in.rank);
  out->set_stream(in.stream == OutputStream::kStderr ? v1::RANK_OUTPUT_STREAM_STDERR
                                                     : v1::RANK_OUTPUT_STREAM_STDOUT);
  out->set_data(in.data);
  out->set_time_unix_ms(UnixMs(in.time));
}

void ToProto(const CycleBroadcast& in, v1::ResponseList* out) {
  out->set_job_id(in.job_id);
  for (const CacheAssignment& a : in.output.cache_assignments) {
    v1::CacheAssignment* o = out->add_cache_assignments();
    o->set_name(a.name);
    o->set_id(a.id);
  }
  for (uint32_t id : in.output.evicted_ids) out->add_evicted_ids(id);
  for (const Response& r : in.output.responses) ToProto(r, out->add_responses());
  out->set_fusion_threshold_bytes(in.fusion_threshold_bytes);
  out->set_cycle_time_ms(in.cycle_time_ms);
  out->set_seq(in.seq);
  for (uint64_t ack : in.request_acks) out->add_request_acks(ack);
  out->set_all_have(in.all_have);
  out->set_cache_generation(in.cache_generation);
}

absl::StatusOr<std::shared_ptr<CycleBroadcast>> CycleFromProto(const v1::ResponseList& in,
                                                               const std::string& job_id, int np) {
  if (in.job_id() != job_id) {
    return absl::InvalidArgumentError(
        absl::StrCat("retained.job_id '", in.job_id(), "' is not the resumed job '", job_id, "'"));
  }
  if (in.seq() == 0) return absl::InvalidArgumentError("retained.seq must be > 0");
  auto out = std::make_shared<CycleBroadcast>();
  out->job_id = in.job_id();
  for (const v1::CacheAssignment& a : in.cache_assignments()) {
    out->output.cache_assignments.push_back({a.name(), a.id()});
  }
  out->output.evicted_ids.assign(in.evicted_ids().begin(), in.evicted_ids().end());
  for (const v1::Response& r : in.responses()) {
    if (r.type() <= v1::Response::TYPE_UNSPECIFIED || r.type() > v1::Response::TYPE_ERROR) {
      return absl::InvalidArgumentError(
          absl::StrCat("retained.responses.type = ", static_cast<int>(r.type()), " is unknown"));
    }
    FromProto(r, &out->output.responses.emplace_back());
  }
  out->output.notices.resize(static_cast<size_t>(np));
  out->fusion_threshold_bytes = in.fusion_threshold_bytes();
  out->cycle_time_ms = in.cycle_time_ms();
  out->seq = in.seq();
  out->request_acks.assign(in.request_acks().begin(), in.request_acks().end());
  out->all_have = in.all_have();
  out->cache_generation = in.cache_generation();
  return out;
}

void ToProto(const RankNotice& in, v1::ResponseList* out) {
  for (uint32_t id : in.resend_ids) out->add_resend_ids(id);
  for (const Response& r : in.errors) ToProto(r, out->add_rank_errors());
}

void RedactForClient(v1::Job* job) {
  job->clear_rendezvous_token();
  for (auto& [name, value] : *job->mutable_spec()->mutable_env()) value = kRedacted;
  for (v1::RankInfo& r : *job->mutable_ranks()) r.clear_worker_secret_sha256();
}

}  // namespace ringmaster
