#include "coordinator/etcd_job_store.h"

#include <chrono>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/service/proto_convert.h"
#include "etcd/etcd_kv.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "ringmaster/v1/job.pb.h"
#include "spdlog/spdlog.h"

namespace ringmaster {
namespace {

// The smallest key after every key starting with `prefix` (etcd's range_end for a prefix).
std::string PrefixEnd(std::string prefix) {
  while (!prefix.empty()) {
    if (static_cast<unsigned char>(prefix.back()) < 0xff) {
      prefix.back() = static_cast<char>(prefix.back() + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');  // every key
}

class EtcdJobStore final : public JobStore {
 public:
  EtcdJobStore(std::vector<std::string> endpoints, std::string prefix, absl::Duration timeout)
      : endpoints_(std::move(endpoints)), jobs_(prefix + "/jobs/"), timeout_(timeout) {
    for (const std::string& e : endpoints_) {
      stubs_.push_back(
          etcdserverpb::KV::NewStub(grpc::CreateChannel(e, grpc::InsecureChannelCredentials())));
    }
  }

  // Reads every job (as List does), so that a store that cannot be read whole is refused at start
  // rather than taken for empty (which would number jobs from 1 again).
  absl::Status Ping() { return ListAll(nullptr); }

  absl::Status Put(const Job& job) override {
    v1::Job record;
    ToProto(job, &record);
    record.clear_throughput();  // live figures are not state
    record.clear_waiting_reason();
    etcdserverpb::PutRequest r;
    r.set_key(jobs_ + job.id);
    r.set_value(record.SerializeAsString());
    etcdserverpb::PutResponse out;
    absl::Status s = Call(
        [&](etcdserverpb::KV::Stub& kv, grpc::ClientContext& c) { return kv.Put(&c, r, &out); });
    if (!s.ok())
      return absl::UnavailableError(absl::StrCat("writing job ", job.id, ": ", s.message()));
    return absl::OkStatus();
  }

  absl::StatusOr<Job> Get(const std::string& id) const override {
    etcdserverpb::RangeRequest r;
    r.set_key(jobs_ + id);
    etcdserverpb::RangeResponse out;
    absl::Status s = Call(
        [&](etcdserverpb::KV::Stub& kv, grpc::ClientContext& c) { return kv.Range(&c, r, &out); });
    if (!s.ok()) return absl::UnavailableError(absl::StrCat("reading job ", id, ": ", s.message()));
    if (out.kvs_size() == 0) return absl::NotFoundError(absl::StrCat("job '", id, "' not found"));
    return Decode(out.kvs(0));
  }

  absl::Status Delete(const std::string& id) override {
    etcdserverpb::DeleteRangeRequest r;
    r.set_key(jobs_ + id);
    etcdserverpb::DeleteRangeResponse out;
    absl::Status s = Call([&](etcdserverpb::KV::Stub& kv, grpc::ClientContext& c) {
      return kv.DeleteRange(&c, r, &out);
    });
    if (!s.ok())
      return absl::UnavailableError(absl::StrCat("deleting job ", id, ": ", s.message()));
    return absl::OkStatus();
  }

  std::vector<Job> List() const override {
    std::vector<Job> jobs;
    if (absl::Status s = ListAll(&jobs); !s.ok()) {
      spdlog::error("listing the jobs in etcd: {}", s.ToString());
    }
    return jobs;
  }

 private:
  static absl::StatusOr<Job> Decode(const etcdserverpb::KeyValue& kv) {
    v1::Job record;
    if (!record.ParseFromString(kv.value())) {
      return absl::DataLossError(absl::StrCat("etcd key ", kv.key(), " does not hold a job"));
    }
    Job job;
    if (absl::Status s = FromProto(record, &job); !s.ok()) return s;
    return job;
  }

  // Every job, in pages of kPage (key order is creation order: job ids are numbered with leading
  // zeros); `jobs` may be null (a check).
  absl::Status ListAll(std::vector<Job>* jobs) const {
    static constexpr int64_t kPage = 256;
    std::string from = jobs_;
    while (true) {
      etcdserverpb::RangeRequest r;
      r.set_key(from);
      r.set_range_end(PrefixEnd(jobs_));
      r.set_limit(kPage);
      etcdserverpb::RangeResponse out;
      if (absl::Status s = Call([&](etcdserverpb::KV::Stub& kv, grpc::ClientContext& c) {
            return kv.Range(&c, r, &out);
          });
          !s.ok()) {
        return s;
      }
      for (const etcdserverpb::KeyValue& kv : out.kvs()) {
        absl::StatusOr<Job> job = Decode(kv);
        if (!job.ok()) return job.status();
        if (jobs != nullptr) jobs->push_back(*std::move(job));
      }
      if (!out.more() || out.kvs_size() == 0) return absl::OkStatus();
      from = out.kvs(out.kvs_size() - 1).key() + std::string(1, '\0');
    }
  }

  // Runs `call` on the current endpoint, moving on to the next one while they are unreachable (each
  // one tried once per call); the last error.
  template <typename F>
  absl::Status Call(F call) const {
    size_t first;
    {
      absl::MutexLock lock(&mu_);
      first = current_;
    }
    absl::Status last;
    for (size_t tried = 0; tried < stubs_.size(); ++tried) {
      const size_t i = (first + tried) % stubs_.size();
      grpc::ClientContext context;
      context.set_wait_for_ready(tried + 1 == stubs_.size());  // the last one: wait for it
      context.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout_)));
      grpc::Status s = call(*stubs_[i], context);
      if (s.ok()) {
        absl::MutexLock lock(&mu_);
        current_ = i;
        return absl::OkStatus();
      }
      last = absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                          absl::StrCat("etcd at ", endpoints_[i], ": ", s.error_message()));
      if (s.error_code() != grpc::StatusCode::UNAVAILABLE &&
          s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
        return last;
      }
    }
    return last;
  }

  const std::vector<std::string> endpoints_;
  const std::string jobs_;  // PREFIX/jobs/
  const absl::Duration timeout_;
  std::vector<std::unique_ptr<etcdserverpb::KV::Stub>> stubs_;
  mutable absl::Mutex mu_;
  mutable size_t current_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

absl::StatusOr<std::vector<std::string>> ParseEtcdUrl(const std::string& url) {
  constexpr absl::string_view kScheme = "etcd://";
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("--store '", url, "': ", why, " (expected etcd://HOST:PORT[,HOST:PORT...])"));
  };
  if (!absl::StartsWith(url, kScheme)) return bad("not an etcd:// URL");
  std::vector<std::string> endpoints;
  for (absl::string_view e : absl::StrSplit(url.substr(kScheme.size()), ',')) {
    const size_t colon = e.rfind(':');
    int port = 0;
    if (colon == absl::string_view::npos || colon == 0 ||
        !absl::SimpleAtoi(e.substr(colon + 1), &port) || port <= 0 || port > 65535) {
      return bad(absl::StrCat("endpoint '", e, "' is not HOST:PORT"));
    }
    endpoints.emplace_back(e);
  }
  if (endpoints.empty()) return bad("no endpoint");
  return endpoints;
}

absl::StatusOr<std::unique_ptr<JobStore>> OpenEtcdJobStore(const std::string& url,
                                                           const std::string& prefix,
                                                           absl::Duration timeout) {
  absl::StatusOr<std::vector<std::string>> endpoints = ParseEtcdUrl(url);
  if (!endpoints.ok()) return endpoints.status();
  auto store = std::make_unique<EtcdJobStore>(*endpoints, prefix, timeout);
  if (absl::Status s = store->Ping(); !s.ok()) {
    return absl::UnavailableError(
        absl::StrCat("--store ", url, ": etcd does not answer (", s.message(), ")"));
  }
  return store;
}

}  // namespace ringmaster
