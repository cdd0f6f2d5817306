// The coordinator as a client reaches it: at one address, or at each of its replicas' addresses
// (`--coordinator a:1,b:2`: replicas electing a leader on etcd), one channel each, one of which is
// taken for the leader's. A call that fails UNAVAILABLE is reported back: a follower's refusal
// names the leader (the x-ringmaster-leader trailer), which becomes current; any other failure
// moves on to the next address. With one address, nothing ever changes.
//
// Thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"

namespace ringmaster {

class CoordinatorChannels {
 public:
  // At most this many addresses, the leaders followers named included.
  static constexpr size_t kMaxAddresses = 16;

  // `addresses`: "HOST:PORT[,HOST:PORT...]". INVALID_ARGUMENT for an empty one or more than
  // kMaxAddresses.
  static absl::StatusOr<std::unique_ptr<CoordinatorChannels>> Create(
      const std::string& addresses, std::shared_ptr<grpc::ChannelCredentials> credentials,
      const grpc::ChannelArguments& args = grpc::ChannelArguments());

  size_t size() const;
  // The channel calls go to now, and its address.
  std::shared_ptr<grpc::Channel> Current() const;
  std::string current_address() const;
  // Every address, joined by ", " (for messages).
  std::string Describe() const;

  // A call on `channel` failed UNAVAILABLE; `context` is its finished context (its trailers may
  // name the leader). Other codes change nothing.
  void Failed(const std::shared_ptr<grpc::Channel>& channel, const grpc::ClientContext& context,
              const grpc::Status& status);
  // Same, with the leader's address as the refusal named it ("": none).
  void Failed(const std::shared_ptr<grpc::Channel>& channel, const std::string& leader);

  // The leader named in a finished call's trailers ("": none).
  static std::string LeaderHint(const grpc::ClientContext& context);

 private:
  CoordinatorChannels(std::shared_ptr<grpc::ChannelCredentials> credentials,
                      grpc::ChannelArguments args)
      : credentials_(std::move(credentials)), args_(std::move(args)) {}
  // The index of `address`, adding it when there is room (-1: none).
  int IndexOf(const std::string& address) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
  const grpc::ChannelArguments args_;
  mutable absl::Mutex mu_;
  std::vector<std::string> addresses_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<grpc::Channel>> channels_ ABSL_GUARDED_BY(mu_);
  size_t current_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ringmaster
