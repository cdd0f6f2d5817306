#include "coordinator/service/rendezvous_service.h"

#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/source_archive.h"
#include "coordinator/service/grpc_status.h"

namespace ringmaster {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kChunkBytes = int64_t{1} << 20;

// Streams the job's code archive in 1 MiB chunks, each read on the I/O executor as the previous
// one is written (one task or write outstanding at a time).
class SourceReactor : public grpc::ServerWriteReactor<v1::GetJobSourceResponse> {
 public:
  SourceReactor(Executor& io, absl::StatusOr<std::string> path) : io_(io) {
    if (!path.ok()) {
      Finish(ToGrpcStatus(path.status()));
      return;
    }
    path_ = *std::move(path);
    io_.Post([this] { Next(); });
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::CANCELLED);
      return;
    }
    io_.Post([this] { Next(); });
  }
  void OnDone() override { delete this; }

 private:
  void Next() {
    if (!in_.is_open()) {
      in_.open(path_, std::ios::binary);
      if (!in_) {
        Finish(ToGrpcStatus(absl::UnavailableError(absl::StrCat("cannot read ", path_))));
        return;
      }
    }
    std::string* data = out_.mutable_data();
    data->resize(kChunkBytes);
    in_.read(data->data(), kChunkBytes);
    data->resize(static_cast<size_t>(std::max<std::streamsize>(in_.gcount(), 0)));
    if (data->empty()) {
      Finish(grpc::Status::OK);
      return;
    }
    StartWrite(&out_);
  }

  Executor& io_;
  std::string path_;
  std::ifstream in_;
  v1::GetJobSourceResponse out_;
};

// Receives a rank's output files: the header (checked and the rank's directory emptied on the I/O
// executor), then chunks, each written on the executor before the next read starts.
class OutputReactor : public grpc::ServerReadReactor<v1::PutRankOutputRequest> {
 public:
  OutputReactor(Coordinator& coordinator, Executor& io, std::string token,
                v1::PutRankOutputResponse* response)
      : coordinator_(coordinator), io_(io), token_(std::move(token)), response_(response) {
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      if (!have_header_) {
        Finish(ToGrpcStatus(absl::InvalidArgumentError("PutRankOutput: no header came")));
        return;
      }
      io_.Post([this] {
        out_.close();
        response_->set_files(static_cast<int32_t>(files_));
        response_->set_bytes(bytes_);
        Finish(grpc::Status::OK);
      });
      return;
    }
    if (!have_header_) {
      if (in_.kind_case() != v1::PutRankOutputRequest::kHeader) {
        Finish(ToGrpcStatus(
            absl::InvalidArgumentError("PutRankOutput: the first message must carry header")));
        return;
      }
      have_header_ = true;
      header_ = in_.header();
      io_.Post([this] {
        absl::Status s =
            coordinator_.BeginRankOutput(header_.job_id(), header_.epoch(), header_.rank(), token_);
        if (!s.ok()) {
          Finish(ToGrpcStatus(s));
          return;
        }
        StartRead(&in_);
      });
      return;
    }
    if (in_.kind_case() != v1::PutRankOutputRequest::kChunk) {
      Finish(ToGrpcStatus(
          absl::InvalidArgumentError("PutRankOutput: header may come only once, first")));
      return;
    }
    io_.Post([this] {
      if (absl::Status s = Write(*in_.mutable_chunk()); !s.ok()) {
        out_.close();
        Finish(ToGrpcStatus(s));
        return;
      }
      StartRead(&in_);
    });
  }

  void OnDone() override { delete this; }

 private:
  absl::Status Write(v1::PutRankOutputRequest::Chunk& chunk) {
    const std::string where = absl::StrCat("rank ", header_.rank(), " of job ", header_.job_id());
    if (absl::Status s = ValidateRelativePath("chunk.path", chunk.path()); !s.ok()) return s;
    // Past a limit the file that crossed it goes too: only whole files are kept.
    if (bytes_ + static_cast<int64_t>(chunk.data().size()) >
        coordinator_.max_output_bytes_per_rank()) {
      DropCurrent(chunk.path());
      return absl::ResourceExhaustedError(absl::StrCat(
          "the output of ", where, " is larger than the coordinator's limit of ",
          coordinator_.max_output_bytes_per_rank(), " bytes per rank (--max-output-bytes); '",
          chunk.path(), "' and what follows it were not kept"));
    }
    if (chunk.first()) {
      if (++files_ > coordinator_.max_output_files_per_rank()) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "the output of ", where, " has more than ", coordinator_.max_output_files_per_rank(),
            " files; the first ", coordinator_.max_output_files_per_rank(), " were kept"));
      }
      out_.close();
      path_ = chunk.path();
      const fs::path file =
          coordinator_.RankOutputPath(header_.job_id(), header_.rank(), chunk.path());
      std::error_code error;
      fs::create_directories(file.parent_path(), error);
      out_.open(file, std::ios::binary | std::ios::trunc);
      if (!out_) return absl::UnavailableError(absl::StrCat("cannot write ", file.string()));
    } else if (chunk.path() != path_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk.path '", chunk.path(), "' continues a file that was not begun (first = false)"));
    }
    bytes_ += static_cast<int64_t>(chunk.data().size());
    out_.write(chunk.data().data(), static_cast<std::streamsize>(chunk.data().size()));
    if (!out_) return absl::UnavailableError(absl::StrCat("cannot write ", chunk.path()));
    return absl::OkStatus();
  }

  // Closes and removes the file being written when it is `path` (it would be incomplete).
  void DropCurrent(const std::string& path) {
    if (!out_.is_open() || path != path_) return;
    out_.close();
    std::error_code error;
    fs::remove(coordinator_.RankOutputPath(header_.job_id(), header_.rank(), path_), error);
  }

  Coordinator& coordinator_;
  Executor& io_;
  const std::string token_;
  v1::PutRankOutputResponse* const response_;
  v1::PutRankOutputRequest in_;
  bool have_header_ = false;
  v1::PutRankOutputRequest::Header header_;
  std::string path_;
  std::ofstream out_;
  int64_t files_ = 0;
  int64_t bytes_ = 0;
};

}  // namespace

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

grpc::ServerWriteReactor<v1::GetJobSourceResponse>* RendezvousService::GetJobSource(
    grpc::CallbackServerContext* context, const v1::GetJobSourceRequest* request) {
  absl::StatusOr<std::string> token = Authorize(*context);
  if (!token.ok()) return new SourceReactor(io_, token.status());
  return new SourceReactor(
      io_, coordinator_.JobSourcePath(request->job_id(), request->epoch(), &*token));
}

grpc::ServerReadReactor<v1::PutRankOutputRequest>* RendezvousService::PutRankOutput(
    grpc::CallbackServerContext* context, v1::PutRankOutputResponse* response) {
  absl::StatusOr<std::string> token = Authorize(*context);
  if (!token.ok()) return new RefusedReader<v1::PutRankOutputRequest>(token.status());
  return new OutputReactor(coordinator_, io_, *std::move(token), response);
}

}  // namespace ringmaster
