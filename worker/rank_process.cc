#include "worker/rank_process.h"

#include <unistd.h>

#include <filesystem>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/source_archive.h"

namespace ringmaster {

std::map<std::string, std::string> ProcessEnvironment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv(*e);
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

std::map<std::string, std::string> RankEnvironment(
    const v1::JobAssignment& assignment, const RankPlace& place,
    const std::map<std::string, std::string>& inherited) {
  const v1::Job& job = assignment.job();
  const int rank = assignment.rank();
  const v1::RankInfo& me = job.ranks(rank);
  std::map<std::string, std::string> env = inherited;
  for (const auto& [k, v] : job.spec().env()) env[k] = v;
  const std::map<std::string, std::string> topology = {
      {"RANK", absl::StrCat(rank)},
      {"SIZE", absl::StrCat(job.spec().np())},
      {"LOCAL_RANK", absl::StrCat(me.local_rank())},
      {"LOCAL_SIZE", absl::StrCat(me.local_size())},
      {"CROSS_RANK", absl::StrCat(me.cross_rank())},
      {"CROSS_SIZE", absl::StrCat(me.cross_size())},
      {"HOSTNAME", me.host()},
  };
  for (const auto& [k, v] : topology) {
    env["RINGMASTER_" + k] = v;
    env["HOROVOD_" + k] = v;
  }
  env["RINGMASTER_SOCKET"] = place.socket_path;
  env["RINGMASTER_COORDINATOR"] = place.coordinator;
  env["RINGMASTER_JOB_ID"] = job.id();
  env["RINGMASTER_EPOCH"] = absl::StrCat(assignment.epoch());
  if (job.spec().min_np() > 0 || job.spec().max_np() > 0) {
    const int32_t timeout = job.spec().elastic_timeout_seconds();
    env["RINGMASTER_ELASTIC_TIMEOUT"] = absl::StrCat(timeout > 0 ? timeout : 600);
  }
  // The job's own processes may meet through the coordinator's rendezvous (a raw Gloo context, a
  // benchmark's baseline): the epoch's token lets them, and only for this job.
  env["RINGMASTER_RENDEZVOUS_TOKEN"] = assignment.rendezvous_token();
  // Where this host's data plane listens: a rank that opens connections of its own (a raw Gloo
  // context, a benchmark's baseline) binds it too.
  if (!me.address().empty()) env["RINGMASTER_ADDRESS"] = me.address();
  // What the rank writes here comes back as the job's artifacts "rank-<rank>/...". SageMaker
  // scripts find it under their names.
  const std::string output = place.dir + "/output";
  env["RINGMASTER_OUTPUT_DIR"] = output;
  env["SM_OUTPUT_DATA_DIR"] = output;
  env["SM_MODEL_DIR"] = output;
  if (!job.spec().source().sha256().empty()) {
    env["RINGMASTER_CODE_DIR"] = place.dir + "/code";
    env["SM_MODULE_DIR"] = place.dir + "/code";
  }
  return env;
}

absl::StatusOr<std::string> MakeRankDir(
    const std::string& work_dir, const v1::JobAssignment& assignment,
    absl::FunctionRef<absl::Status(const std::string& archive)> fetch_source) {
  namespace fs = std::filesystem;
  const v1::Job& job = assignment.job();
  const std::string dir = absl::StrCat(work_dir, "/", job.id(), "-", assignment.epoch(), "-rank-",
                                       assignment.rank(), "-", getpid());
  std::error_code error;
  fs::remove_all(dir, error);
  error.clear();
  if (!fs::create_directories(dir + "/output", error) && error) {
    return absl::UnavailableError(
        absl::StrCat("cannot create the rank's directory ", dir, ": ", error.message()));
  }
  fs::permissions(dir, fs::perms::owner_all, fs::perm_options::replace, error);
  if (job.spec().source().sha256().empty()) return dir;
  const std::string archive = dir + "/source.tar.gz";
  absl::Status s = fetch_source(archive);
  if (!s.ok()) {
    s = absl::Status(s.code(), absl::StrCat("could not fetch the job's code: ", s.message()));
  } else if (s = ExtractArchive(archive, dir + "/code"); !s.ok()) {
    s = absl::Status(s.code(), absl::StrCat("could not unpack the job's code: ", s.message()));
  }
  if (!s.ok()) {
    fs::remove_all(dir, error);  // nothing half made is left
    return s;
  }
  fs::remove(archive, error);
  return dir;
}

std::string RankWorkingDir(const v1::JobAssignment& assignment, const RankPlace& place) {
  const v1::Job& job = assignment.job();
  return job.spec().source().sha256().empty() ? job.spec().working_dir() : place.dir + "/code";
}

absl::Status RankProcess::MakeDir(
    const std::string& work_dir, const v1::JobAssignment& assignment,
    absl::FunctionRef<absl::Status(const std::string& archive)> fetch_source) {
  absl::StatusOr<std::string> dir = MakeRankDir(work_dir, assignment, fetch_source);
  if (!dir.ok()) return dir.status();
  dir_ = *std::move(dir);
  return absl::OkStatus();
}

void RankProcess::RemoveDir() {
  if (dir_.empty()) return;
  std::error_code error;
  std::filesystem::remove_all(dir_, error);  // the rank's code and output (sent already)
}

absl::Status RankProcess::Launch(const v1::JobAssignment& assignment, const RankPlace& place,
                                 absl::FunctionRef<bool()> stopped) {
  const v1::Job& spec = assignment.job();
  const std::map<std::string, std::string> env =
      RankEnvironment(assignment, place, ProcessEnvironment());
  const std::string cwd = RankWorkingDir(assignment, place);
  std::vector<std::string> argv(spec.spec().command().begin(), spec.spec().command().end());
  FollowEpoch(assignment);
  // Numbered (the reliable session: re-sent after a reconnect, deduplicated by the coordinator);
  // stdout's and stderr's readers number and send under one lock, so the numbers go out in order.
  // The readers may outlive this object's last owner only as long as ChildProcess, which it owns.
  auto output = [this](int stream, std::string data) { Forward(stream, data); };
  absl::MutexLock lock(&launch_mu_);
  if (stopped()) {
    return absl::AbortedError(
        absl::StrCat("job ", spec.id(), " stopped before rank ", assignment.rank(), " started"));
  }
  absl::StatusOr<std::unique_ptr<ChildProcess>> child =
      ChildProcess::Start(argv, env, cwd, std::move(output));
  if (!child.ok()) return child.status();
  child_ = *std::move(child);
  pid_.store(child_->pid());
  return absl::OkStatus();
}

RankProcess::~RankProcess() {
  std::unique_ptr<ChildProcess> child;
  {
    absl::MutexLock lock(&launch_mu_);
    child = std::move(child_);
  }
  child.reset();  // its readers end here, while output_mu_ still exists
}

bool RankProcess::launched() const {
  absl::MutexLock lock(&launch_mu_);
  return child_ != nullptr;
}

ChildExit RankProcess::Wait() {
  ChildProcess* child;
  {
    absl::MutexLock lock(&launch_mu_);
    child = child_.get();
  }
  ChildExit exit = child->Wait();
  exited_ = true;
  return exit;
}

void RankProcess::Terminate(absl::Duration grace) {
  ChildProcess* child;
  {
    absl::MutexLock lock(&launch_mu_);
    child = child_.get();
  }
  if (child != nullptr) child->Terminate(grace);
}

void RankProcess::FollowEpoch(const v1::JobAssignment& assignment) {
  absl::MutexLock lock(&output_mu_);
  output_job_ = assignment.job().id();
  output_epoch_ = assignment.epoch();
  output_rank_ = assignment.rank();
  output_seq_ = 0;
}

void RankProcess::Forward(int stream, const std::string& data) {
  absl::MutexLock lock(&output_mu_);
  for (size_t at = 0; at < data.size(); at += kMaxOutputChunk) {
    v1::WorkerMessage m;
    v1::RankOutput* o = m.mutable_output();
    o->set_job_id(output_job_);
    o->set_epoch(output_epoch_);
    o->set_rank(output_rank_);
    o->set_stream(stream == 1 ? v1::RankOutput::STREAM_STDOUT : v1::RankOutput::STREAM_STDERR);
    o->set_data(data.substr(at, kMaxOutputChunk));
    // Numbers grow across an elastic job's epochs too (the coordinator drops a rank's chunk
    // numbered at or below the last it stored): the epoch in the high bits.
    o->set_seq((static_cast<uint64_t>(output_epoch_) << 40) | ++output_seq_);
    send_(m);
  }
}

void RankProcess::JoinWaiter() {
  if (waiter_.joinable() && waiter_.get_id() != std::this_thread::get_id()) waiter_.join();
}

}  // namespace ringmaster
