#include "tandem/common/flags.h"

#include <gtest/gtest.h>

namespace tandem::rpc {
namespace {

struct Args {
  explicit Args(std::vector<std::string> a) : strings(std::move(a)) {
    for (std::string& s : strings) ptrs.push_back(s.data());
  }
  int argc() { return static_cast<int>(ptrs.size()); }
  char** argv() { return ptrs.data(); }
  std::vector<std::string> strings;
  std::vector<char*> ptrs;
};

TEST(FlagSetTest, ParsesEveryFormAndKeepsPositionals) {
  std::string name = "x";
  int32_t n = 1;
  int64_t big = 2;
  double d = 0.5;
  bool b = true, c = false;
  FlagSet flags("prog", "does things");
  flags.Add("name", &name, "a name");
  flags.Add("num-seqs", &n, "count");
  flags.Add("big", &big, "big count");
  flags.Add("ratio", &d, "ratio");
  flags.Add("async", &b, "async");
  flags.Add("cache", &c, "cache");
  Args args({"prog", "generate", "--name=abc", "--num_seqs", "7", "--big=-9", "--ratio", "1.5",
             "--noasync", "--cache", "rest"});
  ASSERT_TRUE(flags.Parse(args.argc(), args.argv()).ok());
  EXPECT_EQ(name, "abc");
  EXPECT_EQ(n, 7);
  EXPECT_EQ(big, -9);
  EXPECT_EQ(d, 1.5);
  EXPECT_FALSE(b);
  EXPECT_TRUE(c);
  EXPECT_EQ(flags.positional(), (std::vector<std::string>{"generate", "rest"}));
}

TEST(FlagSetTest, ErrorsNameTheFlag) {
  int32_t n = 1;
  FlagSet flags("prog", "");
  flags.Add("n", &n, "count");
  Args bad({"prog", "--n=abc"});
  absl::Status s = flags.Parse(bad.argc(), bad.argv());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "flag --n: 'abc' is not a 32-bit integer");
  FlagSet flags2("prog", "");
  flags2.Add("n", &n, "count");
  Args unknown({"prog", "--m=1"});
  EXPECT_EQ(flags2.Parse(unknown.argc(), unknown.argv()).message(),
            "unknown flag --m");
}

// No Tandem program takes a positional argument: `tandem-worker model.bin`
// once served the compiled-in default model without a word.
TEST(FlagSetTest, ParseOrExitRefusesPositionalArguments) {
  std::string model = "default.bin";
  FlagSet flags("tandem-worker", "");
  flags.Add("model", &model, "model");
  Args args({"tandem-worker", "--model=a.bin", "/path/model.bin"});
  EXPECT_EXIT(flags.ParseOrExit(args.argc(), args.argv()), ::testing::ExitedWithCode(2),
              "^tandem-worker: unexpected argument '/path/model.bin': every argument is a "
              "--flag \\(see --help\\)\n$");
  // The hint once came twice.
  FlagSet flags2("prog", "");
  Args unknown({"prog", "--m=1"});
  EXPECT_EXIT(flags2.ParseOrExit(unknown.argc(), unknown.argv()), ::testing::ExitedWithCode(2),
              "^prog: unknown flag --m \\(see --help\\)\n$");
}

TEST(FlagSetTest, HelpListsDefaultsAndDocs) {
  int32_t n = 128;
  bool b = true;
  FlagSet flags("prog", "does things");
  flags.Add("max-num-seqs", &n, "most running requests");
  flags.Add("async-scheduling", &b, "one step ahead");
  Args args({"prog", "--help"});
  ASSERT_TRUE(flags.Parse(args.argc(), args.argv()).ok());
  EXPECT_TRUE(flags.help_requested());
  std::string help = flags.Help();
  EXPECT_NE(help.find("--max-num-seqs (default: 128)\n      most running requests"),
            std::string::npos)
      << help;
  EXPECT_NE(help.find("--async-scheduling, --no-async-scheduling (default: true)"),
            std::string::npos)
      << help;
}

// vLLM spells a boolean's negation --no-<name> (argparse's
// BooleanOptionalAction): --no-enable-prefix-caching.
TEST(FlagSetTest, AcceptsVllmStyleNegations) {
  bool prefix = true, chunked = true;
  int32_t no_limit = 3;
  FlagSet flags("prog", "");
  flags.Add("enable-prefix-caching", &prefix, "reuse prefixes");
  flags.Add("enable-chunked-prefill", &chunked, "chunk");
  flags.Add("no-limit", &no_limit, "a flag whose name starts with no");
  Args args({"prog", "--no-enable-prefix-caching", "--noenable-chunked-prefill", "--no-limit=5"});
  ASSERT_TRUE(flags.Parse(args.argc(), args.argv()).ok());
  EXPECT_FALSE(prefix);
  EXPECT_FALSE(chunked);
  EXPECT_EQ(no_limit, 5);
  // A negation takes no value, and only booleans have one.
  FlagSet flags2("prog", "");
  flags2.Add("enable-prefix-caching", &prefix, "reuse prefixes");
  flags2.Add("n", &no_limit, "count");
  Args bad({"prog", "--no-n"});
  EXPECT_EQ(flags2.Parse(bad.argc(), bad.argv()).message(), "unknown flag --no-n");
}

TEST(FlagSetTest, RepeatableFlagsKeepEveryValueInOrder) {
  std::vector<std::string> prompts;
  FlagSet flags("prog", "");
  flags.Add("prompt", &prompts, "token ids (repeatable)");
  Args args({"prog", "--prompt", "1,2", "--prompt=3"});
  ASSERT_TRUE(flags.Parse(args.argc(), args.argv()).ok());
  EXPECT_EQ(prompts, (std::vector<std::string>{"1,2", "3"}));
  EXPECT_NE(flags.Help().find("--prompt (default: none (repeatable))"), std::string::npos)
      << flags.Help();
}

TEST(FlagSetTest, AliasesSetTheSameVariableAndHelpNamesThem) {
  std::string policy = "fcfs";
  int32_t n = 1;
  FlagSet flags("prog", "");
  flags.Add("policy", &policy, "fcfs | priority");
  flags.Add("max-num-seqs", &n, "most running");
  flags.Alias("scheduling-policy", "policy");
  flags.MirrorsVllm({"max-num-seqs", "scheduling-policy"});
  Args args({"prog", "--scheduling-policy", "priority"});
  ASSERT_TRUE(flags.Parse(args.argc(), args.argv()).ok());
  EXPECT_EQ(policy, "priority");
  const std::string help = flags.Help();
  EXPECT_NE(help.find("--policy, --scheduling-policy (default: \"fcfs\") [vLLM]"),
            std::string::npos)
      << help;
  EXPECT_NE(help.find("--max-num-seqs (default: 1) [vLLM]"), std::string::npos) << help;
  EXPECT_NE(help.find("Flags marked [vLLM]"), std::string::npos) << help;
}

}  // namespace
}  // namespace tandem::rpc
