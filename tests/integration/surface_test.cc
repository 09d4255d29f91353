// What an operator or a client sees of the services besides Generate:
// GetModelInfo against the model itself, --help of every binary, and the
// `tandem` command-line client against running services.
#include <algorithm>
#include <filesystem>
#include <map>
#include <regex>
#include <set>

#include "gtest/gtest.h"
#include "harness.h"
#include "tandem/model/model.h"

namespace tandem::testing {
namespace {

TEST(SurfaceTest, GetModelInfoDescribesTheWorkersModel) {
  auto model = model::Model::Load(ModelPath());
  ASSERT_TRUE(model.ok()) << model.status();
  const model::ModelConfig& config = (*model)->config();

  const std::string dir = MakeTempDir("tandem-surface");
  Service worker = StartWorker(dir, "worker", {"--num-blocks", "100", "--block-size", "32"});
  // No worker yet: GetModelInfo says so.
  Service lonely = StartScheduler(dir, "lonely", "127.0.0.1:1", {}, /*wait_for_worker=*/false);
  {
    auto stub = GenerationStub(lonely.address());
    grpc::ClientContext context;
    v1::GetModelInfoResponse info;
    grpc::Status s = stub->GetModelInfo(&context, {}, &info);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  }

  for (int32_t max_model_len : {0, 300}) {
    SCOPED_TRACE("--max-model-len " + std::to_string(max_model_len));
    Service scheduler =
        StartScheduler(dir, "scheduler-" + std::to_string(max_model_len), worker.address(),
                       {"--max-model-len", std::to_string(max_model_len)});
    auto stub = GenerationStub(scheduler.address());
    grpc::ClientContext context;
    v1::GetModelInfoResponse info;
    ASSERT_TRUE(stub->GetModelInfo(&context, {}, &info).ok());
    EXPECT_EQ(info.model_name(), (*model)->name());
    EXPECT_FALSE(info.model_fingerprint().empty());
    EXPECT_EQ(info.model_fingerprint(), (*model)->fingerprint());
    EXPECT_EQ(info.vocab_size(), config.vocab_size);
    EXPECT_EQ(info.max_model_len(), max_model_len > 0 ? max_model_len : config.max_seq_len);
    EXPECT_EQ(info.block_size(), 32);
    EXPECT_EQ(info.num_kv_blocks(), 100);
    EXPECT_EQ(info.eos_token_id(), config.eos_token_id);
    // No --allow-request-cache-salt and no mutual TLS: a salt from this
    // caller would be refused, and GetModelInfo says so.
    EXPECT_FALSE(info.accepts_cache_salt());
    // Validation uses the same numbers.
    GenerateResult too_long = RunGenerate(
        stub.get(), MakeRequest({1, 2}, info.max_model_len() - 1, 0, {}, /*ignore_eos=*/true));
    EXPECT_EQ(too_long.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(too_long.status.error_message().find("exceeds max_model_len " +
                                                   std::to_string(info.max_model_len())),
              std::string::npos)
        << too_long.status.error_message();
  }
  Service salted = StartScheduler(dir, "salted", worker.address(), {"--allow-request-cache-salt"});
  auto stub = GenerationStub(salted.address());
  grpc::ClientContext context;
  v1::GetModelInfoResponse info;
  ASSERT_TRUE(stub->GetModelInfo(&context, {}, &info).ok());
  EXPECT_TRUE(info.accepts_cache_salt());

  // The worker's --max-model-len (vLLM's; tandem serve gives it to both) is
  // the context it describes, and so the scheduler's without a flag of its
  // own; past the model's context the worker does not start.
  Service capped =
      StartWorker(dir, "worker-capped", {"--num-blocks", "100", "--max-model-len", "200"});
  Service follows = StartScheduler(dir, "follows", capped.address(), {});
  auto capped_stub = GenerationStub(follows.address());
  grpc::ClientContext capped_context;
  ASSERT_TRUE(capped_stub->GetModelInfo(&capped_context, {}, &info).ok());
  EXPECT_EQ(info.max_model_len(), 200);
  std::string out;
  EXPECT_NE(
      RunCommand({BinaryPath("services/worker/tandem-worker"), "--model", ModelPath(), "--listen",
                  "127.0.0.1:0", "--max-model-len", std::to_string(config.max_seq_len + 1)},
                 &out),
      0)
      << out;
  EXPECT_NE(out.find("--max-model-len " + std::to_string(config.max_seq_len + 1) +
                     " is outside the model's context"),
            std::string::npos)
      << out;
}

// `--help` exits 0 and documents every flag main.cc registers, each with its
// default and a description.
void CheckHelp(const std::string& binary, const std::string& main_cc,
               const std::map<std::string, std::string>& expected_defaults) {
  SCOPED_TRACE(binary);
  std::string out;
  const std::string program = binary.substr(binary.rfind('/') + 1);
  // A positional argument (a model path without --model) is refused.
  ASSERT_EQ(RunCommand({BinaryPath(binary), "model.bin"}, &out), 2) << out;
  EXPECT_NE(out.find(program + ": unexpected argument 'model.bin'"), std::string::npos) << out;
  ASSERT_EQ(RunCommand({BinaryPath(binary), "--help"}, &out), 0) << out;
  EXPECT_EQ(out.rfind("Usage: " + program, 0), 0u) << out;

  // "  --name[, --no-name][, --alias] (default: value)[ [vLLM]]\n      doc\n"
  std::map<std::string, std::string> documented;
  std::map<std::string, std::string> docs;
  std::regex entry(
      R"(\n  --([a-z0-9-]+)((?:, --[a-z0-9-]+)*) \(default: ([^\n]*)\)( \[vLLM\])?\n      (\S[^\n]*))");
  for (std::sregex_iterator it(out.begin(), out.end(), entry), end; it != end; ++it) {
    documented[(*it)[1]] = (*it)[3];
    docs[(*it)[1]] = (*it)[5];
  }
  // Every flag the source registers.
  const std::string source = ReadFile(std::string(TANDEM_SOURCE_DIR) + "/" + main_cc);
  ASSERT_FALSE(source.empty()) << main_cc;
  std::regex add(R"re(flags\.Add\(\s*"([a-z0-9-]+)")re");
  std::set<std::string> registered;
  for (std::sregex_iterator it(source.begin(), source.end(), add), end; it != end; ++it) {
    registered.insert((*it)[1]);
  }
  EXPECT_GT(registered.size(), 3u);
  for (const std::string& name : registered) {
    EXPECT_TRUE(documented.contains(name)) << "--" << name << " has no default or doc in --help";
  }
  for (const auto& [name, value] : expected_defaults) {
    ASSERT_TRUE(documented.contains(name)) << "--" << name;
    EXPECT_EQ(documented[name], value) << "--" << name;
  }
  // Test-only flags say so.
  for (const auto& [name, doc] : docs) {
    if (name.rfind("debug-", 0) != 0) continue;
    EXPECT_EQ(doc.rfind("TESTS ONLY", 0), 0u) << "--" << name << " must be marked TESTS ONLY";
  }
}

TEST(SurfaceTest, HelpDocumentsEveryFlagWithItsDefault) {
  CheckHelp("services/worker/tandem-worker", "services/worker/main.cc",
            {{"listen", "\"127.0.0.1:50061\""},
             {"backend", "\"cpu\""},
             {"block-size", "16"},
             {"num-blocks", "0"},
             {"kv-cache-bytes", "0"},
             {"debug-load-delay-ms", "0"}});
  CheckHelp("services/scheduler/tandem-scheduler", "services/scheduler/main.cc",
            {{"listen", "\"127.0.0.1:50051\""},
             {"worker", "\"127.0.0.1:50061\""},
             {"max-num-seqs", "128"},
             {"max-num-batched-tokens", "2048"},
             {"async-scheduling", "true"},
             {"policy", "\"fcfs\""},
             {"drain-timeout-s", "30"},
             {"kvstore-bulk-port", "\"auto\""},
             {"limit-async-load-admission", "true"},
             {"max-step-failures", "3"},
             {"debug-submit-delay-ms", "0"}});
  // vLLM's spellings: --no-<flag> negations, --scheduling-policy, and the
  // flags that mirror vLLM's say so.
  std::string out;
  ASSERT_EQ(RunCommand({BinaryPath("services/scheduler/tandem-scheduler"), "--help"}, &out), 0);
  for (const char* line :
       {"--policy, --scheduling-policy (default: \"fcfs\") [vLLM]",
        "--enable-prefix-caching, --no-enable-prefix-caching (default: true) [vLLM]",
        "--max-num-seqs (default: 128) [vLLM]", "--served-model-name (default: \"\") [vLLM]",
        "Flags marked [vLLM] take the same name"}) {
    EXPECT_NE(out.find(line), std::string::npos) << line << "\n" << out;
  }
  EXPECT_EQ(out.find("--worker (default: \"127.0.0.1:50061\") [vLLM]"), std::string::npos);
  if (std::filesystem::exists(BinaryPath("services/kvstore/tandem-kvstore"))) {
    CheckHelp("services/kvstore/tandem-kvstore", "services/kvstore/main.cc",
              {{"bulk-load-listen", "\"auto\""}, {"metrics-listen", "\"127.0.0.1:0\""}});
  }
}

// Flags are checked at startup against each other with the --max-model-len
// given (not a made-up one): without chunked prefill the budget must hold
// the longest request.
TEST(SurfaceTest, StartupChecksTheBudgetAgainstTheGivenMaxModelLen) {
  const std::string dir = MakeTempDir("tandem-surface");
  Service ok = StartScheduler(dir, "budget-ok", "127.0.0.1:1",
                              {"--max-model-len", "64", "--enable-chunked-prefill=false",
                               "--max-num-batched-tokens", "64", "--max-num-seqs", "64"},
                              /*wait_for_worker=*/false);
  EXPECT_TRUE(ok.process.running());
  std::string out;
  EXPECT_EQ(RunCommand({BinaryPath("services/scheduler/tandem-scheduler"), "--max-model-len", "64",
                        "--enable-chunked-prefill=false", "--max-num-batched-tokens", "32"},
                       &out),
            2)
      << out;
  EXPECT_NE(out.find("--max-num-batched-tokens (32) must be >= --max-model-len (64)"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("512"), std::string::npos) << out;
  // Other values a scheduler refuses at start, naming the flag.
  for (const auto& [args, message] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--max-num-batched-tokens", "8"},
            "--max-num-batched-tokens (8) must be >= --max-num-seqs (128)"},
           {{"--worker-loss-grace-s", "inf"}, "--worker-loss-grace-s must be in [0, 86400]"},
           {{"--max-logprobs", "-1"}, "--max-logprobs must be >= 0, got -1"},
           {{"--drain-timeout-s", "-1"}, "--drain-timeout-s must be >= 0, got -1"}}) {
    std::vector<std::string> argv = {BinaryPath("services/scheduler/tandem-scheduler")};
    argv.insert(argv.end(), args.begin(), args.end());
    EXPECT_EQ(RunCommand(argv, &out), 2) << out;
    EXPECT_NE(out.find(message), std::string::npos) << out;
  }
  for (const char* binary :
       {"services/frontend/tandem-frontend", "services/kvstore/tandem-kvstore"}) {
    EXPECT_EQ(RunCommand({BinaryPath(binary), "--drain-timeout-s", "-1"}, &out), 2) << out;
    EXPECT_NE(out.find("--drain-timeout-s must be >= 0, got -1"), std::string::npos)
        << binary << ": " << out;
  }
  EXPECT_EQ(
      RunCommand({BinaryPath("services/scheduler/tandem-scheduler"), "--max-step-failures", "0"},
                 &out),
      2)
      << out;
  EXPECT_NE(out.find("--max-step-failures must be > 0"), std::string::npos) << out;
}

TEST(SurfaceTest, ABadKvStoreBulkPortIsRefusedAtStartup) {
  std::string out;
  EXPECT_EQ(RunCommand({BinaryPath("services/scheduler/tandem-scheduler"), "--kvstore",
                        "127.0.0.1:1", "--kvstore-bulk-port", "nonsense"},
                       &out),
            2)
      << out;
  EXPECT_NE(out.find("--kvstore-bulk-port"), std::string::npos) << out;
  // The worker takes the same flag (and its old name, --kvstore-bulk-load)
  // and checks it at start too.
  for (const char* name : {"--kvstore-bulk-port", "--kvstore-bulk-load"}) {
    EXPECT_EQ(RunCommand({BinaryPath("services/worker/tandem-worker"), "--model",
                          "no-such-model.bin", "--kvstore", "127.0.0.1:1", name, "nonsense"},
                         &out),
              2)
        << out;
    EXPECT_NE(out.find("--kvstore-bulk-port must be auto, off or host:port"), std::string::npos)
        << name << ": " << out;
  }
  // --metrics-port-file has no port to write with the metrics endpoint off.
  EXPECT_EQ(RunCommand({BinaryPath("services/scheduler/tandem-scheduler"),
                        "--metrics-listen=", "--metrics-port-file", "/tmp/unused.port"},
                       &out),
            2)
      << out;
  EXPECT_NE(out.find("--metrics-port-file needs --metrics-listen"), std::string::npos) << out;
}

// The worker's device flags: bf16 needs the cuda backend, a worker drives one
// GPU, device ordinals are not negative, and the KV cache is sized one way. Each is a usage error
// (exit 2) that names the flag.
TEST(SurfaceTest, WorkerRefusesDeviceFlagsItCannotHonour) {
  const std::string worker = BinaryPath("services/worker/tandem-worker");
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {{"--dtype", "bfloat16"}, "--dtype=bfloat16: dtype bfloat16 needs the cuda backend"},
           {{"--dtype", "float16"}, "--dtype=float16: dtype 'float16' is not supported"},
           {{"--dtype", "half"}, "--dtype=half: dtype 'half' is not supported"},
           {{"--dtype", "int8"}, "--dtype=int8: unknown dtype 'int8'"},
           {{"--gpus", "2"}, "--gpus=2: a worker drives exactly one GPU"},
           {{"--device", "-1"}, "--device must be >= 0"},
           // --gpu-memory-utilization sizes only the cuda backend's cache, and
           // only when nothing else does; it is never silently ignored.
           {{"--gpu-memory-utilization", "0.5"},
            "--gpu-memory-utilization sizes the KV cache of --backend=cuda; with --backend=cpu "
            "give --kv-cache-bytes or --num-blocks"},
           {{"--backend", "cuda", "--gpu-memory-utilization", "0.5", "--num-blocks", "10"},
            "--gpu-memory-utilization and --num-blocks/--kv-cache-bytes both size the KV cache"},
           {{"--backend", "cuda", "--gpu-memory-utilization", "1.5"},
            "--gpu-memory-utilization=1.5 must be in (0, 1]"},
           {{"--kv-cache-bytes", "-1"}, "--kv-cache-bytes must be >= 0"},
           {{"--max-model-len", "-1"}, "--max-model-len must be >= 0"},
           {{"--kvstore-load-threads", "0"}, "--kvstore-load-threads must be in [1, 64], got 0"},
           {{"--kvstore-empty-step-wait-ms", "-1"},
            "--kvstore-empty-step-wait-ms must be in [0, 1000], got -1"}}) {
    std::vector<std::string> argv = {worker, "--model", "no-such-model.bin"};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    std::string out;
    EXPECT_EQ(RunCommand(argv, &out), 2) << c.message << "\n" << out;
    EXPECT_NE(out.find(c.message), std::string::npos) << out;
  }
}

TEST(SurfaceTest, CommandLineClientGeneratesAndBenchmarks) {
  const std::string dir = MakeTempDir("tandem-surface");
  Service worker = StartWorker(dir, "worker", {});
  Service scheduler = StartScheduler(dir, "scheduler", worker.address(), {});
  auto stub = GenerationStub(scheduler.address());
  const std::string tandem = BinaryPath("tools/cli/tandem");

  // generate: the same greedy tokens as a direct call, then the usage line.
  GenerateResult direct = RunGenerate(stub.get(), MakeRequest({1, 5, 9}, 8, 0, {}, true));
  ASSERT_TRUE(direct.status.ok());
  std::string expected_tokens;
  for (int32_t t : direct.tokens) expected_tokens += std::to_string(t) + " ";
  std::string out;
  ASSERT_EQ(RunCommand({tandem, "generate", "--server", scheduler.address(), "--prompt", "1,5,9",
                        "--max-tokens", "8", "--ignore-eos"},
                       &out),
            0)
      << out;
  EXPECT_NE(out.find(expected_tokens), std::string::npos) << out;
  EXPECT_NE(out.find("finish=length prompt_tokens=3 output_tokens=8 cached_local=0"),
            std::string::npos)
      << out;

  // --n copies run concurrently; the later ones hit the prefix cache.
  ASSERT_EQ(RunCommand({tandem, "generate", "--server", scheduler.address(), "--prompt",
                        "1,5,9,11,13,15,17,19,21,23,25,27,29,31,33,35,37,39,41", "--max-tokens",
                        "4", "--ignore-eos", "--n", "3"},
                       &out),
            0)
      << out;
  for (int i = 0; i < 3; ++i) {
    EXPECT_NE(out.find("[" + std::to_string(i) + "] "), std::string::npos) << out;
  }
  EXPECT_EQ(std::count(out.begin(), out.end(), '('), 3) << out;

  // A bad request: the client prints the status by name on stderr (not
  // stdout) and exits 1.
  const std::string bad = tandem + " generate --server " + scheduler.address() + " --prompt 1,999";
  EXPECT_EQ(RunCommand({"/bin/sh", "-c", bad + " 2>/dev/null"}, &out), 1) << out;
  EXPECT_EQ(out.find("outside the vocabulary"), std::string::npos) << "error on stdout: " << out;
  EXPECT_EQ(RunCommand({"/bin/sh", "-c", bad + " 2>&1 >/dev/null"}, &out), 1) << out;
  EXPECT_NE(out.find("tandem generate: INVALID_ARGUMENT: "), std::string::npos) << out;
  EXPECT_NE(out.find("is outside the vocabulary"), std::string::npos) << out;
  // Usage errors exit 2; a server that is not there is a server error (1).
  EXPECT_EQ(
      RunCommand({tandem, "generate", "--server", scheduler.address(), "--prompt", "x"}, &out), 2)
      << out;
  EXPECT_EQ(RunCommand({tandem, "stats", "--bogus"}, &out), 2) << out;
  EXPECT_EQ(RunCommand({tandem, "stats", "--server", "127.0.0.1:1"}, &out), 1) << out;
  EXPECT_NE(out.find("tandem stats: UNAVAILABLE: "), std::string::npos) << out;

  // stats prints every field, zeros included; info every field too.
  ASSERT_EQ(RunCommand({tandem, "stats", "--server", scheduler.address()}, &out), 0) << out;
  const google::protobuf::Descriptor* stats_fields = v1::GetStatsResponse::descriptor();
  for (int i = 0; i < stats_fields->field_count(); ++i) {
    EXPECT_NE(("\n" + out).find("\n" + stats_fields->field(i)->name() + ": "), std::string::npos)
        << stats_fields->field(i)->name() << " missing:\n"
        << out;
  }
  EXPECT_NE(out.find("\nnum_preemptions: 0\n"), std::string::npos) << out;
  ASSERT_EQ(RunCommand({tandem, "info", "--server", scheduler.address()}, &out), 0) << out;
  EXPECT_EQ(out.rfind("model_name: \"", 0), 0u) << out;

  // bench: every request succeeds and the report has its figures.
  const std::string json_path = dir + "/bench.json";
  ASSERT_EQ(RunCommand({tandem, "bench", "--server", scheduler.address(), "--concurrency", "4",
                        "--num-requests", "8", "--prompt-len", "20", "--output-len", "6",
                        "--shared-prefix-len", "16", "--label", "cli-test", "--json", json_path},
                       &out),
            0)
      << out;
  for (const char* row : {"TTFT  ms", "ITL   ms", "TPOT  ms", "E2E   ms"}) {
    EXPECT_NE(out.find(row), std::string::npos) << row << "\n" << out;
  }
  EXPECT_NE(out.find("mean        p50        p90        p99"), std::string::npos) << out;
  // The JSON file has the same figures, and is JSON (a real parser reads it).
  std::string json_out;
  ASSERT_EQ(
      RunCommand({"/usr/bin/python3", "-c",
                  "import json,sys; d=json.load(open(sys.argv[1])); "
                  "print(d['label'], d['num_requests'], d['failed'], "
                  "all(d[s+'_'+m+'_ms'] >= 0 for s in ('mean','p50','p90','p99') "
                  "for m in ('ttft','itl','tpot','e2e')), d['p99_e2e_ms'] >= d['p50_e2e_ms'] > 0)",
                  json_path},
                 &json_out),
      0)
      << json_out;
  EXPECT_EQ(json_out, "cli-test 8 0 True True\n");
  EXPECT_NE(out.find("[cli-test] concurrency=4 requests=8 failed=0 prompt_len=20 output_len=6 "
                     "shared_prefix=16"),
            std::string::npos)
      << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(output ([0-9.]+) tok/s)"))) << out;
  EXPECT_GT(std::stod(m[1]), 0.0);
  EXPECT_GE(GetStats(stub.get()).num_requests_finished(), 1u + 3u + 8u);
}

}  // namespace
}  // namespace tandem::testing
