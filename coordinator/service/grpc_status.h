// absl::Status <-> grpc::Status. The codes are numerically identical; messages are kept.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/server_callback.h"
#include "grpcpp/support/status.h"

namespace ringmaster {

inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

// A client-streaming call refused before it read anything (an unauthenticated caller, ...).
template <typename Request>
class RefusedReader : public grpc::ServerReadReactor<Request> {
 public:
  explicit RefusedReader(const absl::Status& status) { this->Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

}  // namespace ringmaster
