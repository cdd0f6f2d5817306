#include "common/metrics_server.h"

#include <atomic>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "httplib.h"

namespace ringmaster {
namespace {

TEST(MetricsServerTest, ProbesAnswerOkOr503WithTheReason) {
  MetricsRegistry registry;
  registry.GetCounter("ringmaster_test_total", "A counter.").Increment();
  std::atomic<bool> connected{false};
  absl::StatusOr<std::unique_ptr<MetricsServer>> server = MetricsServer::Start(
      "127.0.0.1:0", &registry, HealthChecks{.ready = [&connected] {
        return connected ? absl::OkStatus()
                         : absl::UnavailableError("not connected to the coordinator at c:1");
      }});
  ASSERT_TRUE(server.ok()) << server.status();
  httplib::Client client("127.0.0.1", (*server)->port());

  httplib::Result live = client.Get("/healthz");  // no check given: alive
  ASSERT_TRUE(live);
  EXPECT_EQ(live->status, 200);
  EXPECT_EQ(live->body, "ok\n");

  httplib::Result ready = client.Get("/readyz");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 503);
  EXPECT_EQ(ready->body, "not connected to the coordinator at c:1\n");
  connected = true;
  ready = client.Get("/readyz");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 200);
  EXPECT_EQ(ready->body, "ok\n");

  httplib::Result metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  EXPECT_NE(metrics->body.find("ringmaster_test_total 1\n"), std::string::npos) << metrics->body;
}

}  // namespace
}  // namespace ringmaster
