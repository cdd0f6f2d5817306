// The coordinator's security on an in-process server with real TLS channels: certificates made by
// scripts/dev-ca.sh, bearer tokens from a token file. Each test is an attack from the issue, with
// the exact status a caller gets and a check that nothing changed.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/sim_worker.h"
#include "common/tls.h"
#include "coordinator/server.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "ringmaster/v1/cluster.grpc.pb.h"
#include "ringmaster/v1/job.grpc.pb.h"
#include "ringmaster/v1/rendezvous.grpc.pb.h"
#include "ringmaster/v1/worker.grpc.pb.h"

namespace ringmaster {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr absl::Duration kWait = absl::Seconds(10);

std::string Sh(const std::string& command) {
  const int rc = std::system(command.c_str());
  EXPECT_EQ(rc, 0) << command;
  return command;
}

void WriteFile(const std::string& path, const std::string& text) {
  // Replaced by rename, as Kubernetes updates a mounted secret: a reader never sees half a file.
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << text;
  std::filesystem::rename(tmp, path);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Certificates for the whole suite: dev-ca.sh's coordinator, worker, user and admin pairs, a second
// user (bob), a second worker identity (host-b), and a pair from another CA (stranger).
class Certs {
 public:
  static const std::string& Dir() {
    static const std::string dir = [] {
      std::string d = absl::StrCat(std::filesystem::temp_directory_path().string(),
                                   "/ringmaster-security-test-", getpid());
      std::filesystem::remove_all(d);
      const std::string script = absl::StrCat(RINGMASTER_SOURCE_DIR, "/scripts/dev-ca.sh");
      Sh(absl::StrCat("bash ", script, " ", d, " >/dev/null"));
      Sh(absl::StrCat("bash ", script, " ", d, " --issue bob --cn bob >/dev/null"));
      Sh(absl::StrCat("bash ", script, " ", d,
                      " --issue host-b --cn host-b --group ringmaster:workers >/dev/null"));
      Sh(absl::StrCat("bash ", script, " ", d, "/other-ca >/dev/null"));
      return d;
    }();
    return dir;
  }
  // The pair NAME, trusting the coordinator's CA.
  static TlsFiles Pair(const std::string& name) {
    return TlsFiles{.cert = absl::StrCat(Dir(), "/", name, "/tls.crt"),
                    .key = absl::StrCat(Dir(), "/", name, "/tls.key"),
                    .ca = absl::StrCat(Dir(), "/ca.crt")};
  }
  // A user certificate from another CA (its holder trusts the coordinator's CA).
  static TlsFiles Stranger() {
    return TlsFiles{.cert = absl::StrCat(Dir(), "/other-ca/user/tls.crt"),
                    .key = absl::StrCat(Dir(), "/other-ca/user/tls.key"),
                    .ca = absl::StrCat(Dir(), "/ca.crt")};
  }
  static TlsFiles CaOnly() { return TlsFiles{.ca = absl::StrCat(Dir(), "/ca.crt")}; }
};

std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token = "") {
  auto c = std::make_unique<grpc::ClientContext>();
  c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!token.empty()) c->AddMetadata("authorization", "Bearer " + token);
  return c;
}

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tokens_ = absl::StrCat(Certs::Dir(), "/tokens-",
                           ::testing::UnitTest::GetInstance()->current_test_info()->name(), ".csv");
    WriteFile(tokens_, "tok-alice,alice,1001,\"team-a\"\ntok-root,root,0,\"ringmaster:admins\"\n");
    ServerSecurity security;
    security.tls = Certs::Pair("coordinator");
    security.token_file = tokens_;
    Start(std::move(security));
  }

  void Start(ServerSecurity security) {
    server_ = std::make_unique<CoordinatorServer>(CoordinatorOptions{}, std::move(security));
    absl::StatusOr<int> port = server_->Start("127.0.0.1:0");
    ASSERT_TRUE(port.ok()) << port.status();
    target_ = absl::StrCat("localhost:", *port);
  }

  void TearDown() override {
    sims_.clear();
    server_->Stop();
  }

  // A fresh channel (its own connection: a rotated certificate is used for new ones).
  std::shared_ptr<grpc::Channel> Channel(const TlsFiles& tls) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    return grpc::CreateCustomChannel(target_, MakeChannelCredentials(tls), args);
  }
  std::unique_ptr<v1::JobService::Stub> Jobs(const TlsFiles& tls) {
    return v1::JobService::NewStub(Channel(tls));
  }

  SimWorker& AddWorker(const std::string& pair, const std::string& host) {
    sims_.push_back(std::make_unique<SimWorker>(Channel(Certs::Pair(pair)), host));
    absl::Status s = sims_.back()->Connect();
    EXPECT_TRUE(s.ok()) << s;
    return *sims_.back();
  }

  static v1::RegisterJobRequest JobRequest(int np) {
    v1::RegisterJobRequest request;
    request.mutable_spec()->set_name("secure");
    request.mutable_spec()->set_np(np);
    request.mutable_spec()->add_command("train");
    (*request.mutable_spec()->mutable_env())["AWS_SECRET_ACCESS_KEY"] = "hunter2";
    return request;
  }

  grpc::Status Submit(v1::JobService::Stub& stub, v1::Job* job, int np = 1,
                      const std::string& token = "") {
    v1::RegisterJobResponse response;
    grpc::Status s = stub.RegisterJob(Ctx(token).get(), JobRequest(np), &response);
    *job = response.job();
    return s;
  }

  grpc::Status GetJob(v1::JobService::Stub& stub, const std::string& id, v1::Job* job,
                      const std::string& token = "") {
    v1::GetJobRequest request;
    request.set_job_id(id);
    v1::GetJobResponse response;
    grpc::Status s = stub.GetJob(Ctx(token).get(), request, &response);
    *job = response.job();
    return s;
  }

  // Opens a session for `worker_id` with `secret`; OK once the coordinator accepted it.
  static grpc::Status TryOpen(v1::WorkerService::Stub& stub, const std::string& worker_id,
                              const std::string& secret, const std::string& token = "") {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
    auto stream = stub.Session(&context);
    v1::WorkerMessage open;
    open.mutable_open()->set_worker_id(worker_id);
    open.mutable_open()->set_secret(secret);
    stream->Write(open);
    v1::CoordinatorMessage m;
    if (stream->Read(&m) && m.has_accepted()) {
      context.TryCancel();
      stream->Finish();
      return grpc::Status::OK;
    }
    return stream->Finish();
  }

  std::string tokens_;
  std::unique_ptr<CoordinatorServer> server_;
  std::string target_;
  std::vector<std::unique_ptr<SimWorker>> sims_;
};

TEST_F(SecurityTest, APlaintextClientCannotTalkToATlsCoordinator) {
  auto plain = Jobs(TlsFiles{});
  v1::Job job;
  grpc::Status s = Submit(*plain, &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  // Nothing was registered: an admin sees no job.
  v1::ListJobsResponse list;
  ASSERT_TRUE(Jobs(Certs::Pair("admin"))->ListJobs(Ctx().get(), {}, &list).ok());
  EXPECT_EQ(list.jobs_size(), 0);
}

TEST_F(SecurityTest, ACertificateFromAnotherCaIsRefusedAtTheHandshake) {
  v1::Job job;
  grpc::Status s = Submit(*Jobs(Certs::Stranger()), &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(SecurityTest, ACallerWithoutCertificateOrTokenIsUnauthenticated) {
  v1::Job job;
  grpc::Status s = Submit(*Jobs(Certs::CaOnly()), &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(s.error_message(),
            "this coordinator requires authentication: a client certificate (--tls-cert, "
            "--tls-key) or a bearer token (--token or RINGMASTER_TOKEN)");
  s = Submit(*Jobs(Certs::CaOnly()), &job, 1, "tok-guessed");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(s.error_message(), "the bearer token is not in the coordinator's token file");
}

TEST_F(SecurityTest, JobsBelongToTheirSubmitterAndOthersAreDenied) {
  auto user = Jobs(Certs::Pair("user"));
  auto bob = Jobs(Certs::Pair("bob"));
  auto admin = Jobs(Certs::Pair("admin"));
  v1::Job job;
  ASSERT_TRUE(Submit(*user, &job).ok());
  EXPECT_EQ(job.owner(), "user");
  const std::string denied =
      absl::StrCat("user 'bob' may not see or change job ", job.id(),
                   ": it is not theirs (members of group ringmaster:admins may act on every job)");

  v1::Job seen;
  grpc::Status s = GetJob(*bob, job.id(), &seen);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(s.error_message(), denied);

  v1::CancelJobRequest cancel;
  cancel.set_job_id(job.id());
  v1::CancelJobResponse cancelled;
  s = bob->CancelJob(Ctx().get(), cancel, &cancelled);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(s.error_message(), denied);

  v1::GetLogsRequest logs;
  logs.set_job_id(job.id());
  logs.set_all_ranks(true);
  auto log_context = Ctx();
  auto reader = bob->GetLogs(log_context.get(), logs);
  v1::GetLogsResponse chunk;
  EXPECT_FALSE(reader->Read(&chunk));
  s = reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(s.error_message(), denied);

  v1::ListArtifactsRequest artifacts;
  artifacts.set_job_id(job.id());
  v1::ListArtifactsResponse listed;
  s = bob->ListArtifacts(Ctx().get(), artifacts, &listed);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(s.error_message(), denied);

  v1::GetArtifactRequest artifact;
  artifact.set_job_id(job.id());
  artifact.set_name("timeline.json");
  auto artifact_context = Ctx();
  auto artifact_reader = bob->GetArtifact(artifact_context.get(), artifact);
  v1::GetArtifactResponse data;
  EXPECT_FALSE(artifact_reader->Read(&data));
  s = artifact_reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);

  v1::WatchJobRequest watch;
  watch.set_job_id(job.id());
  auto watch_context = Ctx();
  auto watcher = bob->WatchJob(watch_context.get(), watch);
  v1::WatchJobResponse event;
  EXPECT_FALSE(watcher->Read(&event));
  EXPECT_EQ(watcher->Finish().error_code(), grpc::StatusCode::PERMISSION_DENIED);

  // Bob lists only his own jobs (none); the owner and an admin see it.
  v1::ListJobsResponse list;
  ASSERT_TRUE(bob->ListJobs(Ctx().get(), {}, &list).ok());
  EXPECT_EQ(list.jobs_size(), 0);
  ASSERT_TRUE(user->ListJobs(Ctx().get(), {}, &list).ok());
  ASSERT_EQ(list.jobs_size(), 1);
  ASSERT_TRUE(admin->ListJobs(Ctx().get(), {}, &list).ok());
  ASSERT_EQ(list.jobs_size(), 1);

  // Bob's cancel changed nothing; the admin's cancels it, and says so.
  ASSERT_TRUE(GetJob(*user, job.id(), &seen).ok());
  EXPECT_EQ(seen.state(), v1::JOB_STATE_PENDING);
  cancel.set_reason("by the admin");
  s = admin->CancelJob(Ctx().get(), cancel, &cancelled);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(cancelled.job().state(), v1::JOB_STATE_CANCELLED);
}

TEST_F(SecurityTest, EnvironmentValuesAreRedactedForClientsAndSentToTheJobsWorkers) {
  SimWorker& w = AddWorker("worker", "host-a");
  auto user = Jobs(Certs::Pair("user"));
  v1::Job job;
  ASSERT_TRUE(Submit(*user, &job).ok());
  EXPECT_EQ(job.spec().env().at("AWS_SECRET_ACCESS_KEY"), "<redacted>");
  EXPECT_TRUE(job.rendezvous_token().empty());
  absl::StatusOr<v1::JobAssignment> a = w.WaitAssignment(kWait);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->job().spec().env().at("AWS_SECRET_ACCESS_KEY"), "hunter2");
  EXPECT_EQ(a->rendezvous_token().size(), 64u);
  v1::Job seen;
  ASSERT_TRUE(GetJob(*user, job.id(), &seen).ok());
  EXPECT_EQ(seen.spec().env().at("AWS_SECRET_ACCESS_KEY"), "<redacted>");
  ASSERT_EQ(seen.ranks_size(), 1);
  EXPECT_EQ(seen.ranks(0).worker_identity(), "ringmaster-worker");
  EXPECT_TRUE(seen.ranks(0).worker_secret_sha256().empty());
  EXPECT_TRUE(seen.rendezvous_token().empty());
}

TEST_F(SecurityTest, WorkersMayNotSubmitAndUsersMayNotRegisterWorkers) {
  v1::Job job;
  grpc::Status s = Submit(*Jobs(Certs::Pair("worker")), &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(s.error_message(),
            "worker 'ringmaster-worker' is a worker identity (group ringmaster:workers); workers "
            "may not register jobs");

  auto workers = v1::WorkerService::NewStub(Channel(Certs::Pair("user")));
  v1::RegisterWorkerRequest request;
  request.set_host("host-x");
  request.set_device("cpu");
  v1::RegisterWorkerResponse response;
  s = workers->RegisterWorker(Ctx().get(), request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(s.error_message(),
            "user 'user' may not register a worker: only a worker identity may (a certificate "
            "with O=ringmaster:workers; a token never makes a worker)");
  v1::ListWorkersResponse listed;
  ASSERT_TRUE(v1::ClusterService::NewStub(Channel(Certs::Pair("admin")))
                  ->ListWorkers(Ctx().get(), {}, &listed)
                  .ok());
  EXPECT_EQ(listed.workers_size(), 0);
}

TEST_F(SecurityTest, ASessionNeedsTheIssuedSecretAndTheIdentityThatRegistered) {
  SimWorker& real = AddWorker("worker", "host-a");
  ASSERT_EQ(real.secret().size(), 64u);
  auto user = Jobs(Certs::Pair("user"));
  v1::Job job;
  ASSERT_TRUE(Submit(*user, &job).ok());
  ASSERT_TRUE(real.WaitAssignment(kWait).ok());

  // The same identity without the secret: refused, the real worker keeps its job.
  auto same = v1::WorkerService::NewStub(Channel(Certs::Pair("worker")));
  grpc::Status s = TryOpen(*same, real.worker_id(), "0000");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(s.error_message(),
            absl::StrCat("the session secret for worker_id '", real.worker_id(),
                         "' is not the one its registration issued: register again"));
  // Another worker identity with the right secret (stolen): refused too.
  auto other = v1::WorkerService::NewStub(Channel(Certs::Pair("host-b")));
  s = TryOpen(*other, real.worker_id(), real.secret());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(s.error_message(),
            absl::StrCat("worker_id '", real.worker_id(),
                         "' was registered by 'ringmaster-worker'; 'host-b' may not open its "
                         "session"));
  // A guessed id that is not registered.
  s = TryOpen(*same, "worker-000099", real.secret());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);

  v1::Job seen;
  ASSERT_TRUE(GetJob(*user, job.id(), &seen).ok());
  EXPECT_EQ(seen.state(), v1::JOB_STATE_STARTING);
  ASSERT_EQ(seen.ranks_size(), 1);
  EXPECT_EQ(seen.ranks(0).worker_id(), real.worker_id());
  v1::ListWorkersResponse listed;
  ASSERT_TRUE(v1::ClusterService::NewStub(Channel(Certs::Pair("admin")))
                  ->ListWorkers(Ctx().get(), {}, &listed)
                  .ok());
  ASSERT_EQ(listed.workers_size(), 1);
  EXPECT_EQ(listed.workers(0).state(), v1::WORKER_STATE_BUSY);
}

TEST_F(SecurityTest, TheSameIdentityRegisteringAgainReplacesItsOldWorker) {
  SimWorker& old_worker = AddWorker("worker", "host-a");
  auto user = Jobs(Certs::Pair("user"));
  v1::Job job;
  ASSERT_TRUE(Submit(*user, &job).ok());
  ASSERT_TRUE(old_worker.WaitAssignment(kWait).ok());
  old_worker.Close();  // its daemon died: its session is gone
  const absl::Time closed = absl::Now();
  SimWorker& restarted = AddWorker("worker", "host-a");  // and started again, same slot
  EXPECT_NE(restarted.worker_id(), old_worker.worker_id());
  v1::Job seen;
  const absl::Time deadline = absl::Now() + kWait;
  while (absl::Now() < deadline && GetJob(*user, job.id(), &seen).ok() &&
         seen.state() != v1::JOB_STATE_FAILED) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(seen.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(seen.reason(),
            absl::StrCat("worker ", old_worker.worker_id(),
                         " serving rank 0 on host host-a was lost: its identity "
                         "'ringmaster-worker' registered host-a host-a:cpu again, as ",
                         restarted.worker_id(), " (its daemon restarted or registered anew)"));
  // At once, not after the 2 s reconnect grace.
  EXPECT_LT(absl::Now() - closed, absl::Milliseconds(1500));
  v1::ListWorkersResponse listed;
  ASSERT_TRUE(v1::ClusterService::NewStub(Channel(Certs::Pair("admin")))
                  ->ListWorkers(Ctx().get(), {}, &listed)
                  .ok());
  // The old worker's row is gone, not left LOST beside the new one.
  ASSERT_EQ(listed.workers_size(), 1);
  EXPECT_EQ(listed.workers(0).worker_id(), restarted.worker_id());
  EXPECT_EQ(listed.workers(0).state(), v1::WORKER_STATE_IDLE);
}

TEST_F(SecurityTest, ClaimingALiveWorkersHostAndSlotDoesNotKnockItOut) {
  SimWorker& real = AddWorker("worker", "host-a");
  auto user = Jobs(Certs::Pair("user"));
  v1::Job job;
  ASSERT_TRUE(Submit(*user, &job).ok());
  ASSERT_TRUE(real.WaitAssignment(kWait).ok());
  // Another daemon holding the same (shared) certificate claims host-a's slot.
  SimWorker& claimant = AddWorker("worker", "host-a");
  EXPECT_NE(claimant.worker_id(), real.worker_id());
  absl::SleepFor(absl::Milliseconds(300));  // several housekeeping rounds
  v1::Job seen;
  ASSERT_TRUE(GetJob(*user, job.id(), &seen).ok());
  EXPECT_EQ(seen.state(), v1::JOB_STATE_STARTING);
  EXPECT_EQ(seen.reason(), "");
}

TEST_F(SecurityTest, RendezvousIsOpenOnlyToTheJobsWorkers) {
  SimWorker& member = AddWorker("worker", "host-a");
  SimWorker& outsider = AddWorker("host-b", "host-b");
  auto user = Jobs(Certs::Pair("user"));
  v1::Job job;
  ASSERT_TRUE(Submit(*user, &job).ok());
  absl::StatusOr<v1::JobAssignment> a = member.WaitAssignment(kWait);
  ASSERT_TRUE(a.ok()) << a.status();
  (void)outsider;

  v1::SetRequest set;
  set.set_job_id(job.id());
  set.set_epoch(a->epoch());
  set.set_key("nccl/unique_id");
  set.set_value("forged");
  v1::SetResponse set_response;
  const std::string denied =
      absl::StrCat("the rendezvous of job ", job.id(), " epoch ", a->epoch(),
                   " is open only to its ranks' workers: the call did not carry the epoch's "
                   "rendezvous token");
  // The job's owner, and a worker not in the job: neither holds the token.
  for (const char* pair : {"user", "host-b"}) {
    auto rdv = v1::RendezvousService::NewStub(Channel(Certs::Pair(pair)));
    grpc::Status s = rdv->Set(Ctx().get(), set, &set_response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << pair;
    EXPECT_EQ(s.error_message(), denied) << pair;
    auto wrong = Ctx();
    wrong->AddMetadata("x-ringmaster-rendezvous-token", std::string(64, '0'));
    s = rdv->Set(wrong.get(), set, &set_response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << pair;
  }
  // Nothing was set; the member, with the token, sets and reads it.
  auto rdv = v1::RendezvousService::NewStub(Channel(Certs::Pair("worker")));
  auto with_token = [&] {
    std::unique_ptr<grpc::ClientContext> c = Ctx();
    c->AddMetadata("x-ringmaster-rendezvous-token", a->rendezvous_token());
    return c;
  };
  v1::GetRequest get;
  get.set_job_id(job.id());
  get.set_epoch(a->epoch());
  get.set_key("nccl/unique_id");
  v1::GetResponse got;
  EXPECT_EQ(rdv->Get(with_token().get(), get, &got).error_code(), grpc::StatusCode::NOT_FOUND);
  set.set_value("real");
  ASSERT_TRUE(rdv->Set(with_token().get(), set, &set_response).ok());
  ASSERT_TRUE(rdv->Get(with_token().get(), get, &got).ok());
  EXPECT_EQ(got.value(), "real");

  // The job's code and its ranks' outputs go through the rendezvous too. Without the token the
  // code is denied; with it, a job that carries no code has none to fetch.
  v1::GetJobSourceRequest source;
  source.set_job_id(job.id());
  source.set_epoch(a->epoch());
  for (const bool token : {false, true}) {
    std::unique_ptr<grpc::ClientContext> c = token ? with_token() : Ctx();
    auto reader = rdv->GetJobSource(c.get(), source);
    v1::GetJobSourceResponse chunk;
    EXPECT_FALSE(reader->Read(&chunk));
    const grpc::Status s = reader->Finish();
    if (token) {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
      EXPECT_EQ(s.error_message(), absl::StrCat("job ", job.id(), " has no source archive"));
    } else {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
      EXPECT_EQ(s.error_message(), denied);
    }
  }
  // A rank's output sent without the token (by the job's owner) is refused and stores nothing.
  {
    auto owner_rdv = v1::RendezvousService::NewStub(Channel(Certs::Pair("user")));
    std::unique_ptr<grpc::ClientContext> c = Ctx();
    v1::PutRankOutputResponse put;
    auto writer = owner_rdv->PutRankOutput(c.get(), &put);
    v1::PutRankOutputRequest header;
    header.mutable_header()->set_job_id(job.id());
    header.mutable_header()->set_epoch(a->epoch());
    header.mutable_header()->set_rank(0);
    v1::PutRankOutputRequest file;
    file.mutable_chunk()->set_path("model.pt");
    file.mutable_chunk()->set_first(true);
    file.mutable_chunk()->set_data("forged");
    writer->Write(header);
    writer->Write(file);
    writer->WritesDone();
    const grpc::Status s = writer->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_EQ(s.error_message(),
              absl::StrCat("the output of job ", job.id(), " epoch ", a->epoch(),
                           " is accepted only from its ranks' workers: the call did not carry "
                           "the epoch's rendezvous token"));
    v1::ListArtifactsRequest list;
    list.set_job_id(job.id());
    v1::ListArtifactsResponse artifacts;
    ASSERT_TRUE(user->ListArtifacts(Ctx().get(), list, &artifacts).ok());
    for (const v1::Artifact& artifact : artifacts.artifacts()) {
      EXPECT_FALSE(absl::StartsWith(artifact.name(), "rank-")) << artifact.name();
    }
  }
  // Once the job has ended, a caller without the token still learns nothing of its state.
  auto cancel = Jobs(Certs::Pair("user"));
  v1::CancelJobRequest cancel_request;
  cancel_request.set_job_id(job.id());
  v1::CancelJobResponse cancelled;
  ASSERT_TRUE(cancel->CancelJob(Ctx().get(), cancel_request, &cancelled).ok());
  auto stranger = v1::RendezvousService::NewStub(Channel(Certs::Pair("host-b")));
  grpc::Status s = stranger->Set(Ctx().get(), set, &set_response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(s.error_message(), denied);
  // The member, with the token, is told it is closed.
  s = rdv->Set(with_token().get(), set, &set_response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(s.error_message(),
            absl::StrCat("job ", job.id(), " is CANCELLED; its rendezvous is closed"));
}

// A token never makes a worker, whatever its line's groups say; nor does it ride along with a
// certificate: a call with both is refused.
TEST_F(SecurityTest, ATokenNeverMakesAWorkerAndTwoIdentitiesAreRefused) {
  WriteFile(tokens_,
            "tok-alice,alice,1001,\"team-a\"\ntok-fake-worker,node-9,0,\"ringmaster:workers\"\n");
  absl::SleepFor(absl::Milliseconds(1500));  // the file is read again within a second
  auto workers = v1::WorkerService::NewStub(Channel(Certs::CaOnly()));
  v1::RegisterWorkerRequest request;
  request.set_host("host-x");
  request.set_device("cpu");
  v1::RegisterWorkerResponse response;
  grpc::Status s = workers->RegisterWorker(Ctx("tok-fake-worker").get(), request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(s.error_message(),
            "user 'node-9' may not register a worker: only a worker identity may (a certificate "
            "with O=ringmaster:workers; a token never makes a worker)");
  // Nor open a session for one.
  SimWorker& real = AddWorker("worker", "host-a");
  s = TryOpen(*workers, real.worker_id(), real.secret(), "tok-fake-worker");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(s.error_message(),
            "user 'node-9' may not open a worker session: only a worker certificate may "
            "(O=ringmaster:workers)");
  // A user's certificate and alice's token together: neither wins.
  auto both = Jobs(Certs::Pair("user"));
  v1::Job job;
  s = Submit(*both, &job, 1, "tok-alice");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(s.error_message(),
            "the call carries two identities, a client certificate and a bearer token: send one "
            "(drop --token / RINGMASTER_TOKEN, or the client certificate)");
  v1::ListJobsResponse list;
  ASSERT_TRUE(Jobs(Certs::Pair("admin"))->ListJobs(Ctx().get(), {}, &list).ok());
  EXPECT_EQ(list.jobs_size(), 0);
  v1::ListWorkersResponse listed;
  ASSERT_TRUE(v1::ClusterService::NewStub(Channel(Certs::Pair("admin")))
                  ->ListWorkers(Ctx().get(), {}, &listed)
                  .ok());
  ASSERT_EQ(listed.workers_size(), 1);
  EXPECT_EQ(listed.workers(0).worker_id(), real.worker_id());
}

// Which job a busy worker serves is for the job's owner and admins to see.
TEST_F(SecurityTest, OnlyTheOwnerAndAdminsSeeWhichJobABusyWorkerServes) {
  AddWorker("worker", "host-a");
  auto user = Jobs(Certs::Pair("user"));
  v1::Job job;
  ASSERT_TRUE(Submit(*user, &job).ok());
  ASSERT_TRUE(sims_.back()->WaitAssignment(kWait).ok());
  auto listing = [&](const TlsFiles& tls, const std::string& token) {
    v1::ListWorkersResponse listed;
    EXPECT_TRUE(
        v1::ClusterService::NewStub(Channel(tls))->ListWorkers(Ctx(token).get(), {}, &listed).ok());
    EXPECT_EQ(listed.workers_size(), 1);
    return listed.workers_size() == 1
               ? std::make_pair(listed.workers(0).job_id(), listed.workers(0).rank())
               : std::make_pair(std::string("?"), -2);
  };
  EXPECT_EQ(listing(Certs::Pair("user"), ""), std::make_pair(job.id(), 0));
  EXPECT_EQ(listing(Certs::Pair("admin"), ""), std::make_pair(job.id(), 0));
  EXPECT_EQ(listing(Certs::CaOnly(), "tok-alice"), std::make_pair(std::string(), -1));
}

TEST_F(SecurityTest, BearerTokensAuthenticateUsersAndTheFileIsReloaded) {
  auto tokens_only = Jobs(Certs::CaOnly());
  v1::Job job;
  ASSERT_TRUE(Submit(*tokens_only, &job, 1, "tok-alice").ok());
  EXPECT_EQ(job.owner(), "alice");
  v1::ListJobsResponse list;
  ASSERT_TRUE(tokens_only->ListJobs(Ctx("tok-root").get(), {}, &list).ok());
  EXPECT_EQ(list.jobs_size(), 1);  // root is in ringmaster:admins

  // carol is added: her token works once the file is read again (checked every second).
  WriteFile(tokens_, "tok-alice,alice,1001,\"team-a\"\ntok-carol,carol,1002\n");
  grpc::Status s;
  const absl::Time deadline = absl::Now() + kWait;
  do {
    absl::SleepFor(absl::Milliseconds(100));
    s = tokens_only->ListJobs(Ctx("tok-carol").get(), {}, &list);
  } while (!s.ok() && absl::Now() < deadline);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(list.jobs_size(), 0);  // alice's job is not carol's
  // root was removed with the rewrite.
  s = tokens_only->ListJobs(Ctx("tok-root").get(), {}, &list);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // A malformed rewrite keeps the last good contents.
  WriteFile(tokens_, "tok-alice\n");
  absl::SleepFor(absl::Milliseconds(1500));
  EXPECT_TRUE(tokens_only->ListJobs(Ctx("tok-carol").get(), {}, &list).ok());
}

// A token removed from the file ends the streams it opened within the reload period.
TEST_F(SecurityTest, ARevokedTokenEndsTheStreamsItOpened) {
  auto alice = Jobs(Certs::CaOnly());
  v1::Job job;
  ASSERT_TRUE(Submit(*alice, &job, 1, "tok-alice").ok());
  grpc::ClientContext watching;
  watching.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  watching.AddMetadata("authorization", "Bearer tok-alice");
  v1::WatchJobRequest watch;
  watch.set_job_id(job.id());
  auto stream = alice->WatchJob(&watching, watch);
  v1::WatchJobResponse first;
  ASSERT_TRUE(stream->Read(&first));  // the job as it is
  EXPECT_EQ(first.job().id(), job.id());
  const absl::Time revoked = absl::Now();
  WriteFile(tokens_, "tok-root,root,0,\"ringmaster:admins\"\n");
  v1::WatchJobResponse more;
  while (stream->Read(&more)) {
  }
  const grpc::Status s = stream->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(s.error_message(),
            "the bearer token that opened this stream was revoked (it is no longer in the "
            "coordinator's token file)");
  // The file is read again within a second, and checked every second.
  EXPECT_LT(absl::Now() - revoked, absl::Seconds(4));
}

TEST(SecurityRotation, ANewCaBundleIsTrustedWithoutARestart) {
  const std::string dir = absl::StrCat(Certs::Dir(), "/rotation");
  std::filesystem::create_directories(dir);
  const std::string ca = dir + "/ca.crt";
  WriteFile(ca, ReadFile(Certs::Dir() + "/ca.crt"));
  ServerSecurity security;
  security.tls = Certs::Pair("coordinator");
  security.tls.ca = ca;
  CoordinatorServer server(CoordinatorOptions{}, std::move(security));
  absl::StatusOr<int> port = server.Start("127.0.0.1:0");
  ASSERT_TRUE(port.ok()) << port.status();
  auto list = [&] {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto stub = v1::JobService::NewStub(grpc::CreateCustomChannel(
        absl::StrCat("localhost:", *port), MakeChannelCredentials(Certs::Stranger()), args));
    v1::ListJobsResponse response;
    return stub->ListJobs(Ctx().get(), {}, &response);
  };
  EXPECT_EQ(list().error_code(), grpc::StatusCode::UNAVAILABLE);
  // The other CA joins the bundle (as a rotation to a new CA starts): new connections take it.
  WriteFile(ca, ReadFile(Certs::Dir() + "/ca.crt") + ReadFile(Certs::Dir() + "/other-ca/ca.crt"));
  grpc::Status s;
  const absl::Time deadline = absl::Now() + kWait;
  do {
    absl::SleepFor(absl::Milliseconds(200));
    s = list();
  } while (!s.ok() && absl::Now() < deadline);
  EXPECT_TRUE(s.ok()) << s.error_message();
  server.Stop();
}

// A CA that leaves the bundle (the end of a rotation away from it) ends the sessions of the
// workers whose certificates it signed, within the bundle's reload period; the others go on.
TEST(SecurityRotation, ACaThatLeavesTheBundleEndsTheSessionsItAdmitted) {
  const std::string dir = absl::StrCat(Certs::Dir(), "/leaving");
  std::filesystem::create_directories(dir);
  const std::string ca = dir + "/ca.crt";
  const std::string both =
      ReadFile(Certs::Dir() + "/ca.crt") + ReadFile(Certs::Dir() + "/other-ca/ca.crt");
  WriteFile(ca, both);
  ServerSecurity security;
  security.tls = Certs::Pair("coordinator");
  security.tls.ca = ca;
  CoordinatorServer server(CoordinatorOptions{}, std::move(security));
  absl::StatusOr<int> port = server.Start("127.0.0.1:0");
  ASSERT_TRUE(port.ok()) << port.status();
  auto channel = [&](const TlsFiles& tls) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    return grpc::CreateCustomChannel(absl::StrCat("localhost:", *port), MakeChannelCredentials(tls),
                                     args);
  };
  // A worker of the other CA (trusting the coordinator's), and one of the coordinator's own CA.
  TlsFiles leaving{.cert = Certs::Dir() + "/other-ca/worker/tls.crt",
                   .key = Certs::Dir() + "/other-ca/worker/tls.key",
                   .ca = Certs::Dir() + "/ca.crt"};
  SimWorker old_ca(channel(leaving), "host-old");
  ASSERT_TRUE(old_ca.Connect().ok());
  SimWorker staying(channel(Certs::Pair("worker")), "host-new");
  ASSERT_TRUE(staying.Connect().ok());
  // A user of the other CA follows a job of theirs.
  TlsFiles old_user{.cert = Certs::Dir() + "/other-ca/user/tls.crt",
                    .key = Certs::Dir() + "/other-ca/user/tls.key",
                    .ca = Certs::Dir() + "/ca.crt"};
  auto old_jobs = v1::JobService::NewStub(channel(old_user));
  v1::RegisterJobRequest request;
  request.mutable_spec()->set_name("followed");
  request.mutable_spec()->set_np(3);  // never placed: it stays pending
  request.mutable_spec()->add_command("train");
  v1::RegisterJobResponse registered;
  ASSERT_TRUE(old_jobs->RegisterJob(Ctx().get(), request, &registered).ok());
  grpc::ClientContext watching;
  watching.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::WatchJobRequest watch;
  watch.set_job_id(registered.job().id());
  auto stream = old_jobs->WatchJob(&watching, watch);
  v1::WatchJobResponse first;
  ASSERT_TRUE(stream->Read(&first));
  const absl::Time rotated = absl::Now();
  WriteFile(ca, ReadFile(Certs::Dir() + "/ca.crt"));
  auto admin = v1::ClusterService::NewStub(channel(Certs::Pair("admin")));
  auto connected = [&](const std::string& id) {
    v1::ListWorkersResponse listed;
    if (!admin->ListWorkers(Ctx().get(), {}, &listed).ok()) return true;
    for (const v1::WorkerInfo& w : listed.workers()) {
      if (w.worker_id() == id) return w.state() == v1::WORKER_STATE_IDLE;
    }
    return false;
  };
  while (connected(old_ca.worker_id()) && absl::Now() - rotated < kWait) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_LT(absl::Now() - rotated, absl::Seconds(5));  // read again within 2 s, checked every 1 s
  const grpc::Status ended = old_ca.Close();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(ended.error_message(),
            "the certificate that opened this session is no longer trusted (its CA left the "
            "coordinator's --tls-ca bundle, or it expired): reconnect with a trusted one");
  EXPECT_TRUE(connected(staying.worker_id()));
  v1::WatchJobResponse more;
  while (stream->Read(&more)) {
  }
  const grpc::Status watch_ended = stream->Finish();
  EXPECT_EQ(watch_ended.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(watch_ended.error_message(),
            "the certificate that opened this stream is no longer trusted (its CA left the "
            "coordinator's --tls-ca bundle, or it expired)");
  server.Stop();
}

TEST(SecurityDefaults, PlaintextOnANonLoopbackAddressIsRefusedUnlessAllowed) {
  {
    CoordinatorServer server(CoordinatorOptions{});
    absl::StatusOr<int> port = server.Start("0.0.0.0:0");
    EXPECT_EQ(port.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(port.status().message(),
              "refusing to listen on 0.0.0.0:0 without TLS: anyone who reaches it could run any "
              "command on every worker. Give --tls-cert, --tls-key and --tls-ca "
              "(scripts/dev-ca.sh makes a first set), or listen on loopback (--listen "
              "127.0.0.1:50051), or accept the risk with --insecure-allow-remote");
  }
  {
    ServerSecurity security;
    security.insecure_allow_remote = true;
    CoordinatorServer server(CoordinatorOptions{}, security);
    EXPECT_TRUE(server.Start("0.0.0.0:0").ok());
  }
  {
    // Tokens are never taken in the clear off loopback.
    ServerSecurity security;
    security.insecure_allow_remote = true;
    security.token_file = "/dev/null";
    CoordinatorServer server(CoordinatorOptions{}, security);
    absl::StatusOr<int> port = server.Start("0.0.0.0:0");
    EXPECT_EQ(port.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(port.status().message(),
              "refusing to take bearer tokens (--token-file) in plaintext on 0.0.0.0:0: they would "
              "cross the network in the clear. Give --tls-cert, --tls-key and --tls-ca");
  }
  {
    ServerSecurity security;
    security.tls = Certs::Pair("coordinator");
    CoordinatorServer server(CoordinatorOptions{}, security);
    EXPECT_TRUE(server.Start("0.0.0.0:0").ok());
  }
  {
    ServerSecurity security;
    security.tls = Certs::Pair("coordinator");
    security.tls.key = "/nonexistent/tls.key";
    CoordinatorServer server(CoordinatorOptions{}, security);
    absl::StatusOr<int> port = server.Start("127.0.0.1:0");
    EXPECT_EQ(port.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(port.status().message(),
              "--tls-key /nonexistent/tls.key: cannot be read: No such file or directory");
  }
}

TEST(SecurityDefaults, AUnixSocketServesWithTheSameAuthentication) {
  const std::string tokens = absl::StrCat(Certs::Dir(), "/tokens-unix.csv");
  WriteFile(tokens, "tok-root,root,0,\"ringmaster:admins\"\n");
  const std::string socket = absl::StrCat(Certs::Dir(), "/coordinator-", getpid(), ".sock");
  ServerSecurity security;
  security.token_file = tokens;
  CoordinatorServer server(CoordinatorOptions{}, security);
  absl::StatusOr<int> port = server.Start("127.0.0.1:0", socket);
  ASSERT_TRUE(port.ok()) << port.status();
  auto jobs = v1::JobService::NewStub(
      grpc::CreateChannel(absl::StrCat("unix:", socket), grpc::InsecureChannelCredentials()));
  v1::ListJobsResponse response;
  grpc::Status s = jobs->ListJobs(Ctx().get(), {}, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  s = jobs->ListJobs(Ctx("tok-root").get(), {}, &response);
  EXPECT_TRUE(s.ok()) << s.error_message();
  server.Stop();

  CoordinatorServer nowhere(CoordinatorOptions{});
  port = nowhere.Start("127.0.0.1:0", "/nonexistent/dir/coordinator.sock");
  EXPECT_EQ(port.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(port.status().message(),
            "cannot listen on the Unix socket /nonexistent/dir/coordinator.sock (--listen-unix): "
            "its directory must exist and be writable");
}

TEST(SecurityDefaults, LoopbackAddresses) {
  EXPECT_TRUE(IsLoopbackAddress("127.0.0.1:50051"));
  EXPECT_TRUE(IsLoopbackAddress("127.3.2.1:1"));
  EXPECT_TRUE(IsLoopbackAddress("localhost:50051"));
  EXPECT_TRUE(IsLoopbackAddress("[::1]:50051"));
  EXPECT_FALSE(IsLoopbackAddress("0.0.0.0:50051"));
  EXPECT_FALSE(IsLoopbackAddress("[::]:50051"));
  EXPECT_FALSE(IsLoopbackAddress(":50051"));
  EXPECT_FALSE(IsLoopbackAddress("10.0.0.1:50051"));
  EXPECT_FALSE(IsLoopbackAddress("coordinator.example.com:50051"));
}

}  // namespace
}  // namespace ringmaster
