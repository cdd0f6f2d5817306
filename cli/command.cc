#include "cli/command.h"

#include <cstdio>
#include <cstdlib>

#include "cli/log_printer.h"
#include "common/rpc_metadata.h"
#include "google/protobuf/util/json_util.h"

namespace ringmaster::cli {

std::unique_ptr<grpc::ClientContext> StreamContext(const Global& g) {
  auto context = std::make_unique<grpc::ClientContext>();
  if (!g.token.empty()) context->AddMetadata(kAuthorizationMetadata, "Bearer " + g.token);
  return context;
}

std::unique_ptr<grpc::ClientContext> Context(const Global& g) {
  std::unique_ptr<grpc::ClientContext> context = StreamContext(g);
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(g.timeout_seconds * 1000)));
  return context;
}

void Usage(const std::string& message) {
  std::fprintf(stderr, "ringmaster: %s\n(run 'ringmaster --help' for usage)\n", message.c_str());
  std::exit(2);
}

std::string Describe(const grpc::Status& status) {
  static const char* const kCodes[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  const int code = status.error_code();
  return absl::StrCat(code >= 0 && code <= 16 ? kCodes[code] : "ERROR", ": ",
                      status.error_message());
}

std::string UnreachableHint(const std::string& address) {
  return absl::StrCat("(no coordinator answered at ", address,
                      "; is ringmaster-coordinator running there? Name another with --coordinator "
                      "ADDR:PORT or RINGMASTER_COORDINATOR=ADDR:PORT)");
}

void Fail(const Global& g, const grpc::Status& status) {
  std::fprintf(stderr, "ringmaster: %s\n", Describe(status).c_str());
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
    std::fprintf(stderr, "%s\n", UnreachableHint(g.coordinator).c_str());
    std::fprintf(stderr, "%s\n",
                 g.tls.enabled()
                     ? "(this call used TLS; a coordinator without TLS is reached with --insecure)"
                     : "(this call used plaintext; a coordinator with TLS is reached with --tls-ca "
                       "FILE, or RINGMASTER_TLS_CA)");
  } else if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
    std::fprintf(stderr,
                 "(authenticate with --token TOKEN or RINGMASTER_TOKEN, or a user certificate: "
                 "--tls-cert FILE --tls-key FILE)\n");
  }
  std::exit(1);
}

void HelpIfAsked(const Args& args, const std::string& help) {
  if (args.Has("--help") || args.Has("-h")) {
    std::fputs(help.c_str(), stdout);
    std::exit(0);
  }
}

bool Args::Extract(const std::string& flag) {
  bool found = false;
  for (size_t i = pos_; i < args_.size() && args_[i] != "--";) {
    if (args_[i] == flag) {
      args_.erase(args_.begin() + i);
      found = true;
    } else {
      ++i;
    }
  }
  return found;
}

std::string Args::Value(const std::string& flag) {
  if (Done()) Usage(absl::StrCat(flag, " needs a value"));
  return Next();
}

bool Args::Has(const std::string& flag) const {
  for (size_t i = pos_; i < args_.size() && args_[i] != "--"; ++i) {
    if (args_[i] == flag) return true;
  }
  return false;
}

std::string Args::Remaining() const {
  std::string out;
  for (size_t i = pos_; i < args_.size(); ++i) absl::StrAppend(&out, i > pos_ ? " " : "", args_[i]);
  return out;
}

std::vector<std::string> Args::Rest() {
  std::vector<std::string> rest(args_.begin() + pos_, args_.end());
  pos_ = args_.size();
  return rest;
}

std::pair<std::string, std::string> KeyValue(const std::string& flag, const std::string& text) {
  size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0) {
    Usage(absl::StrCat(flag, " '", text, "' is not KEY=VALUE"));
  }
  return {text.substr(0, eq), text.substr(eq + 1)};
}

std::string Json(const google::protobuf::Message& message) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
}

grpc::Status PrintLogs(grpc::ClientReader<v1::GetLogsResponse>& reader, bool prefix_ranks,
                       bool json) {
  LogPrinter printer(prefix_ranks, [](bool to_stderr, std::string_view text) {
    std::fwrite(text.data(), 1, text.size(), to_stderr ? stderr : stdout);
  });
  v1::GetLogsResponse response;
  while (reader.Read(&response)) {
    for (const v1::LogChunk& c : response.chunks()) {
      if (json) {
        std::printf("%s\n", Json(c).c_str());
      } else {
        printer.Write(c.rank(), c.stream() == v1::RANK_OUTPUT_STREAM_STDERR, c.data());
      }
    }
    std::fflush(stdout);
  }
  printer.Flush();
  std::fflush(stdout);
  return reader.Finish();
}

}  // namespace ringmaster::cli
