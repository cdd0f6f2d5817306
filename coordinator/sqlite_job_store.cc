#include "coordinator/sqlite_job_store.h"

#include <sqlite3.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/service/proto_convert.h"
#include "ringmaster/v1/job.pb.h"

namespace ringmaster {
namespace {

class SqliteJobStore final : public JobStore {
 public:
  SqliteJobStore(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  ~SqliteJobStore() override { sqlite3_close(db_); }

  absl::Status Put(const Job& job) override {
    v1::Job record;
    ToProto(job, &record);
    record.clear_throughput();  // live figures are not state
    record.clear_waiting_reason();
    const std::string bytes = record.SerializeAsString();
    absl::MutexLock lock(&mu_);
    sqlite3_stmt* put = nullptr;
    int rc = sqlite3_prepare_v2(
        db_,
        "INSERT INTO jobs(id, record) VALUES(?1, ?2) ON CONFLICT(id) DO UPDATE SET record = ?2", -1,
        &put, nullptr);
    if (rc == SQLITE_OK) {
      sqlite3_bind_text(put, 1, job.id.data(), static_cast<int>(job.id.size()), SQLITE_STATIC);
      sqlite3_bind_blob(put, 2, bytes.data(), static_cast<int>(bytes.size()), SQLITE_STATIC);
      rc = sqlite3_step(put);
    }
    sqlite3_finalize(put);
    if (rc != SQLITE_DONE) return Error("writing job " + job.id);
    return absl::OkStatus();
  }

  absl::StatusOr<Job> Get(const std::string& id) const override {
    absl::MutexLock lock(&mu_);
    sqlite3_stmt* get = nullptr;
    if (sqlite3_prepare_v2(db_, "SELECT record FROM jobs WHERE id = ?1", -1, &get, nullptr) !=
        SQLITE_OK) {
      return Error("reading job " + id);
    }
    sqlite3_bind_text(get, 1, id.data(), static_cast<int>(id.size()), SQLITE_STATIC);
    absl::StatusOr<Job> job = absl::NotFoundError(absl::StrCat("job '", id, "' not found"));
    if (sqlite3_step(get) == SQLITE_ROW) job = Decode(get);
    sqlite3_finalize(get);
    return job;
  }

  absl::Status Delete(const std::string& id) override {
    absl::MutexLock lock(&mu_);
    sqlite3_stmt* del = nullptr;
    int rc = sqlite3_prepare_v2(db_, "DELETE FROM jobs WHERE id = ?1", -1, &del, nullptr);
    if (rc == SQLITE_OK) {
      sqlite3_bind_text(del, 1, id.data(), static_cast<int>(id.size()), SQLITE_STATIC);
      rc = sqlite3_step(del);
    }
    sqlite3_finalize(del);
    if (rc != SQLITE_DONE) return Error("deleting job " + id);
    return absl::OkStatus();
  }

  std::vector<Job> List() const override {
    absl::MutexLock lock(&mu_);
    std::vector<Job> jobs;
    sqlite3_stmt* list = nullptr;
    if (sqlite3_prepare_v2(db_, "SELECT record FROM jobs ORDER BY rowid", -1, &list, nullptr) !=
        SQLITE_OK) {
      return jobs;
    }
    while (sqlite3_step(list) == SQLITE_ROW) {
      if (absl::StatusOr<Job> job = Decode(list); job.ok()) jobs.push_back(*std::move(job));
    }
    sqlite3_finalize(list);
    return jobs;
  }

 private:
  static absl::StatusOr<Job> Decode(sqlite3_stmt* row) {
    v1::Job record;
    const void* blob = sqlite3_column_blob(row, 0);
    const int size = sqlite3_column_bytes(row, 0);
    if (!record.ParseFromArray(blob, size)) return absl::DataLossError("a job record is corrupt");
    Job job;
    if (absl::Status s = FromProto(record, &job); !s.ok()) return s;
    return job;
  }

  absl::Status Error(const std::string& what) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return absl::UnavailableError(
        absl::StrCat("state store ", path_, ": ", what, ": ", sqlite3_errmsg(db_)));
  }

  sqlite3* const db_;
  const std::string path_;
  mutable absl::Mutex mu_;  // one statement at a time on the connection
};

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> OpenSqliteJobStore(const std::string& dir) {
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::UnavailableError(
        absl::StrCat("--state-dir ", dir, ": cannot create it: ", std::strerror(errno)));
  }
  const std::string path = absl::StrCat(dir, "/jobs.db");
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) !=
      SQLITE_OK) {
    absl::Status s =
        absl::UnavailableError(absl::StrCat("--state-dir ", dir, ": cannot open ", path, ": ",
                                            db != nullptr ? sqlite3_errmsg(db) : "out of memory"));
    sqlite3_close(db);
    return s;
  }
  sqlite3_busy_timeout(db, 2000);
  // WAL: readers never block the writer; synchronous=FULL: a change is on disk before Put returns.
  const char* setup =
      "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"
      "CREATE TABLE IF NOT EXISTS jobs(id TEXT PRIMARY KEY, record BLOB NOT NULL);";
  char* error = nullptr;
  if (sqlite3_exec(db, setup, nullptr, nullptr, &error) != SQLITE_OK) {
    absl::Status s = absl::UnavailableError(absl::StrCat(
        "--state-dir ", dir, ": cannot set up ", path, ": ", error != nullptr ? error : "?"));
    sqlite3_free(error);
    sqlite3_close(db);
    return s;
  }
  return std::unique_ptr<JobStore>(new SqliteJobStore(db, path));
}

}  // namespace ringmaster
