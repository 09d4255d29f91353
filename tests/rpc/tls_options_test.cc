// TlsOptions: which flag combinations a server and a client accept, and the
// errors that name the flag. (What the files must hold, and reloads:
// tls_reload_test.cc; handshakes and roles: tests/integration/tls_test.py.)
#include <cstdio>
#include <cstdlib>
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
    // A self-signed pair: its certificate is also a CA bundle.
    pem_ = dir_ + "/a.pem";
    key_ = dir_ + "/a.key";
    const std::string cmd = "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
                            "-nodes -keyout " + key_ + " -out " + pem_ +
                            " -days 1 -subj /CN=a > /dev/null 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
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
  EXPECT_NE(s.message().find("--tls-ca " + junk_ + ": holds no PEM certificate"), std::string::npos)
      << s;
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
