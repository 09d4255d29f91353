// TLS files rewritten under a running gRPC server and client (issue 29): an
// empty, truncated, garbage or mismatched file keeps the last good pair (new
// connections keep working, the process does not abort), is counted once in
// tandem_tls_reload_failures_total, and a good new pair from the same CA takes
// effect, also when it is written as two separate files.
#include "tandem/rpc/tls_reload.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "grpc/grpc_security_constants.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/server_builder.h"
#include "prometheus/registry.h"
#include "../wait_for.h"

namespace tandem::rpc {
namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;
using tandem::testing::WaitFor;

std::string Read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream text;
  text << f.rdbuf();
  return text.str();
}

// Set by a test's child process just before it exits. An exit handler
// registered before main, so before any TlsReloader's, runs after theirs:
// where OpenSSL's own handler (registered when libssl loads) runs next, it
// names the threads that would still call into OpenSSL then.
bool exit_probe = false;
const bool kExitProbeRegistered = [] {
  std::atexit([] {
    if (!exit_probe) return;
    std::string left;
    for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
      std::string name = Read(task.path().string() + "/comm");
      if (!name.empty() && name.back() == '\n') name.pop_back();
      if (name == "FileWatcherCert" || name == "tls-reload") left += " " + name;
    }
    std::fprintf(stderr, "left at exit: [%s ]\n", left.c_str());
  });
  return true;
}();

// As an operator's tool that writes a new file and renames it into place.
void Replace(const std::string& path, const std::string& text) {
  std::ofstream(path + ".new", std::ios::binary | std::ios::trunc) << text;
  std::filesystem::rename(path + ".new", path);
}

// Answers SERVING and names the client's certificate (its CN) in the
// trailing metadata.
class PeerNamingHealth final : public Health::Service {
  grpc::Status Check(grpc::ServerContext* context, const HealthCheckRequest*,
                     HealthCheckResponse* response) override {
    std::string cn;
    for (const grpc::string_ref& v :
         context->auth_context()->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME)) {
      cn.assign(v.data(), v.size());
    }
    context->AddTrailingMetadata("client-cn", cn);
    response->set_status(HealthCheckResponse::SERVING);
    return grpc::Status::OK;
  }
};

class TlsReloadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "tls_reload_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    for (const char* sub : {"/certs", "/server/a", "/server/b", "/client/a", "/client/b"}) {
      std::filesystem::create_directories(dir_ + sub);
    }
    const std::string ec = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes ";
    std::string cmd = "cd " + dir_ + "/certs && openssl req -x509" + ec +
                      "-keyout ca.key -out ca.pem -days 1 -subj /CN=test-ca && "
                      "openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:prime256v1 "
                      "-out other.key && printf 'subjectAltName=IP:127.0.0.1,"
                      "URI:spiffe://test/tandem/worker\\n' > leaf.ext";
    for (const char* name : {"server-a", "server-b", "client-a", "client-b"}) {
      cmd += std::string(" && openssl req") + ec + "-keyout " + name + ".key -out " + name +
             ".csr -subj /CN=" + name + " && openssl x509 -req -in " + name +
             ".csr -CA ca.pem -CAkey ca.key -CAcreateserial -out " + name +
             ".pem -days 1 -extfile leaf.ext";
    }
    ASSERT_EQ(std::system(("(" + cmd + ") > /dev/null 2>&1").c_str()), 0) << cmd;
    // Each side reads <side>/current/{cert,key,ca}.pem, `current` a symlink
    // onto a/ or b/ (as Kubernetes swaps a mounted Secret).
    for (const char* side : {"server", "client"}) {
      for (const char* gen : {"a", "b"}) {
        const std::string to = dir_ + "/" + side + "/" + gen + "/";
        const std::string from = dir_ + "/certs/" + side + "-" + gen;
        std::filesystem::copy_file(from + ".pem", to + "cert.pem");
        std::filesystem::copy_file(from + ".key", to + "key.pem");
        std::filesystem::copy_file(dir_ + "/certs/ca.pem", to + "ca.pem");
      }
      std::filesystem::create_directory_symlink("a", dir_ + "/" + side + "/current");
    }
    server_tls_ = Options("server");
    client_tls_ = Options("client");

    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", ServerCredentialsFor(server_tls_), &port_);
    builder.RegisterService(&health_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
  }

  TlsOptions Options(const std::string& side) const {
    const std::string d = dir_ + "/" + side + "/current/";
    return TlsOptions{.cert_file = d + "cert.pem", .key_file = d + "key.pem",
                      .ca_file = d + "ca.pem", .reload_interval_s = 1};
  }
  std::string Pem(const std::string& name) const { return Read(dir_ + "/certs/" + name); }
  void Swap(const std::string& side, const std::string& gen) {
    const std::string link = dir_ + "/" + side + "/current";
    std::filesystem::create_directory_symlink(gen, link + ".new");
    std::filesystem::rename(link + ".new", link);
  }

  struct Answer {
    grpc::Status status;
    std::string server_cn;  // the server's certificate, as the client saw it
    std::string client_cn;  // the client's certificate, as the server saw it
  };
  // One call on a new connection (a channel of its own subchannel pool).
  Answer Call() {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto channel = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port_),
                                             ChannelCredentialsFor(client_tls_), args);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    HealthCheckResponse response;
    Answer answer;
    answer.status = Health::NewStub(channel)->Check(&context, HealthCheckRequest(), &response);
    if (!answer.status.ok()) return answer;
    for (const grpc::string_ref& v :
         context.auth_context()->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME)) {
      answer.server_cn.assign(v.data(), v.size());
    }
    auto cn = context.GetServerTrailingMetadata().find("client-cn");
    if (cn != context.GetServerTrailingMetadata().end()) {
      answer.client_cn.assign(cn->second.data(), cn->second.size());
    }
    return answer;
  }
  // A call succeeds with these two identities.
  void ExpectServes(const std::string& server_cn, const std::string& client_cn) {
    Answer a = Call();
    ASSERT_TRUE(a.status.ok()) << a.status.error_message();
    EXPECT_EQ(a.server_cn, server_cn);
    EXPECT_EQ(a.client_cn, client_cn);
  }

  // Writes each bad content into `side`'s files in turn; each is refused
  // once, the published set stays, and new connections keep both old
  // identities. The good file goes back after each.
  void ExpectBadFilesRefused(const std::string& side, const std::string& name) {
    const TlsOptions tls = Options(side);
    std::shared_ptr<TlsReloader> reloader = TlsReloader::For(tls);
    const TlsFiles good = reloader->published();
    ASSERT_EQ(good.key_pem, Pem(name + ".key"));
    const std::string key = Pem(name + ".key"), cert = Pem(name + ".pem");
    const std::string other = side == "server" ? "client-a" : "server-a";
    const struct {
      const char* what;
      std::string path, text;
      bool in_place;  // truncated where it is, as an in-place writer does first
    } cases[] = {
        {"empty key", tls.key_file, "", true},
        {"empty certificate", tls.cert_file, "", true},
        {"empty CA", tls.ca_file, "", true},
        {"truncated key", tls.key_file, key.substr(0, key.size() / 2), false},
        {"truncated certificate", tls.cert_file, cert.substr(0, cert.size() / 2), false},
        {"garbage key", tls.key_file, "\x01\x02 not a key\n", false},
        {"garbage certificate", tls.cert_file, "-----BEGIN CERTIFICATE-----\nAAAA\n", false},
        {"a key of another pair", tls.key_file, Pem("other.key"), false},
        {"a certificate of another pair", tls.cert_file, Pem(other + ".pem"), false},
    };
    for (const auto& c : cases) {
      SCOPED_TRACE(c.what);
      const uint64_t failures = reloader->failures();
      const std::string before = Read(c.path);
      if (c.in_place) {
        std::ofstream(c.path, std::ios::trunc).close();
      } else {
        Replace(c.path, c.text);
      }
      ASSERT_TRUE(WaitFor([&] { return reloader->failures() > failures; }));
      EXPECT_EQ(reloader->failures(), failures + 1);
      EXPECT_TRUE(reloader->published() == good);
      ExpectServes("server-a", "client-a");
      // The same bad content again: no new warning, no new count.
      EXPECT_FALSE(reloader->Reload().ok());
      EXPECT_EQ(reloader->failures(), failures + 1);
      Replace(c.path, before);
      ASSERT_TRUE(reloader->Reload().ok());
    }
    EXPECT_EQ(reloader->reloads(), 0u);
  }

  std::string dir_;
  TlsOptions server_tls_, client_tls_;
  PeerNamingHealth health_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(TlsReloadTest, ServerKeepsItsLastGoodPairThroughBadFiles) {
  ExpectServes("server-a", "client-a");
  ExpectBadFilesRefused("server", "server-a");
}

TEST_F(TlsReloadTest, ClientKeepsPresentingItsLastGoodPairThroughBadFiles) {
  ExpectServes("server-a", "client-a");
  ExpectBadFilesRefused("client", "client-a");
}

TEST_F(TlsReloadTest, ANewPairFromTheSameCaTakesEffectOnBothSides) {
  ExpectServes("server-a", "client-a");
  Swap("server", "b");
  ASSERT_TRUE(WaitFor([&] { return Call().server_cn == "server-b"; }));
  Swap("client", "b");
  ASSERT_TRUE(WaitFor([&] { return Call().client_cn == "client-b"; }));
  ExpectServes("server-b", "client-b");
  EXPECT_EQ(TlsReloader::For(server_tls_)->reloads(), 1u);
  EXPECT_EQ(TlsReloader::For(client_tls_)->reloads(), 1u);
  EXPECT_EQ(TlsReloader::For(server_tls_)->failures(), 0u);
}

TEST_F(TlsReloadTest, ARotationWrittenAsTwoFilesEndsOnTheNewPair) {
  ExpectServes("server-a", "client-a");
  std::shared_ptr<TlsReloader> reloader = TlsReloader::For(server_tls_);
  // The certificate first: it and the old key disagree, so nothing changes.
  Replace(server_tls_.cert_file, Pem("server-b.pem"));
  ASSERT_TRUE(WaitFor([&] { return reloader->failures() == 1; }));
  EXPECT_EQ(reloader->published().cert_pem, Pem("server-a.pem"));
  ExpectServes("server-a", "client-a");
  // Then the key: the new pair.
  Replace(server_tls_.key_file, Pem("server-b.key"));
  ASSERT_TRUE(WaitFor([&] { return Call().server_cn == "server-b"; }));
  EXPECT_EQ(reloader->published().cert_pem, Pem("server-b.pem"));
  EXPECT_EQ(reloader->published().key_pem, Pem("server-b.key"));
  EXPECT_EQ(reloader->failures(), 1u);
  EXPECT_EQ(reloader->reloads(), 1u);
}

double CounterValue(prometheus::Registry& registry, const std::string& name) {
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name == name && !family.metric.empty()) return family.metric[0].counter.value;
  }
  return -1;
}

TEST_F(TlsReloadTest, TheMetricsCountRefusedAndTakenReloads) {
  auto registry = std::make_shared<prometheus::Registry>();
  RegisterTlsMetrics(registry);
  const double failures = CounterValue(*registry, "tandem_tls_reload_failures_total");
  const double reloads = CounterValue(*registry, "tandem_tls_reloads_total");
  EXPECT_EQ(failures, static_cast<double>(TlsReloadFailures()));
  std::shared_ptr<TlsReloader> reloader = TlsReloader::For(server_tls_);
  std::ofstream(server_tls_.key_file, std::ios::trunc).close();
  ASSERT_TRUE(WaitFor([&] { return reloader->failures() == 1; }));
  EXPECT_FALSE(reloader->Reload().ok());  // the same content: counted once
  Replace(server_tls_.key_file, "garbage\n");
  ASSERT_TRUE(WaitFor([&] { return reloader->failures() == 2; }));
  // The series count every reloader of the process, and the earlier tests'
  // reloaders still run: the figure lies between the process's counts read
  // before and after it, and holds this reloader's two failures.
  uint64_t before = TlsReloadFailures();
  double now = CounterValue(*registry, "tandem_tls_reload_failures_total");
  EXPECT_GE(now, static_cast<double>(before));
  EXPECT_LE(now, static_cast<double>(TlsReloadFailures()));
  EXPECT_GE(now, failures + 2);
  Swap("server", "b");
  ASSERT_TRUE(WaitFor([&] { return reloader->reloads() == 1; }));
  before = TlsReloads();
  now = CounterValue(*registry, "tandem_tls_reloads_total");
  EXPECT_GE(now, static_cast<double>(before));
  EXPECT_LE(now, static_cast<double>(TlsReloads()));
  EXPECT_GE(now, reloads + 1);
}

TEST_F(TlsReloadTest, AStartWithBadFilesFailsNamingTheFile) {
  TlsOptions tls = server_tls_;
  EXPECT_TRUE(tls.Validate(/*server=*/true).ok());
  std::ofstream(tls.key_file, std::ios::trunc).close();
  absl::Status s = tls.Validate(/*server=*/true);
  EXPECT_NE(s.message().find("--tls-key " + tls.key_file + ": is empty"), std::string::npos) << s;
  Replace(tls.key_file, Pem("other.key"));
  s = tls.Validate(/*server=*/true);
  EXPECT_NE(s.message().find("--tls-key " + tls.key_file +
                             " does not match the certificate in --tls-cert " + tls.cert_file),
            std::string::npos)
      << s;
  Replace(tls.key_file, Pem("server-a.key"));
  const std::string cert = Pem("server-a.pem");
  Replace(tls.cert_file, cert.substr(0, cert.size() / 2));
  s = tls.Validate(/*server=*/true);
  EXPECT_NE(s.message().find("--tls-cert " + tls.cert_file + ": holds no PEM certificate"),
            std::string::npos)
      << s;
  Replace(tls.cert_file, cert + cert.substr(0, cert.size() / 2));  // a chain cut off
  s = tls.Validate(/*server=*/true);
  EXPECT_NE(s.message().find("--tls-cert " + tls.cert_file + ": certificate 2 is cut off"),
            std::string::npos)
      << s;
  Replace(tls.cert_file, cert);
  Replace(tls.ca_file, "junk\n");
  s = tls.Validate(/*server=*/true);
  EXPECT_NE(s.message().find("--tls-ca " + tls.ca_file + ": holds no PEM certificate"),
            std::string::npos)
      << s;
}

TEST_F(TlsReloadTest, NoReloadOrWatcherThreadOutlivesTheExitHandlers) {
  ASSERT_TRUE(kExitProbeRegistered);
  ExpectServes("server-a", "client-a");
  // A child that runs this test again (threadsafe: re-executed, so its
  // threads are real), closes the server and exits.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        server_->Shutdown(std::chrono::system_clock::now());
        server_.reset();
        exit_probe = true;
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "left at exit: \\[ \\]");
}

TEST_F(TlsReloadTest, PrivateCopiesOfDeadProcessesAreRemoved) {
  // A process of this pid namespace that has exited, killed before its exit
  // handler removed its private copy.
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);
  struct stat ns {};
  ASSERT_EQ(::stat("/proc/self/ns/pid", &ns), 0);
  const char* tmp = std::getenv("TMPDIR");
  const std::string tmp_dir = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
  const std::string prefix = tmp_dir + "/tandem-tls-" + std::to_string(ns.st_ino) + "-";
  const std::string dead = prefix + std::to_string(child) + "-test01";
  const std::string alive = prefix + std::to_string(::getpid()) + "-test02";
  std::filesystem::create_directories(dead + "/g1");
  std::filesystem::create_directories(alive);
  TlsOptions other = server_tls_;
  other.reload_interval_s = 2;  // another file set: a new TlsReloader
  EXPECT_NE(TlsReloader::For(other)->published_dir().find(prefix), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dead));
  EXPECT_TRUE(std::filesystem::exists(alive));
  std::filesystem::remove_all(alive);
}

}  // namespace
}  // namespace tandem::rpc
