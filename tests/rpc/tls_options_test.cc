// TlsOptions: which flag combinations a server and a client accept, and the
// errors that name the flag. (The handshakes, roles and rotation are
// tests/integration/tls_test.py, against real certificates.)
#include <cstdio>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "tandem/rpc/tls.h"

namespace tandem::rpc {
namespace {

class TlsOptionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir();
    pem_ = Write("a.pem", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n");
    key_ = Write("a.key", "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n");
    junk_ = Write("junk.pem", "not a certificate\n");
  }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  std::string dir_, pem_, key_, junk_;
};

TEST_F(TlsOptionsTest, OffByDefaultAndAlwaysValid) {
  TlsOptions o;
  EXPECT_FALSE(o.enabled());
  EXPECT_FALSE(o.mutual());
  EXPECT_TRUE(o.Validate(/*server=*/true).ok());
}

TEST_F(TlsOptionsTest, CertAndKeyGoTogether) {
  TlsOptions o{.cert_file = pem_};
  absl::Status s = o.Validate(/*server=*/true);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--tls-cert and --tls-key"), std::string::npos) << s;
  o.key_file = key_;
  EXPECT_TRUE(o.Validate(/*server=*/true).ok());
  EXPECT_TRUE(o.enabled());
  EXPECT_FALSE(o.mutual());
  o.ca_file = pem_;
  EXPECT_TRUE(o.mutual());
}

TEST_F(TlsOptionsTest, ACaAloneIsAClientsSettingOnly) {
  TlsOptions o{.ca_file = pem_};
  EXPECT_TRUE(o.enabled());
  EXPECT_TRUE(o.Validate(/*server=*/false).ok());
  absl::Status s = o.Validate(/*server=*/true);
  EXPECT_NE(s.message().find("--tls-ca needs --tls-cert"), std::string::npos) << s;
}

TEST_F(TlsOptionsTest, UnreadableAndNonPemFilesNameTheFlag) {
  TlsOptions o{.cert_file = pem_, .key_file = dir_ + "/missing.key"};
  absl::Status s = o.Validate(/*server=*/true);
  EXPECT_NE(s.message().find("--tls-key: cannot read"), std::string::npos) << s;
  o = TlsOptions{.cert_file = pem_, .key_file = key_, .ca_file = junk_};
  s = o.Validate(/*server=*/true);
  EXPECT_NE(s.message().find("--tls-ca: " + junk_ + " is not PEM"), std::string::npos) << s;
  o = TlsOptions{.cert_file = pem_, .key_file = key_, .reload_interval_s = 0};
  s = o.Validate(/*server=*/true);
  EXPECT_NE(s.message().find("--tls-reload-interval-s"), std::string::npos) << s;
}

TEST_F(TlsOptionsTest, FlagsFillTheOptions) {
  TlsOptions o;
  FlagSet flags("t", "test");
  AddTlsFlags(&flags, &o);
  std::string a0 = "t", a1 = "--tls-cert=" + pem_, a2 = "--tls-key", a3 = key_,
              a4 = "--tls-reload-interval-s=3";
  char* argv[] = {a0.data(), a1.data(), a2.data(), a3.data(), a4.data()};
  flags.ParseOrExit(5, argv);
  EXPECT_EQ(o.cert_file, pem_);
  EXPECT_EQ(o.key_file, key_);
  EXPECT_EQ(o.reload_interval_s, 3);
  EXPECT_TRUE(o.Validate(/*server=*/true).ok());
}

TEST_F(TlsOptionsTest, ClientTlsIsWhatWasSet) {
  EXPECT_FALSE(ClientTls().enabled());
  SetClientTls(TlsOptions{.ca_file = pem_});
  EXPECT_EQ(ClientTls().ca_file, pem_);
  SetClientTls(TlsOptions{});
  EXPECT_FALSE(ClientTls().enabled());
}

}  // namespace
}  // namespace tandem::rpc
