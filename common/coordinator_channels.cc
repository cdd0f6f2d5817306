#include "common/coordinator_channels.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/rpc_metadata.h"

namespace ringmaster {

absl::StatusOr<std::unique_ptr<CoordinatorChannels>> CoordinatorChannels::Create(
    const std::string& addresses, std::shared_ptr<grpc::ChannelCredentials> credentials,
    const grpc::ChannelArguments& args) {
  std::unique_ptr<CoordinatorChannels> c(new CoordinatorChannels(std::move(credentials), args));
  absl::MutexLock lock(&c->mu_);
  for (absl::string_view a : absl::StrSplit(addresses, ',')) {
    a = absl::StripAsciiWhitespace(a);
    if (a.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--coordinator '", addresses, "': an empty address"));
    }
    if (c->addresses_.size() == kMaxAddresses) {
      return absl::InvalidArgumentError(
          absl::StrCat("--coordinator '", addresses, "': more than ", kMaxAddresses, " addresses"));
    }
    c->IndexOf(std::string(a));
  }
  return c;
}

int CoordinatorChannels::IndexOf(const std::string& address) {
  for (size_t i = 0; i < addresses_.size(); ++i) {
    if (addresses_[i] == address) return static_cast<int>(i);
  }
  if (addresses_.size() >= kMaxAddresses) return -1;
  grpc::ChannelArguments args = args_;
  addresses_.push_back(address);
  channels_.push_back(grpc::CreateCustomChannel(address, credentials_, args));
  return static_cast<int>(addresses_.size() - 1);
}

size_t CoordinatorChannels::size() const {
  absl::MutexLock lock(&mu_);
  return addresses_.size();
}

std::shared_ptr<grpc::Channel> CoordinatorChannels::Current() const {
  absl::MutexLock lock(&mu_);
  return channels_[current_];
}

std::string CoordinatorChannels::current_address() const {
  absl::MutexLock lock(&mu_);
  return addresses_[current_];
}

std::string CoordinatorChannels::Describe() const {
  absl::MutexLock lock(&mu_);
  return absl::StrJoin(addresses_, ", ");
}

std::string CoordinatorChannels::LeaderHint(const grpc::ClientContext& context) {
  const auto& trailers = context.GetServerTrailingMetadata();
  auto it = trailers.find(kLeaderMetadata);
  if (it == trailers.end()) return "";
  return std::string(it->second.data(), it->second.size());
}

void CoordinatorChannels::Failed(const std::shared_ptr<grpc::Channel>& channel,
                                 const grpc::ClientContext& context, const grpc::Status& status) {
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return;
  Failed(channel, LeaderHint(context));
}

void CoordinatorChannels::Failed(const std::shared_ptr<grpc::Channel>& channel,
                                 const std::string& leader) {
  absl::MutexLock lock(&mu_);
  if (addresses_.size() == 1 && leader.empty()) return;
  if (channels_[current_] != channel) return;  // another call moved on already
  if (!leader.empty()) {
    if (const int i = IndexOf(leader); i >= 0 && static_cast<size_t>(i) != current_) {
      current_ = static_cast<size_t>(i);
      return;
    }
  }
  current_ = (current_ + 1) % addresses_.size();
}

}  // namespace ringmaster
