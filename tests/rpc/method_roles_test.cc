// The role table (issue 29 item 3): every method of every service a Tandem
// server registers has a rule (walked through the generated descriptors),
// and under mutual TLS one check, in ServerCredentialsFor, refuses a wrong
// role and a role URI under a foreign trust domain, and admits the right
// role, before any handler runs; in plain text everything stays open.
#include "tandem/rpc/method_roles.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>

#include "google/protobuf/descriptor.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/server_builder.h"
#include "tandem/rpc/server.h"
#include "tandem/rpc/tls.h"
#include "tandem/v1/generation.grpc.pb.h"
#include "tandem/v1/kvstore.grpc.pb.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::rpc {
namespace {

using google::protobuf::DescriptorPool;
using google::protobuf::FileDescriptor;
using google::protobuf::ServiceDescriptor;

std::set<std::string> MethodsOf(const ServiceDescriptor& service) {
  std::set<std::string> paths;
  for (int m = 0; m < service.method_count(); ++m) {
    paths.insert("/" + service.full_name() + "/" + service.method(m)->name());
  }
  return paths;
}

// Every service of every .proto under protos/ (so a new file or service is
// covered without editing this test), plus health and reflection, which
// every server registers (rpc::EnableReflectionAndHealth).
std::set<std::string> AllServedMethods() {
  // Referencing the stubs links their descriptors into the generated pool.
  EXPECT_FALSE(std::string(v1::Worker::service_full_name()).empty());
  EXPECT_FALSE(std::string(v1::Generation::service_full_name()).empty());
  EXPECT_FALSE(std::string(v1::KvStore::service_full_name()).empty());
  EXPECT_FALSE(std::string(grpc::health::v1::Health::service_full_name()).empty());
  std::set<std::string> paths;
  const DescriptorPool* pool = DescriptorPool::generated_pool();
  const std::filesystem::path root = std::filesystem::path(TANDEM_SOURCE_DIR) / "protos";
  int files = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    if (entry.path().extension() != ".proto") continue;
    const std::string name = std::filesystem::relative(entry.path(), root).string();
    const FileDescriptor* file = pool->FindFileByName(name);
    EXPECT_NE(file, nullptr) << name << " is not in the generated pool: reference its stub above";
    if (file == nullptr) continue;
    ++files;
    for (int s = 0; s < file->service_count(); ++s) {
      std::set<std::string> m = MethodsOf(*file->service(s));
      paths.insert(m.begin(), m.end());
    }
  }
  EXPECT_GE(files, 4);
  for (const char* name : {"grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"}) {
    const ServiceDescriptor* service = pool->FindServiceByName(name);
    EXPECT_NE(service, nullptr) << name;
    if (service == nullptr) continue;
    std::set<std::string> m = MethodsOf(*service);
    paths.insert(m.begin(), m.end());
  }
  return paths;
}

TEST(MethodRolesTest, EveryServedMethodHasARuleAndEveryRuleAMethod) {
  const std::set<std::string> served = AllServedMethods();
  EXPECT_GE(served.size(), 15u);
  for (const std::string& path : served) {
    EXPECT_NE(FindMethodRoles(path), nullptr) << path << " has no rule in MethodRoleTable()";
  }
  for (const MethodRoles& rule : MethodRoleTable()) {
    EXPECT_TRUE(served.count(std::string(rule.path)) == 1)
        << rule.path << " is in the table but no service has it";
    EXPECT_TRUE(rule.any_verified_peer || !rule.roles.empty()) << rule.path;
  }
}

TEST(MethodRolesTest, TheTableSaysWhoMayCall) {
  auto may = [](std::string_view path, CallerRole role) {
    return AuthorizeMethod(path, role, "peer [test]").ok();
  };
  for (const char* m : {"/tandem.v1.Worker/Execute", "/tandem.v1.Worker/Describe"}) {
    EXPECT_TRUE(may(m, CallerRole::kScheduler)) << m;
    for (CallerRole r :
         {CallerRole::kNone, CallerRole::kWorker, CallerRole::kFrontend, CallerRole::kClient}) {
      EXPECT_FALSE(may(m, r)) << m << " " << CallerRoleName(r);
    }
  }
  for (const char* m : {"/tandem.v1.Generation/Generate", "/tandem.v1.Generation/Abort",
                        "/tandem.v1.Generation/GetModelInfo", "/tandem.v1.Generation/GetStats"}) {
    EXPECT_TRUE(may(m, CallerRole::kFrontend)) << m;
    EXPECT_TRUE(may(m, CallerRole::kClient)) << m;
    for (CallerRole r : {CallerRole::kNone, CallerRole::kWorker, CallerRole::kScheduler}) {
      EXPECT_FALSE(may(m, r)) << m << " " << CallerRoleName(r);
    }
  }
  EXPECT_TRUE(may("/tandem.v1.KvStore/Store", CallerRole::kWorker));
  EXPECT_TRUE(may("/tandem.v1.KvStore/Load", CallerRole::kWorker));
  EXPECT_FALSE(may("/tandem.v1.KvStore/Store", CallerRole::kScheduler));
  EXPECT_FALSE(may("/tandem.v1.KvStore/Load", CallerRole::kScheduler));
  EXPECT_TRUE(may("/tandem.v1.KvStore/Lookup", CallerRole::kScheduler));
  EXPECT_TRUE(may("/tandem.v1.KvStore/Release", CallerRole::kScheduler));
  EXPECT_FALSE(may("/tandem.v1.KvStore/Lookup", CallerRole::kWorker));
  EXPECT_FALSE(may("/tandem.v1.KvStore/Release", CallerRole::kWorker));
  for (const char* m : {"/tandem.v1.KvStore/CreateNamespace", "/tandem.v1.KvStore/Stats"}) {
    EXPECT_TRUE(may(m, CallerRole::kWorker)) << m;
    EXPECT_TRUE(may(m, CallerRole::kScheduler)) << m;
    EXPECT_FALSE(may(m, CallerRole::kFrontend)) << m;
    EXPECT_FALSE(may(m, CallerRole::kNone)) << m;
  }
  EXPECT_TRUE(may("/grpc.health.v1.Health/Check", CallerRole::kNone));
  EXPECT_FALSE(may("/tandem.v1.Nope/Nothing", CallerRole::kScheduler));  // unknown: refused
  // Without mutual TLS nothing is enforced, unknown methods included.
  EXPECT_TRUE(may("/tandem.v1.Worker/Execute", CallerRole::kUnverified));
  EXPECT_TRUE(may("/tandem.v1.Nope/Nothing", CallerRole::kUnverified));
  grpc::Status denied =
      AuthorizeMethod("/tandem.v1.Worker/Execute", CallerRole::kWorker, "peer [x]");
  EXPECT_EQ(denied.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(denied.error_message().find("scheduler role"), std::string::npos)
      << denied.error_message();
}

TEST(MethodRolesTest, RolesComeOnlyFromThePinnedTrustDomain) {
  auto role = [](std::vector<std::string> uris, std::string_view domain = "cluster.local") {
    return RoleFromUris(uris, domain);
  };
  EXPECT_EQ(role({"spiffe://cluster.local/tandem/scheduler"}), CallerRole::kScheduler);
  EXPECT_EQ(role({"spiffe://cluster.local/ns/a/tandem/worker"}), CallerRole::kWorker);
  EXPECT_EQ(role({"SPIFFE://Cluster.Local/tandem/frontend"}), CallerRole::kFrontend);
  EXPECT_EQ(role({"spiffe://cluster.local/tandem/client"}), CallerRole::kClient);
  EXPECT_EQ(role({"spiffe://evil.example/tandem/scheduler"}), CallerRole::kNone);
  EXPECT_EQ(role({"spiffe://cluster.local.evil/tandem/scheduler"}), CallerRole::kNone);
  EXPECT_EQ(role({"spiffe://evil/cluster.local/tandem/scheduler"}), CallerRole::kNone);
  EXPECT_EQ(role({"https://cluster.local/tandem/scheduler"}), CallerRole::kNone);
  EXPECT_EQ(role({"spiffe://cluster.local/tandem/root"}), CallerRole::kNone);
  EXPECT_EQ(role({"spiffe://cluster.local/tandem/scheduler"}, ""), CallerRole::kNone);
  EXPECT_EQ(role({"spiffe://evil/tandem/scheduler", "spiffe://cluster.local/tandem/worker"}),
            CallerRole::kWorker);
  EXPECT_EQ(role({"spiffe://tandem.test/tandem/worker"}, "tandem.test"), CallerRole::kWorker);
}

// Answers every Describe with the role the server saw (RoleOf), so a test
// sees both that the call got past the check and what role it had.
class EchoRoleWorker final : public v1::Worker::Service {
 public:
  grpc::Status Describe(grpc::ServerContext* ctx, const v1::DescribeRequest*,
                        v1::DescribeResponse*) override {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                        std::string("role=") + CallerRoleName(RoleOf(*ctx)));
  }
};

class MethodRolesServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    EnableReflectionAndHealth();  // as every service's main() does
    dir_ = new std::string(::testing::TempDir() + "method_roles_certs");
    std::filesystem::remove_all(*dir_);
    std::filesystem::create_directories(*dir_);
    const std::string ec = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes ";
    std::string cmd = "cd " + *dir_ + " && openssl req -x509" + ec +
                      "-keyout ca.key -out ca.pem -days 1 -subj /CN=test-ca";
    // name, URI SAN
    const std::vector<std::pair<std::string, std::string>> leaves = {
        {"server", "spiffe://cluster.local/tandem/worker"},
        {"scheduler", "spiffe://cluster.local/tandem/scheduler"},
        {"worker", "spiffe://cluster.local/tandem/worker"},
        {"frontend", "spiffe://cluster.local/tandem/frontend"},
        {"client", "spiffe://cluster.local/tandem/client"},
        {"foreign", "spiffe://evil.example/tandem/scheduler"},
    };
    for (const auto& [name, uri] : leaves) {
      cmd += " && printf 'subjectAltName=IP:127.0.0.1,URI:" + uri + "\\n' > " + name +
             ".ext && openssl req" + ec + "-keyout " + name + ".key -out " + name +
             ".csr -subj /CN=" + name + " && openssl x509 -req -in " + name +
             ".csr -CA ca.pem -CAkey ca.key -CAcreateserial -out " + name +
             ".pem -days 1 -extfile " + name + ".ext";
    }
    ASSERT_EQ(std::system(("(" + cmd + ") > /dev/null 2>&1").c_str()), 0) << cmd;
  }

  static TlsOptions Tls(const std::string& name) {
    return TlsOptions{.cert_file = *dir_ + "/" + name + ".pem",
                      .key_file = *dir_ + "/" + name + ".key",
                      .ca_file = *dir_ + "/ca.pem"};
  }

  void Start(bool mutual, const std::string& trust_domain = kDefaultTrustDomain) {
    ServerOptions options;
    if (mutual) options.tls = Tls("server");
    options.tls.trust_domain = trust_domain;
    grpc::ServerBuilder builder;
    builder.RegisterService(&worker_);
    builder.RegisterService(&generation_);
    builder.RegisterService(&kvstore_);
    absl::StatusOr<std::unique_ptr<grpc::Server>> server = BuildAndStart(&builder, options, &port_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
  }

  std::shared_ptr<grpc::Channel> Channel(const std::string& cert) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    return grpc::CreateCustomChannel(
        "127.0.0.1:" + std::to_string(port_),
        cert.empty() ? grpc::InsecureChannelCredentials() : ChannelCredentialsFor(Tls(cert)), args);
  }
  static void Deadline(grpc::ClientContext* ctx) {
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  }
  grpc::Status Describe(const std::string& cert) {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::DescribeResponse r;
    return v1::Worker::NewStub(Channel(cert))->Describe(&ctx, {}, &r);
  }
  grpc::Status Execute(const std::string& cert) {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    auto stream = v1::Worker::NewStub(Channel(cert))->Execute(&ctx);
    stream->WritesDone();
    return stream->Finish();
  }
  grpc::Status GetModelInfo(const std::string& cert) {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::GetModelInfoResponse r;
    return v1::Generation::NewStub(Channel(cert))->GetModelInfo(&ctx, {}, &r);
  }
  grpc::Status KvStats(const std::string& cert) {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::StatsResponse r;
    return v1::KvStore::NewStub(Channel(cert))->Stats(&ctx, {}, &r);
  }
  grpc::Status Health(const std::string& cert) {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    grpc::health::v1::HealthCheckResponse r;
    return grpc::health::v1::Health::NewStub(Channel(cert))->Check(&ctx, {}, &r);
  }

  static std::string* dir_;
  EchoRoleWorker worker_;
  v1::Generation::Service generation_;
  v1::KvStore::Service kvstore_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};
std::string* MethodRolesServerTest::dir_ = nullptr;

constexpr auto kDenied = grpc::StatusCode::PERMISSION_DENIED;
constexpr auto kPassed = grpc::StatusCode::UNIMPLEMENTED;  // past the check, to the handler

TEST_F(MethodRolesServerTest, MutualTlsChecksEveryCallAgainstTheTable) {
  Start(/*mutual=*/true);
  // Worker: the scheduler only; a foreign trust domain's "scheduler" is nobody.
  grpc::Status s = Describe("scheduler");
  EXPECT_EQ(s.error_code(), kPassed) << s.error_message();
  EXPECT_EQ(s.error_message(), "role=scheduler");
  for (const char* cert : {"worker", "frontend", "client", "foreign"}) {
    s = Describe(cert);
    EXPECT_EQ(s.error_code(), kDenied) << cert << ": " << s.error_message();
    s = Execute(cert);
    EXPECT_EQ(s.error_code(), kDenied) << cert << ": " << s.error_message();
  }
  const std::string why = Describe("foreign").error_message();
  EXPECT_NE(why.find("evil.example"), std::string::npos) << why;
  EXPECT_NE(why.find("trust domain cluster.local"), std::string::npos) << why;
  EXPECT_EQ(Execute("scheduler").error_code(), kPassed);
  // Generation: frontend and client.
  EXPECT_EQ(GetModelInfo("frontend").error_code(), kPassed);
  EXPECT_EQ(GetModelInfo("client").error_code(), kPassed);
  EXPECT_EQ(GetModelInfo("scheduler").error_code(), kDenied);
  EXPECT_EQ(GetModelInfo("foreign").error_code(), kDenied);
  // KvStore as before: Stats for workers and schedulers.
  EXPECT_EQ(KvStats("worker").error_code(), kPassed);
  EXPECT_EQ(KvStats("scheduler").error_code(), kPassed);
  EXPECT_EQ(KvStats("frontend").error_code(), kDenied);
  EXPECT_EQ(KvStats("foreign").error_code(), kDenied);
  // Health: any certificate the CA signed.
  for (const char* cert : {"scheduler", "foreign", "client"}) {
    EXPECT_EQ(Health(cert).error_code(), grpc::StatusCode::OK) << cert;
  }
}

TEST_F(MethodRolesServerTest, TheTrustDomainFlagPinsTheDomain) {
  TlsOptions options;
  FlagSet flags("test", "");
  AddTlsFlags(&flags, &options);
  EXPECT_EQ(options.trust_domain, "cluster.local");
  const char* argv[] = {"test", "--tls-trust-domain=evil.example"};
  ASSERT_TRUE(flags.Parse(2, const_cast<char**>(argv)).ok());
  EXPECT_EQ(options.trust_domain, "evil.example");
  // A server pinned to evil.example takes roles from there and not from
  // cluster.local.
  Start(/*mutual=*/true, options.trust_domain);
  grpc::Status s = Describe("foreign");
  EXPECT_EQ(s.error_code(), kPassed) << s.error_message();
  EXPECT_EQ(s.error_message(), "role=scheduler");
  EXPECT_EQ(Describe("scheduler").error_code(), kDenied);
}

TEST_F(MethodRolesServerTest, PlainTextStaysOpen) {
  Start(/*mutual=*/false);
  grpc::Status s = Describe("");
  EXPECT_EQ(s.error_code(), kPassed) << s.error_message();
  EXPECT_EQ(s.error_message(), "role=unverified");
  EXPECT_EQ(Execute("").error_code(), kPassed);
  EXPECT_EQ(GetModelInfo("").error_code(), kPassed);
  EXPECT_EQ(KvStats("").error_code(), kPassed);
}

}  // namespace
}  // namespace tandem::rpc
