// Fuzz target: what the coordinator does with a message a client or worker sent, from the bytes
// on: parse it, then convert and validate it as the services do. The first byte picks the message.
#include <cstdint>
#include <string>

#include "coordinator/job.h"
#include "coordinator/service/proto_convert.h"
#include "ringmaster/v1/job.pb.h"
#include "ringmaster/v1/worker.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  using namespace ringmaster;
  switch (data[0] % 5) {
    case 0: {  // RegisterJob
      v1::RegisterJobRequest r;
      if (!r.ParseFromString(bytes)) return 0;
      JobSpec spec;
      if (FromProto(r.spec(), &spec).ok()) (void)ValidateJobSpec(spec);
      break;
    }
    case 1: {  // a stored job (the durable store's records)
      v1::Job r;
      if (!r.ParseFromString(bytes)) return 0;
      Job job;
      if (FromProto(r, &job).ok()) {
        v1::Job back;
        ToProto(job, &back);
        RedactForClient(&back);
      }
      break;
    }
    case 2: {  // a worker's session message
      v1::WorkerMessage m;
      if (!m.ParseFromString(bytes)) return 0;
      RequestBatch batch;
      FromProto(m.requests(), &batch);
      RankUpdate update;
      (void)FromProto(m.rank_update(), &update);
      OutputStream stream;
      (void)FromProto(m.output().stream(), &stream);
      std::vector<ExecutionSpan> spans;
      (void)FromProto(m.timeline(), &spans);
      break;
    }
    case 3: {  // a response list a reconnecting worker retained (SessionOpen.resume.retained)
      v1::ResponseList list;
      if (!list.ParseFromString(bytes)) return 0;
      for (int np : {1, 2, 7}) (void)CycleFromProto(list, "job-000001", np);
      break;
    }
    case 4: {  // ListJobs' states
      v1::ListJobsRequest r;
      if (!r.ParseFromString(bytes)) return 0;
      for (int s : r.states()) {
        JobState state;
        (void)FromProto(static_cast<v1::JobState>(s), &state);
      }
      break;
    }
  }
  return 0;
}
