// ringmaster.v1.WorkerService over the Coordinator: worker registration and the per-worker Session
// stream, whose reactor is the coordinator's WorkerChannel to that worker.
#pragma once

#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/certificate_trust.h"
#include "coordinator/coordinator.h"
#include "coordinator/service/auth.h"
#include "ringmaster/v1/worker.grpc.pb.h"

namespace ringmaster {

// The session is a raw-bytes method: its reactor parses and serializes the messages itself
// (worker_service.cc says why).
class WorkerService final
    : public v1::WorkerService::WithCallbackMethod_RegisterWorker<
          v1::WorkerService::WithRawCallbackMethod_Session<v1::WorkerService::Service>> {
 public:
  // `coordinator` is borrowed and must outlive the service; so is `auth` (null: nobody
  // authenticates). Only a worker identity may register a worker; the worker is bound to that
  // identity and to the session secret its registration returns, and a session for it opens only
  // with both.
  explicit WorkerService(Coordinator& coordinator, const Authenticator* auth = nullptr)
      : coordinator_(coordinator), auth_(auth != nullptr ? *auth : kNoAuthentication) {}

  grpc::ServerUnaryReactor* RegisterWorker(grpc::CallbackServerContext* context,
                                           const v1::RegisterWorkerRequest* request,
                                           v1::RegisterWorkerResponse* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Session(
      grpc::CallbackServerContext* context) override;

  // Ends, UNAUTHENTICATED, every open session whose client certificate `trust` no longer accepts
  // (its CA left the bundle, or it expired); returns how many. The server calls it when the CA
  // bundle changed, and every minute.
  int EndUntrustedSessions(const CertificateTrust& trust);

  // Sessions opened with a client certificate, and the certificate (PEM) each was opened with.
  struct CertifiedSessions {
    absl::Mutex mu;
    absl::flat_hash_map<WorkerChannel*, std::string> pem ABSL_GUARDED_BY(mu);
  };

 private:
  static const Authenticator kNoAuthentication;

  Coordinator& coordinator_;
  const Authenticator& auth_;
  const std::shared_ptr<CertifiedSessions> certified_ = std::make_shared<CertifiedSessions>();
};

}  // namespace ringmaster
