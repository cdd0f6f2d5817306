#include "coordinator/etcd_job_store.h"

#include "absl/strings/str_cat.h"
#include "coordinator/etcd_client.h"
#include "coordinator/service/proto_convert.h"
#include "ringmaster/v1/job.pb.h"
#include "spdlog/spdlog.h"

namespace ringmaster {
namespace {

class EtcdJobStore final : public JobStore {
 public:
  EtcdJobStore(std::vector<std::string> endpoints, std::string prefix, absl::Duration timeout,
               std::optional<EtcdFence> fence)
      : etcd_(std::move(endpoints), timeout), jobs_(prefix + "/jobs/"), fence_(std::move(fence)) {}

  // Reads every job (as List does), so that a store that cannot be read whole is refused at start
  // rather than taken for empty (which would number jobs from 1 again).
  absl::Status Ping() { return ListAll(nullptr); }

  absl::Status Put(const Job& job) override {
    v1::Job record;
    ToProto(job, &record);
    record.clear_throughput();  // live figures are not state
    record.clear_waiting_reason();
    etcdserverpb::RequestOp op;
    etcdserverpb::PutRequest& r = *op.mutable_request_put();
    r.set_key(jobs_ + job.id);
    r.set_value(record.SerializeAsString());
    if (absl::Status s = Write(std::move(op)); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("writing job ", job.id, ": ", s.message()));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Job> Get(const std::string& id) const override {
    etcdserverpb::RangeRequest r;
    r.set_key(jobs_ + id);
    etcdserverpb::RangeResponse out;
    if (absl::Status s = etcd_.Range(r, &out); !s.ok()) {
      return absl::UnavailableError(absl::StrCat("reading job ", id, ": ", s.message()));
    }
    if (out.kvs_size() == 0) return absl::NotFoundError(absl::StrCat("job '", id, "' not found"));
    return Decode(out.kvs(0));
  }

  absl::Status Delete(const std::string& id) override {
    etcdserverpb::RequestOp op;
    op.mutable_request_delete_range()->set_key(jobs_ + id);
    if (absl::Status s = Write(std::move(op)); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("deleting job ", id, ": ", s.message()));
    }
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
  // Runs `op` (a put or a delete), as one transaction guarded by the fence when there is one.
  // UNAVAILABLE when etcd cannot be reached; ABORTED when the fence no longer holds.
  absl::Status Write(etcdserverpb::RequestOp op) {
    etcdserverpb::TxnRequest txn;
    if (fence_.has_value()) {
      etcdserverpb::Compare* held = txn.add_compare();
      held->set_key(fence_->key);
      held->set_target(etcdserverpb::Compare::CREATE);
      held->set_result(etcdserverpb::Compare::EQUAL);
      held->set_create_revision(fence_->create_revision);
    }
    *txn.add_success() = std::move(op);
    etcdserverpb::TxnResponse out;
    if (absl::Status s = etcd_.Txn(txn, &out); !s.ok()) {
      return absl::UnavailableError(s.message());
    }
    if (!out.succeeded()) {
      return absl::AbortedError(absl::StrCat("this coordinator no longer leads: etcd's ",
                                             fence_->key, " is not the one it created (revision ",
                                             fence_->create_revision,
                                             "); another replica has taken over"));
    }
    return absl::OkStatus();
  }

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
      r.set_range_end(EtcdPrefixEnd(jobs_));
      r.set_limit(kPage);
      etcdserverpb::RangeResponse out;
      if (absl::Status s = etcd_.Range(r, &out); !s.ok()) return s;
      for (const etcdserverpb::KeyValue& kv : out.kvs()) {
        absl::StatusOr<Job> job = Decode(kv);
        if (!job.ok()) return job.status();
        if (jobs != nullptr) jobs->push_back(*std::move(job));
      }
      if (!out.more() || out.kvs_size() == 0) return absl::OkStatus();
      from = out.kvs(out.kvs_size() - 1).key() + std::string(1, '\0');
    }
  }

  const EtcdClient etcd_;
  const std::string jobs_;  // PREFIX/jobs/
  const std::optional<EtcdFence> fence_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> OpenEtcdJobStore(const std::string& url,
                                                           const std::string& prefix,
                                                           absl::Duration timeout,
                                                           std::optional<EtcdFence> fence) {
  absl::StatusOr<std::vector<std::string>> endpoints = ParseEtcdUrl(url);
  if (!endpoints.ok()) return endpoints.status();
  auto store = std::make_unique<EtcdJobStore>(*endpoints, prefix, timeout, std::move(fence));
  if (absl::Status s = store->Ping(); !s.ok()) {
    return absl::UnavailableError(
        absl::StrCat("--store ", url, ": etcd does not answer (", s.message(), ")"));
  }
  return store;
}

}  // namespace ringmaster
