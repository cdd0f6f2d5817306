#include "worker/rendezvous_client.h"

#include <chrono>

#include "grpcpp/client_context.h"

namespace ringmaster {
namespace {

constexpr auto kCallDeadline = std::chrono::seconds(10);

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

}  // namespace

RendezvousClient::RendezvousClient(std::shared_ptr<grpc::Channel> channel, std::string job_id,
                                   int64_t epoch)
    : stub_(v1::RendezvousService::NewStub(std::move(channel))),
      job_id_(std::move(job_id)),
      epoch_(epoch) {}

absl::Status RendezvousClient::Set(const std::string& key, const std::string& value) {
  v1::SetRequest request;
  request.set_job_id(job_id_);
  request.set_epoch(epoch_);
  request.set_key(key);
  request.set_value(value);
  v1::SetResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
  return FromGrpc(stub_->Set(&context, request, &response));
}

absl::StatusOr<std::string> RendezvousClient::Get(const std::string& key) {
  v1::GetRequest request;
  request.set_job_id(job_id_);
  request.set_epoch(epoch_);
  request.set_key(key);
  v1::GetResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
  if (absl::Status s = FromGrpc(stub_->Get(&context, request, &response)); !s.ok()) return s;
  return response.value();
}

absl::StatusOr<std::vector<std::string>> RendezvousClient::Wait(
    const std::vector<std::string>& keys, absl::Duration timeout) {
  v1::WaitRequest request;
  request.set_job_id(job_id_);
  request.set_epoch(epoch_);
  for (const std::string& k : keys) request.add_keys(k);
  request.set_timeout_ms(std::max<int64_t>(1, absl::ToInt64Milliseconds(timeout)));
  v1::WaitResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)) +
                       kCallDeadline);
  if (absl::Status s = FromGrpc(stub_->Wait(&context, request, &response)); !s.ok()) return s;
  return std::vector<std::string>(response.values().begin(), response.values().end());
}

}  // namespace ringmaster
