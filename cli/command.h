// What every `ringmaster` command shares: the global options, walking argv, usage errors, printing
// messages as JSON, and the one-line failure of a call.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/tls.h"
#include "google/protobuf/message.h"
#include "grpcpp/grpcpp.h"
#include "ringmaster/v1/job.grpc.pb.h"

namespace ringmaster::cli {

struct Global {
  std::string coordinator;
  bool json = false;
  double timeout_seconds = 10;
  TlsFiles tls;       // none named: plaintext
  std::string token;  // a bearer token sent with every call ("": none)
};

// A client context whose deadline is the global timeout (for calls that are not streams that last),
// carrying the token.
std::unique_ptr<grpc::ClientContext> Context(const Global& g);
// A context without a deadline (a watch, a followed log), carrying the token.
std::unique_ptr<grpc::ClientContext> StreamContext(const Global& g);

// Prints `ringmaster: MESSAGE` and a hint to stderr, and exits 2.
[[noreturn]] void Usage(const std::string& message);

// "INVALID_ARGUMENT: message": the code's name and the message.
std::string Describe(const grpc::Status& status);

// Prints `ringmaster: CODE: message` to stderr and exits 1. When the coordinator could not be
// reached (UNAVAILABLE), a second line says which address was tried and how to name another.
[[noreturn]] void Fail(const Global& g, const grpc::Status& status);

// The hint Fail() prints for an unreachable coordinator at `address`.
std::string UnreachableHint(const std::string& address);

// Walks argv, handing out options and their values.
class Args {
 public:
  Args(int argc, char** argv) : args_(argv + 1, argv + argc) {}
  // Removes `flag` wherever it stands before "--"; returns whether it was there.
  bool Extract(const std::string& flag);
  bool Done() const { return pos_ >= args_.size(); }
  const std::string& Peek() const { return args_[pos_]; }
  std::string Next() { return args_[pos_++]; }
  // The value of `flag`: the next argument (a usage error when there is none).
  std::string Value(const std::string& flag);
  std::vector<std::string> Rest();
  // Whether `flag` stands at or after the current position, before any "--".
  bool Has(const std::string& flag) const;
  // The arguments from the current position on, joined by spaces (for messages).
  std::string Remaining() const;

 private:
  std::vector<std::string> args_;
  size_t pos_ = 0;
};

// When `args` asks for help (--help or -h before any "--"), prints `help` and exits 0.
void HelpIfAsked(const Args& args, const std::string& help);

// `text` as a number; a usage error naming `flag` otherwise.
template <typename T>
T Number(const std::string& flag, const std::string& text) {
  T value;
  bool ok;
  if constexpr (std::is_floating_point_v<T>) {
    ok = absl::SimpleAtod(text, &value);
  } else {
    ok = absl::SimpleAtoi(text, &value);
  }
  if (!ok) Usage(absl::StrCat(flag, " '", text, "' is not a number"));
  return value;
}

// "KEY=VALUE" split; a usage error naming `flag` otherwise.
std::pair<std::string, std::string> KeyValue(const std::string& flag, const std::string& text);

// The message as one line of JSON, with proto field names.
std::string Json(const google::protobuf::Message& message);

// Prints a GetLogs stream until it ends — chunks as JSON lines with `json`, else the text, each
// line prefixed `[rank] ` when `prefix_ranks` — and returns the stream's final status.
grpc::Status PrintLogs(grpc::ClientReader<v1::GetLogsResponse>& reader, bool prefix_ranks,
                       bool json);

}  // namespace ringmaster::cli
