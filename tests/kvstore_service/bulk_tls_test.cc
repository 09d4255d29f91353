// The bulk port under TLS (bulk_load_server.h, rpc/socket_tls.h): the KV
// client's loads and lookups over it with the gRPC port's certificates, the
// role check of mutual TLS, handshakes that must fail, the server's name,
// and a rotation taking effect for new connections. Certificates come from
// the openssl CLI.
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "../kvstore/test_util.h"
#include "bulk_load_server.h"
#include "bulk_test_store.h"
#include "gmock/gmock.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "kvstore_service.h"
#include "tandem/kvconnector/kvstore_client.h"
#include "tandem/kvstore/kv_store.h"
#include "tandem/rpc/framed_socket.h"
#include "tandem/rpc/kvstore_convert.h"
#include "tandem/rpc/socket_tls.h"
#include "tandem/rpc/tls.h"
#include "tandem/rpc/tls_reload.h"
#include "tandem/v1/kvstore.pb.h"

namespace tandem {
namespace {

using kvconnector::KvStoreClient;
using kvconnector::LoadMiss;
using kvstore::testing::TempDir;
using kvstore::testing::TestHash;
using kvstore::testing::TestPayload;
using kvstore::testing::WaitFor;
using rpc::SocketTlsContext;
using rpc::TlsOptions;
using ::testing::HasSubstr;

constexpr uint64_t kBlock = testutil::kBulkBlock;
constexpr uint64_t kBigBlock = testutil::kBulkBigBlock;  // many TLS records per block

// A CA and leaves signed by it, each for 127.0.0.1 with a role URI SAN
// (none for "visitor"); "misnamed" names only another host; "rogue" is
// signed by a second CA.
class Pki {
 public:
  Pki() {
    dir_ = ::testing::TempDir() + "bulk_tls_certs";
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    const std::string ec = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes ";
    std::string cmd = "cd " + dir_ + " && openssl req -x509" + ec +
                      "-keyout ca.key -out ca.pem -days 1 -subj /CN=test-ca && openssl req -x509" +
                      ec + "-keyout ca2.key -out ca2.pem -days 1 -subj /CN=other-ca";
    struct Leaf {
      std::string name, ca, san;
    };
    const std::vector<Leaf> leaves = {
        {"server", "ca", "IP:127.0.0.1,URI:spiffe://cluster.local/tandem/kvstore"},
        {"server2", "ca2", "IP:127.0.0.1,URI:spiffe://cluster.local/tandem/kvstore"},
        {"misnamed", "ca", "DNS:elsewhere.example"},
        {"worker", "ca", "IP:127.0.0.1,URI:spiffe://cluster.local/tandem/worker"},
        {"scheduler", "ca", "IP:127.0.0.1,URI:spiffe://cluster.local/tandem/scheduler"},
        {"visitor", "ca", "IP:127.0.0.1"},
        {"rogue", "ca2", "IP:127.0.0.1,URI:spiffe://cluster.local/tandem/worker"},
        {"worker2", "ca2", "IP:127.0.0.1,URI:spiffe://cluster.local/tandem/worker"},
    };
    for (const Leaf& l : leaves) {
      cmd += " && printf 'subjectAltName=" + l.san + "\\n' > " + l.name + ".ext && openssl req" +
             ec + "-keyout " + l.name + ".key -out " + l.name + ".csr -subj /CN=" + l.name +
             " && openssl x509 -req -in " + l.name + ".csr -CA " + l.ca + ".pem -CAkey " + l.ca +
             ".key -CAcreateserial -out " + l.name + ".pem -days 1 -extfile " + l.name + ".ext";
    }
    ok_ = std::system(("(" + cmd + ") > /dev/null 2>&1").c_str()) == 0;
  }
  [[nodiscard]] bool ok() const { return ok_; }
  [[nodiscard]] std::string Path(const std::string& file) const { return dir_ + "/" + file; }
  // `name`'s certificate and key, verifying peers with `ca`.
  [[nodiscard]] TlsOptions Tls(const std::string& name, const std::string& ca = "ca") const {
    return TlsOptions{.cert_file = Path(name + ".pem"),
                      .key_file = Path(name + ".key"),
                      .ca_file = Path(ca + ".pem"),
                      .reload_interval_s = 3600};
  }

 private:
  std::string dir_;
  bool ok_ = false;
};

// Each test runs with both ways of writing TLS records (FramedSocket::TlsWrites).
class BulkTlsTest : public ::testing::TestWithParam<rpc::FramedSocket::TlsWrites> {
 protected:
  static void SetUpTestSuite() { pki_ = new Pki(); }
  static void TearDownTestSuite() {
    delete pki_;
    pki_ = nullptr;
  }

  void SetUp() override {
    rpc::FramedSocket::TEST_SetTlsWrites(GetParam());
    ASSERT_TRUE(pki_->ok()) << "openssl could not make the test certificates";
    auto store = testutil::OpenBulkTestStore(dir_.path(), {{"ns", kBlock}, {"big", kBigBlock}});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }
  void TearDown() override {
    clients_.clear();
    if (server_) server_->Shutdown();
    if (bulk_) bulk_->Shutdown();
    rpc::SetClientTls({});
    rpc::FramedSocket::TEST_SetTlsWrites(rpc::FramedSocket::TlsWrites::kAuto);
  }

  // The bulk port and the gRPC service, both with `server_tls`.
  void Start(const TlsOptions& server_tls) {
    auto bulk = kvstore_service::BulkLoadServer::Start(store_.get(), {.tls = server_tls});
    ASSERT_TRUE(bulk.ok()) << bulk.status();
    bulk_ = std::move(*bulk);
    service_ = std::make_unique<kvstore_service::KvStoreServiceImpl>(
        store_.get(), kvstore_service::KvStoreServiceOptions{.bulk_load = bulk_.get()});
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", rpc::ServerCredentialsFor(server_tls), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    target_ = "127.0.0.1:" + std::to_string(port);
  }

  // A KV client of this process dialling with `tls` (gRPC and the bulk port).
  KvStoreClient* Client(const TlsOptions& tls, bool lookups = false) {
    rpc::SetClientTls(tls);
    auto client = KvStoreClient::Create(
        {.target = target_, .lookup_deadline_ms = 10'000, .bulk_lookup = lookups});
    EXPECT_TRUE(client.ok()) << client.status();
    clients_.push_back(std::move(*client));
    return clients_.back().get();
  }

  void Put(const std::string& ns, uint64_t id, uint64_t size) {
    ASSERT_TRUE(testutil::PutTestBlock(store_.get(), ns, id, size).ok());
  }

  // A raw connection to the bulk port after a client handshake with `tls`
  // (or the handshake's error).
  absl::StatusOr<std::unique_ptr<rpc::FramedSocket>> Dial(const TlsOptions& tls,
                                                          const std::string& host = "127.0.0.1") {
    auto sock = rpc::FramedSocket::Connect("127.0.0.1", std::to_string(bulk_->port()), 5'000);
    if (!sock.ok()) return sock.status();
    auto context = SocketTlsContext::Create(tls, SocketTlsContext::Side::kClient);
    if (!context.ok()) return context.status();
    auto ssl = (*context)->Current();
    if (!ssl.ok()) return ssl.status();
    if (absl::Status s = (*sock)->StartTls(ssl->get(), /*server=*/false, host); !s.ok()) return s;
    return std::move(*sock);
  }

  // Sends the preface and one load of block `id`; the frames that answer it
  // up to the done frame, or the first error.
  static absl::StatusOr<v1::BulkLoadFrame> LoadOne(rpc::FramedSocket* sock, uint64_t id,
                                                   std::vector<uint8_t>* payload) {
    const auto* p = reinterpret_cast<const uint8_t*>(rpc::kKvBulkLoadPreface.data());
    if (absl::Status s = sock->WriteRaw({p, rpc::kKvBulkLoadPreface.size()}); !s.ok()) return s;
    v1::LoadRequest req;
    req.set_namespace_("ns");
    const BlockHash h = TestHash(id);
    rpc::AppendBlockHashes(std::span(&h, 1), req.mutable_block_hashes());
    if (absl::Status s = sock->Write(req); !s.ok()) return s;
    for (;;) {
      v1::BulkLoadFrame frame;
      if (absl::Status s = sock->Read(&frame, 1 << 20); !s.ok()) return s;
      if (frame.done()) return frame;
      if (frame.chunk().ok()) {
        payload->resize(frame.chunk().total_size());
        if (absl::Status s = sock->ReadRaw(*payload); !s.ok()) return s;
      }
    }
  }

  static Pki* pki_;
  TempDir dir_;
  std::unique_ptr<kvstore::KvStoreEngine> store_;
  std::unique_ptr<kvstore_service::BulkLoadServer> bulk_;
  std::unique_ptr<kvstore_service::KvStoreServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string target_;
  std::vector<std::unique_ptr<KvStoreClient>> clients_;
};

Pki* BulkTlsTest::pki_ = nullptr;

TEST_P(BulkTlsTest, LoadsAndLookupsGoOverTheTlsBulkPortAndAnswerAsGrpc) {
  Start(pki_->Tls("server"));
  for (uint64_t id : {1, 2}) Put("ns", id, kBlock);
  Put("big", 3, kBigBlock);
  KvStoreClient* worker = Client(pki_->Tls("worker"));
  std::vector<std::vector<uint8_t>> bufs(3, std::vector<uint8_t>(kBlock, 0xEE));
  std::vector<std::span<uint8_t>> dst(bufs.begin(), bufs.end());
  const std::vector<BlockHash> hashes = {TestHash(1), TestHash(9), TestHash(2)};
  auto loaded = worker->Load("ns", hashes, dst, LeaseId(0));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)[0].miss, LoadMiss::kNone);
  EXPECT_EQ((*loaded)[1].miss, LoadMiss::kNotFound);
  EXPECT_EQ((*loaded)[2].miss, LoadMiss::kNone);
  EXPECT_EQ(bufs[0], TestPayload(1, kBlock));
  EXPECT_EQ(bufs[2], TestPayload(2, kBlock));
  // A block of many TLS records arrives whole.
  std::vector<uint8_t> big(kBigBlock, 0xEE);
  std::vector<std::span<uint8_t>> big_dst = {big};
  const BlockHash big_hash = TestHash(3);
  auto big_loaded = worker->Load("big", std::span(&big_hash, 1), big_dst, LeaseId(0));
  ASSERT_TRUE(big_loaded.ok()) << big_loaded.status();
  EXPECT_EQ(big, TestPayload(3, kBigBlock));
  EXPECT_EQ(worker->bulk_loads(), 2u) << "the loads went over gRPC, not the TLS bulk port";
  EXPECT_EQ(bulk_->GetStats().blocks_sent, 3u);

  KvStoreClient* scheduler = Client(pki_->Tls("scheduler"), /*lookups=*/true);
  ASSERT_TRUE(WaitFor([&] { return scheduler->bulk_lookup_connected(); }));
  kvconnector::RemoteLookupResult hit =
      scheduler->Lookup("ns", hashes, {.take_lease = false})->Wait();
  ASSERT_TRUE(hit.status.ok()) << hit.status;
  EXPECT_EQ(hit.num_hits, 1);
  EXPECT_EQ(scheduler->bulk_lookups(), 1u);
  EXPECT_EQ(bulk_->GetStats().tls_handshake_failures, 0u);
  EXPECT_EQ(bulk_->GetStats().permission_denied, 0u);
}

TEST_P(BulkTlsTest, ARoleThatMayNotCallTheMethodIsDeniedByName) {
  Start(pki_->Tls("server"));
  Put("ns", 1, kBlock);
  // The scheduler may look up but not load.
  auto sock = Dial(pki_->Tls("scheduler"));
  ASSERT_TRUE(sock.ok()) << sock.status();
  std::vector<uint8_t> payload;
  absl::StatusOr<v1::BulkLoadFrame> done = LoadOne(sock->get(), 1, &payload);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->status_code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(done->status_message(), HasSubstr("/tandem.v1.KvStore/Load"));
  EXPECT_THAT(done->status_message(), HasSubstr("scheduler"));
  EXPECT_TRUE(payload.empty()) << "a denied load sent the block";
  // A certificate without a role may do neither.
  auto visitor = Dial(pki_->Tls("visitor"));
  ASSERT_TRUE(visitor.ok()) << visitor.status();
  done = LoadOne(visitor->get(), 1, &payload);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->status_code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_TRUE(payload.empty());

  // The worker may load but not look up: its lookup is answered with the
  // denial, and nothing is pinned.
  auto worker = Dial(pki_->Tls("worker"));
  ASSERT_TRUE(worker.ok()) << worker.status();
  const auto* p = reinterpret_cast<const uint8_t*>(rpc::kKvBulkLookupPreface.data());
  ASSERT_TRUE((*worker)->WriteRaw({p, rpc::kKvBulkLookupPreface.size()}).ok());
  v1::LookupRequest lookup;
  lookup.set_namespace_("ns");
  const BlockHash h = TestHash(1);
  rpc::AppendBlockHashes(std::span(&h, 1), lookup.mutable_block_hashes());
  ASSERT_TRUE((*worker)->Write(lookup).ok());
  v1::BulkLookupAnswer answer;
  ASSERT_TRUE((*worker)->Read(&answer, 1 << 20).ok());
  EXPECT_EQ(answer.status_code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(answer.status_message(), HasSubstr("/tandem.v1.KvStore/Lookup"));
  EXPECT_EQ(answer.response().num_hits(), 0);
  EXPECT_EQ(store_->GetStats().active_leases, 0u);
  EXPECT_EQ(bulk_->GetStats().permission_denied, 3u);
  EXPECT_EQ(bulk_->GetStats().lookups, 0u);

  // The role that may load gets the block on the same port.
  done = LoadOne(Dial(pki_->Tls("worker"))->get(), 1, &payload);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->status_code(), 0) << done->status_message();
  EXPECT_EQ(payload, TestPayload(1, kBlock));
}

TEST_P(BulkTlsTest, StoresGoOverTheTlsBulkPortForTheWorkerRoleOnly) {
  Start(pki_->Tls("server"));
  const std::vector<uint8_t> payload = TestPayload(5, kBlock);
  const std::vector<std::span<const uint8_t>> src = {payload};
  const BlockHash stored_hash = TestHash(5);
  KvStoreClient* worker = Client(pki_->Tls("worker"));
  auto stored = worker->Store("ns", std::span(&stored_hash, 1), src);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_TRUE((*stored)[0].status.ok()) << (*stored)[0].status;
  EXPECT_EQ(worker->bulk_stores(), 1u) << "the store went over gRPC, not the TLS bulk port";
  EXPECT_TRUE(store_->TEST_InCold("ns", stored_hash));
  // The scheduler may not store: refused by name, nothing written.
  const BlockHash denied_hash = TestHash(6);
  KvStoreClient* scheduler = Client(pki_->Tls("scheduler"));
  auto denied = scheduler->Store("ns", std::span(&denied_hash, 1), src);
  ASSERT_FALSE(denied.ok());
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied) << denied.status();
  EXPECT_THAT(denied.status().message(), HasSubstr("/tandem.v1.KvStore/Store"));
  EXPECT_FALSE(store_->TEST_InCold("ns", denied_hash));
  EXPECT_EQ(bulk_->GetStats().permission_denied, 1u);
}

TEST_P(BulkTlsTest, ClientsTheCaDidNotSignOrThatSpeakPlainTcpGetNothing) {
  Start(pki_->Tls("server"));
  Put("ns", 1, kBlock);
  std::vector<uint8_t> payload;
  // Plain TCP on the TLS port: the preface is not a ClientHello.
  auto plain = rpc::FramedSocket::Connect("127.0.0.1", std::to_string(bulk_->port()), 5'000);
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(LoadOne(plain->get(), 1, &payload).ok());
  // No client certificate (TLS 1.3 refuses it after the client's side of
  // the handshake: the first read fails), and another CA's certificate.
  TlsOptions anonymous = pki_->Tls("worker");
  anonymous.cert_file.clear();
  anonymous.key_file.clear();
  for (const TlsOptions& tls : {anonymous, pki_->Tls("rogue")}) {
    auto sock = Dial(tls);
    if (sock.ok()) {
      EXPECT_FALSE(LoadOne(sock->get(), 1, &payload).ok()) << tls.cert_file;
    }
  }
  EXPECT_TRUE(payload.empty());
  EXPECT_TRUE(WaitFor([&] { return bulk_->GetStats().tls_handshake_failures == 3; }))
      << bulk_->GetStats().tls_handshake_failures;
  EXPECT_EQ(bulk_->GetStats().loads, 0u);
  // A server the client's CA did not sign is refused by the client.
  auto foreign = Dial(pki_->Tls("worker", "ca2"));
  ASSERT_FALSE(foreign.ok());
  EXPECT_THAT(foreign.status().message(), HasSubstr("certificate verify failed"));
}

TEST_P(BulkTlsTest, TheClientChecksTheServersName) {
  Start(pki_->Tls("misnamed"));
  auto sock = Dial(pki_->Tls("worker"));
  ASSERT_FALSE(sock.ok()) << "a certificate for elsewhere.example was taken for 127.0.0.1";
  EXPECT_THAT(sock.status().message(), HasSubstr("mismatch"));
  EXPECT_EQ(bulk_->GetStats().loads, 0u);
}

TEST_P(BulkTlsTest, ARotatedCertificateTakesEffectForNewConnections) {
  // The server reads its files from copies that the test rewrites.
  const std::string live = ::testing::TempDir() + "bulk_tls_live";
  std::filesystem::remove_all(live);
  std::filesystem::create_directories(live);
  auto install = [&](const std::string& name, const std::string& ca) {
    for (auto [from, to] : {std::pair{name + ".pem", "cert.pem"},
                            {name + ".key", "key.pem"},
                            {ca + ".pem", "ca.pem"}}) {
      std::filesystem::copy_file(pki_->Path(from), live + "/" + to,
                                 std::filesystem::copy_options::overwrite_existing);
    }
  };
  install("server", "ca");
  const TlsOptions server_tls{.cert_file = live + "/cert.pem",
                              .key_file = live + "/key.pem",
                              .ca_file = live + "/ca.pem",
                              .reload_interval_s = 3600};
  // The process keeps one reloader per file set: an earlier run of this
  // test left it on the rotated files.
  ASSERT_TRUE(rpc::TlsReloader::For(server_tls)->Reload().ok());
  Start(server_tls);
  Put("ns", 1, kBlock);
  std::vector<uint8_t> payload;
  auto before = Dial(pki_->Tls("worker"));
  ASSERT_TRUE(before.ok()) << before.status();
  // A new CA and identity; the reload thread would read them within its
  // interval, the test reads them now.
  install("server2", "ca2");
  ASSERT_TRUE(rpc::TlsReloader::For(server_tls)->Reload().ok());
  EXPECT_FALSE(Dial(pki_->Tls("worker")).ok()) << "a new connection still got the old server";
  auto after = Dial(pki_->Tls("worker2", "ca2"));
  ASSERT_TRUE(after.ok()) << after.status();
  absl::StatusOr<v1::BulkLoadFrame> done = LoadOne(after->get(), 1, &payload);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->status_code(), 0) << done->status_message();
  EXPECT_EQ(payload, TestPayload(1, kBlock));
  // The connection made before the rotation keeps its session.
  payload.clear();
  done = LoadOne(before->get(), 1, &payload);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(payload, TestPayload(1, kBlock));
}

INSTANTIATE_TEST_SUITE_P(Writes, BulkTlsTest,
                         ::testing::Values(rpc::FramedSocket::TlsWrites::kSocket,
                                           rpc::FramedSocket::TlsWrites::kBuffered),
                         [](const ::testing::TestParamInfo<rpc::FramedSocket::TlsWrites>& info) {
                           return info.param == rpc::FramedSocket::TlsWrites::kSocket
                                      ? "OpenSslWritesTheSocket"
                                      : "BufferedWrites";
                         });

}  // namespace
}  // namespace tandem
