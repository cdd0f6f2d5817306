#include "cli/artifacts.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/source_archive.h"

namespace ringmaster::cli {

namespace fs = std::filesystem;

grpc::Status FetchArtifacts(v1::JobService::Stub& stub, const Global& g, const std::string& job_id,
                            const std::string& dir, std::vector<FetchedArtifact>* fetched) {
  v1::ListArtifactsRequest list_request;
  list_request.set_job_id(job_id);
  v1::ListArtifactsResponse list;
  if (grpc::Status s = stub.ListArtifacts(Context(g).get(), list_request, &list); !s.ok()) return s;
  std::error_code error;
  if (list.artifacts_size() > 0) fs::create_directories(dir, error);
  if (error) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("cannot create ", dir, ": ", error.message()));
  }
  for (const v1::Artifact& a : list.artifacts()) {
    // Names come from the server: never let one write outside `dir`. A rank's files are
    // "rank-<rank>/<path>", kept in that directory.
    if (absl::Status s = ValidateRelativePath("artifact name", a.name()); !s.ok()) {
      return grpc::Status(grpc::StatusCode::INTERNAL,
                          absl::StrCat("the coordinator listed a bad artifact: ", s.message()));
    }
    const fs::path target = fs::path(dir) / a.name();
    fs::create_directories(target.parent_path(), error);
    const std::string path = target.string();
    const std::string part =
        (target.parent_path() / absl::StrCat(".", target.filename().string(), ".part")).string();
    std::ofstream out(part, std::ios::binary | std::ios::trunc);
    if (!out) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrCat("cannot write ", part));
    }
    v1::GetArtifactRequest request;
    request.set_job_id(job_id);
    request.set_name(a.name());
    // A large artifact may take a while: the deadline scales with it (at least 10 MB/s).
    Global slow = g;
    slow.timeout_seconds = g.timeout_seconds + static_cast<double>(a.size_bytes()) / 10e6;
    std::unique_ptr<grpc::ClientContext> context = Context(slow);
    auto reader = stub.GetArtifact(context.get(), request);
    v1::GetArtifactResponse chunk;
    int64_t size = 0;
    while (reader->Read(&chunk)) {
      out.write(chunk.data().data(), static_cast<std::streamsize>(chunk.data().size()));
      size += static_cast<int64_t>(chunk.data().size());
    }
    grpc::Status status = reader->Finish();
    out.close();
    if (!status.ok() || !out) {
      fs::remove(part, error);
      return status.ok() ? grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                        absl::StrCat("cannot write ", part))
                         : status;
    }
    fs::rename(part, path, error);
    if (error) {
      return grpc::Status(
          grpc::StatusCode::FAILED_PRECONDITION,
          absl::StrCat("cannot rename ", part, " to ", path, ": ", error.message()));
    }
    fetched->push_back({a.name(), path, size});
  }
  return grpc::Status::OK;
}

int Artifacts(const Global& g, v1::JobService::Stub& stub, Args& args) {
  if (args.Done() || args.Peek().rfind("--", 0) == 0) Usage("artifacts needs JOB");
  const std::string job_id = args.Next();
  std::string dir = ".";
  bool list_only = false;
  while (!args.Done()) {
    std::string flag = args.Next();
    if (flag == "--output" || flag == "-o") {
      dir = args.Value(flag);
    } else if (flag == "--list") {
      list_only = true;
    } else {
      Usage(absl::StrCat("artifacts: unknown option '", flag, "'"));
    }
  }
  if (list_only) {
    v1::ListArtifactsRequest request;
    request.set_job_id(job_id);
    v1::ListArtifactsResponse response;
    if (grpc::Status s = stub.ListArtifacts(Context(g).get(), request, &response); !s.ok()) {
      Fail(g, s);
    }
    if (g.json) {
      std::printf("%s\n", Json(response).c_str());
    } else {
      for (const v1::Artifact& a : response.artifacts()) {
        std::printf("%-40s %12lld bytes\n", a.name().c_str(),
                    static_cast<long long>(a.size_bytes()));
      }
    }
    return 0;
  }
  std::vector<FetchedArtifact> fetched;
  if (grpc::Status s = FetchArtifacts(stub, g, job_id, dir, &fetched); !s.ok()) Fail(g, s);
  for (const FetchedArtifact& f : fetched) {
    if (g.json) {
      std::printf("{\"name\":\"%s\",\"path\":\"%s\",\"size_bytes\":%lld}\n", f.name.c_str(),
                  f.path.c_str(), static_cast<long long>(f.size_bytes));
    } else {
      std::printf("%s (%lld bytes)\n", f.path.c_str(), static_cast<long long>(f.size_bytes));
    }
  }
  if (fetched.empty() && !g.json) {
    std::fprintf(stderr,
                 "ringmaster: job %s has no artifacts (ask for --timeline FILE or "
                 "--autotune-log-file FILE when submitting)\n",
                 job_id.c_str());
  }
  return 0;
}

}  // namespace ringmaster::cli
