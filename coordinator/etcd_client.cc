#include "coordinator/etcd_client.h"

#include <chrono>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace ringmaster {

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

std::string EtcdPrefixEnd(std::string prefix) {
  while (!prefix.empty()) {
    if (static_cast<unsigned char>(prefix.back()) < 0xff) {
      prefix.back() = static_cast<char>(prefix.back() + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');  // every key
}

EtcdClient::EtcdClient(std::vector<std::string> endpoints, absl::Duration timeout)
    : endpoints_(std::move(endpoints)), timeout_(timeout) {
  for (const std::string& e : endpoints_) {
    auto channel = grpc::CreateChannel(e, grpc::InsecureChannelCredentials());
    kv_.push_back(etcdserverpb::KV::NewStub(channel));
    lease_.push_back(etcdserverpb::Lease::NewStub(channel));
  }
}

template <typename F>
absl::Status EtcdClient::Call(F call) const {
  size_t first;
  {
    absl::MutexLock lock(&mu_);
    first = current_;
  }
  absl::Status last;
  for (size_t tried = 0; tried < endpoints_.size(); ++tried) {
    const size_t i = (first + tried) % endpoints_.size();
    grpc::ClientContext context;
    context.set_wait_for_ready(tried + 1 == endpoints_.size());  // the last one: wait for it
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout_)));
    grpc::Status s = call(i, context);
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

absl::Status EtcdClient::Range(const etcdserverpb::RangeRequest& request,
                               etcdserverpb::RangeResponse* response) const {
  return Call(
      [&](size_t i, grpc::ClientContext& c) { return kv_[i]->Range(&c, request, response); });
}

absl::Status EtcdClient::Put(const etcdserverpb::PutRequest& request,
                             etcdserverpb::PutResponse* response) const {
  return Call([&](size_t i, grpc::ClientContext& c) { return kv_[i]->Put(&c, request, response); });
}

absl::Status EtcdClient::DeleteRange(const etcdserverpb::DeleteRangeRequest& request,
                                     etcdserverpb::DeleteRangeResponse* response) const {
  return Call(
      [&](size_t i, grpc::ClientContext& c) { return kv_[i]->DeleteRange(&c, request, response); });
}

absl::Status EtcdClient::Txn(const etcdserverpb::TxnRequest& request,
                             etcdserverpb::TxnResponse* response) const {
  return Call([&](size_t i, grpc::ClientContext& c) { return kv_[i]->Txn(&c, request, response); });
}

absl::StatusOr<int64_t> EtcdClient::GrantLease(absl::Duration ttl) const {
  etcdserverpb::LeaseGrantRequest request;
  request.set_ttl(
      std::max<int64_t>(1, static_cast<int64_t>(std::ceil(absl::ToDoubleSeconds(ttl)))));
  etcdserverpb::LeaseGrantResponse response;
  if (absl::Status s = Call([&](size_t i, grpc::ClientContext& c) {
        return lease_[i]->LeaseGrant(&c, request, &response);
      });
      !s.ok()) {
    return s;
  }
  if (!response.error().empty() || response.id() == 0) {
    return absl::UnavailableError(absl::StrCat("etcd granted no lease: ", response.error()));
  }
  return response.id();
}

absl::Status EtcdClient::RevokeLease(int64_t lease) const {
  etcdserverpb::LeaseRevokeRequest request;
  request.set_id(lease);
  etcdserverpb::LeaseRevokeResponse response;
  return Call([&](size_t i, grpc::ClientContext& c) {
    return lease_[i]->LeaseRevoke(&c, request, &response);
  });
}

absl::StatusOr<absl::Duration> EtcdClient::KeepAlive(int64_t lease) const {
  etcdserverpb::LeaseKeepAliveResponse response;
  bool answered = false;
  absl::Status s = Call([&](size_t i, grpc::ClientContext& c) {
    // One request on a stream of its own: it ends within the call's deadline whatever etcd does.
    auto stream = lease_[i]->LeaseKeepAlive(&c);
    etcdserverpb::LeaseKeepAliveRequest request;
    request.set_id(lease);
    answered = stream->Write(request) && stream->WritesDone() && stream->Read(&response);
    grpc::Status finished = stream->Finish();
    if (!finished.ok()) return finished;
    if (!answered) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "no keep-alive answer");
    return grpc::Status::OK;
  });
  if (!s.ok()) return s;
  return absl::Seconds(std::max<int64_t>(0, response.ttl()));
}

}  // namespace ringmaster
