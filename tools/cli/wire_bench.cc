// tandem-wire-bench: size and (de)serialization time of the per-step wire
// messages (DESIGN §4, §8) with N running decode requests, using the real
// scheduler core and the libs/rpc conversion.
//
//   tandem-wire-bench [--running 256] [--prompt-len 64] [--steps 2000]
#include <chrono>
#include <cstdio>
#include <vector>

#include "tandem/common/flags.h"
#include "tandem/rpc/convert.h"
#include "tandem/sched/scheduler.h"
#include "tandem/v1/worker.pb.h"

int main(int argc, char** argv) {
  int32_t running = 256;
  int32_t prompt_len = 64;
  int32_t steps = 2000;
  bool async = true;
  tandem::FlagSet flags("tandem-wire-bench",
                        "Measures SchedulerOutput / ModelRunnerOutput size and serialize "
                        "time per decode step with N running requests.");
  flags.Add("running", &running, "running decode requests");
  flags.Add("prompt-len", &prompt_len, "prompt tokens per request");
  flags.Add("steps", &steps, "decode steps measured");
  flags.Add("async", &async, "async scheduling (placeholders on the wire)");
  flags.ParseOrExit(argc, argv);

  tandem::sched::SchedulerConfig config{
      .max_num_batched_tokens = std::max(2048, running * prompt_len),
      .max_num_seqs = running,
      .max_model_len = 1 << 20,
      .num_gpu_blocks = running * ((prompt_len + steps + 64) / 16 + 2) + 2,
      .async_scheduling = async,
      .vocab_size = 512,
      .hash_root = {.model_fingerprint = "bench", .kv_layout = "bench", .block_size = 16},
  };
  if (auto s = config.Validate(); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 1;
  }
  tandem::sched::Scheduler scheduler(config, nullptr);
  for (int i = 0; i < running; ++i) {
    std::vector<int32_t> prompt(prompt_len);
    for (int j = 0; j < prompt_len; ++j) prompt[j] = 2 + (i * 31 + j * 7) % 500;
    tandem::sched::RequestSpec spec{.request_id = "request-" + std::to_string(i),
                                    .prompt_token_ids = prompt,
                                    .sampling = {.max_tokens = steps + 16, .ignore_eos = true}};
    if (auto s = scheduler.AddRequest(std::move(spec), 0); !s.ok()) {
      std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  auto fake_output = [](const tandem::sched::SchedulerOutput& out) {
    tandem::sched::ModelRunnerOutput r{.step_id = out.step_id};
    for (const auto& n : out.scheduled_new_reqs) r.sampled.push_back({n.request_id, {7}});
    for (const auto& c : out.scheduled_cached_reqs) r.sampled.push_back({c.request_id, {7}});
    return r;
  };
  // The prefill step (all requests new).
  tandem::sched::SchedulerOutput first = scheduler.Schedule();
  tandem::v1::SchedulerOutput first_proto;
  tandem::rpc::ToProto(first, &first_proto);
  std::printf("prefill step: %zu new requests, SchedulerOutput %zu bytes\n",
              first.scheduled_new_reqs.size(), first_proto.ByteSizeLong());
  scheduler.UpdateFromOutput(first, fake_output(first));

  double to_proto_s = 0, serialize_s = 0, parse_s = 0, from_proto_s = 0, reply_s = 0;
  size_t bytes = 0, reply_bytes = 0, measured = 0;
  tandem::v1::SchedulerOutput proto;
  tandem::v1::SchedulerOutput parsed;
  tandem::sched::SchedulerOutput back;
  std::string wire;
  using Clock = std::chrono::steady_clock;
  for (int step = 0; step < steps; ++step) {
    tandem::sched::SchedulerOutput out = scheduler.Schedule();
    auto t0 = Clock::now();
    proto.Clear();
    tandem::rpc::ToProto(out, &proto);
    auto t1 = Clock::now();
    wire.clear();
    proto.SerializeToString(&wire);
    auto t2 = Clock::now();
    parsed.ParseFromString(wire);
    auto t3 = Clock::now();
    tandem::rpc::FromProto(parsed, &back).ok();
    auto t4 = Clock::now();
    tandem::sched::ModelRunnerOutput reply = fake_output(out);
    tandem::v1::ModelRunnerOutput reply_proto;
    auto t5 = Clock::now();
    tandem::rpc::ToProto(reply, &reply_proto);
    std::string reply_wire = reply_proto.SerializeAsString();
    auto t6 = Clock::now();
    if (static_cast<int32_t>(out.scheduled_cached_reqs.size()) == running) {
      to_proto_s += std::chrono::duration<double>(t1 - t0).count();
      serialize_s += std::chrono::duration<double>(t2 - t1).count();
      parse_s += std::chrono::duration<double>(t3 - t2).count();
      from_proto_s += std::chrono::duration<double>(t4 - t3).count();
      reply_s += std::chrono::duration<double>(t6 - t5).count();
      bytes += wire.size();
      reply_bytes += reply_wire.size();
      ++measured;
    }
    scheduler.UpdateFromOutput(out, reply);
  }
  if (measured == 0) {
    std::printf("no step had all %d requests decoding\n", running);
    return 1;
  }
  const double n = static_cast<double>(measured);
  std::printf(
      "decode steps with %d running requests (%s scheduling), mean over %zu steps:\n"
      "  SchedulerOutput     %8.0f bytes/step  (%.1f bytes/request)\n"
      "    struct->proto     %8.2f us\n"
      "    serialize         %8.2f us\n"
      "    parse             %8.2f us   (worker side)\n"
      "    proto->struct     %8.2f us   (worker side)\n"
      "  ModelRunnerOutput   %8.0f bytes/step, struct->proto+serialize %.2f us\n",
      running, async ? "async" : "sync", measured, bytes / n, bytes / n / running,
      to_proto_s / n * 1e6, serialize_s / n * 1e6, parse_s / n * 1e6, from_proto_s / n * 1e6,
      reply_bytes / n, reply_s / n * 1e6);
  return 0;
}
