// A client of etcd's documented v3 gRPC API (the subset in proto/etcd/etcd_kv.proto), over one or
// more endpoints: a call that finds the current endpoint unreachable goes on to the next, and the
// one that answered becomes current. Used by the etcd job store and the leader election; included
// only by their sources.
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "etcd/etcd_kv.grpc.pb.h"

namespace ringmaster {

// The endpoints of "etcd://HOST:PORT[,HOST:PORT...]"; INVALID_ARGUMENT naming the flag otherwise.
absl::StatusOr<std::vector<std::string>> ParseEtcdUrl(const std::string& url);

// The smallest key after every key starting with `prefix` (etcd's range_end for a prefix).
std::string EtcdPrefixEnd(std::string prefix);

class EtcdClient {
 public:
  // Each call ends within `timeout` per endpoint tried.
  EtcdClient(std::vector<std::string> endpoints, absl::Duration timeout);

  const std::vector<std::string>& endpoints() const { return endpoints_; }

  // The error's message names the endpoint that gave it.
  absl::Status Range(const etcdserverpb::RangeRequest& request,
                     etcdserverpb::RangeResponse* response) const;
  absl::Status Put(const etcdserverpb::PutRequest& request,
                   etcdserverpb::PutResponse* response) const;
  absl::Status DeleteRange(const etcdserverpb::DeleteRangeRequest& request,
                           etcdserverpb::DeleteRangeResponse* response) const;
  absl::Status Txn(const etcdserverpb::TxnRequest& request,
                   etcdserverpb::TxnResponse* response) const;
  // A lease of `ttl` (whole seconds, at least 1): its id.
  absl::StatusOr<int64_t> GrantLease(absl::Duration ttl) const;
  absl::Status RevokeLease(int64_t lease) const;
  // One keep-alive round trip: the lease's time to live from now, or zero when it has expired.
  absl::StatusOr<absl::Duration> KeepAlive(int64_t lease) const;

 private:
  // Runs `call(endpoint index, context)` on the current endpoint, moving on to the next while they
  // are unreachable (each tried once per call); the last error.
  template <typename F>
  absl::Status Call(F call) const;

  const std::vector<std::string> endpoints_;
  const absl::Duration timeout_;
  std::vector<std::unique_ptr<etcdserverpb::KV::Stub>> kv_;
  std::vector<std::unique_ptr<etcdserverpb::Lease::Stub>> lease_;
  mutable absl::Mutex mu_;
  mutable size_t current_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ringmaster
