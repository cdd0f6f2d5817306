#include "worker/rank_process.h"

#include <unistd.h>

#include <filesystem>
#include <system_error>

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

}  // namespace ringmaster
