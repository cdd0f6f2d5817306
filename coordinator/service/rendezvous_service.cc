#include "coordinator/service/rendezvous_service.h"

#include "coordinator/service/grpc_status.h"

namespace ringmaster {

const Authenticator RendezvousService::kNoAuthentication;

absl::StatusOr<std::string> RendezvousService::Authorize(
    const grpc::CallbackServerContext& context) const {
  absl::StatusOr<Principal> caller = auth_.Authenticate(context);
  if (!caller.ok()) return caller.status();
  return MetadataValue(context, kRendezvousTokenMetadata);
}

grpc::ServerUnaryReactor* RendezvousService::Set(grpc::CallbackServerContext* context,
                                                 const v1::SetRequest* request,
                                                 v1::SetResponse* response) {
  absl::StatusOr<std::string> token = Authorize(*context);
  if (!token.ok()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(ToGrpcStatus(token.status()));
    return reactor;
  }
  absl::Status s = coordinator_.RendezvousSet(request->job_id(), request->epoch(), request->key(),
                                              request->value(), &*token);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousService::Get(grpc::CallbackServerContext* context,
                                                 const v1::GetRequest* request,
                                                 v1::GetResponse* response) {
  absl::StatusOr<std::string> token = Authorize(*context);
  if (!token.ok()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(ToGrpcStatus(token.status()));
    return reactor;
  }
  absl::StatusOr<std::string> value =
      coordinator_.RendezvousGet(request->job_id(), request->epoch(), request->key(), &*token);
  if (value.ok()) response->set_value(*std::move(value));
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(value.status()));
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousService::Wait(grpc::CallbackServerContext* context,
                                                  const v1::WaitRequest* request,
                                                  v1::WaitResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<std::string> token = Authorize(*context);
  if (!token.ok()) {
    reactor->Finish(ToGrpcStatus(token.status()));
    return reactor;
  }
  // The store calls back exactly once: with the values, on timeout, when the job ends, or at server
  // stop, so the reactor and `response` are alive until then.
  coordinator_.RendezvousWait(
      request->job_id(), request->epoch(), {request->keys().begin(), request->keys().end()},
      absl::Milliseconds(request->timeout_ms()),
      [reactor, response](absl::StatusOr<std::vector<std::string>> values) {
        if (values.ok()) {
          for (std::string& v : *values) response->add_values(std::move(v));
        }
        reactor->Finish(ToGrpcStatus(values.status()));
      },
      &*token);
  return reactor;
}

}  // namespace ringmaster
