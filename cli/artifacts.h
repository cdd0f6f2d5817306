// Job artifacts from the command line: `ringmaster artifacts JOB [--output DIR] [--list]`, and the
// fetch `ringmaster local` does when its job ends.
#pragma once

#include <string>
#include <vector>

#include "cli/command.h"

namespace ringmaster::cli {

struct FetchedArtifact {
  std::string name;
  std::string path;
  int64_t size_bytes = 0;
};

// Downloads every artifact of `job_id` into `dir` (created if missing); each file appears whole
// (written aside, then renamed).
grpc::Status FetchArtifacts(v1::JobService::Stub& stub, const Global& g, const std::string& job_id,
                            const std::string& dir, std::vector<FetchedArtifact>* fetched);

int Artifacts(const Global& g, v1::JobService::Stub& stub, Args& args);

}  // namespace ringmaster::cli
