// KeyValueStore over the coordinator's RendezvousService, scoped to one job epoch.
#pragma once

#include <memory>
#include <string>

#include "grpcpp/channel.h"
#include "ringmaster/v1/rendezvous.grpc.pb.h"
#include "worker/key_value_store.h"

namespace ringmaster {

class RendezvousClient : public KeyValueStore {
 public:
  RendezvousClient(std::shared_ptr<grpc::Channel> channel, std::string job_id, int64_t epoch);

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key) override;
  absl::StatusOr<std::vector<std::string>> Wait(const std::vector<std::string>& keys,
                                                absl::Duration timeout) override;

 private:
  std::unique_ptr<v1::RendezvousService::Stub> stub_;
  const std::string job_id_;
  const int64_t epoch_;
};

}  // namespace ringmaster
