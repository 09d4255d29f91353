// The CUDA backend (built only with TANDEM_HAVE_CUDA), in two modes:
//  - float32: a thin composition of cuda_ops.h in the CPU backend's order
//    (matmuls through cuBLAS SGEMM), for exactness against the CPU backend;
//  - bfloat16: the fast path of cuda_bf16_ops.h (see DType).
// Both upload a step's inputs in one pinned host-to-device copy and sample
// on the GPU (ForwardSample): greedy rows by the argmax kernel, the others
// by kernels/sampling.h's program, so only token ids come back. The runner's own stream is a
// blocking one: bf16 kernels and every cuBLAS call go there, float32's
// kernels and the synchronous copies on the legacy default stream, which
// orders itself with it. bfloat16 decode steps replay CUDA graphs
// (decode_graphs.h); prefill chunks of 16+ rows take the tensor-core
// attention kernel (kernels/attention_plan.h).
//
// This file: CudaRunnerBase's longer methods (cuda_runner_base.h) and
// CreateCudaRunner; the modes are cuda_runner_f32.cc and cuda_runner_bf16.cc.
#include <algorithm>
#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "cuda_runner_base.h"
#include "tandem/common/logging.h"
#include "tandem/model/sampler.h"

namespace tandem::model::internal {

absl::Status CudaRunnerBase::ForwardSample(std::span<const SequenceInput> batch,
                                           std::span<const SampleRequest> sample,
                                           std::vector<int32_t>* tokens,
                                           std::vector<SampleLogprobs>* logprobs) {
  if (sample.size() != batch.size()) {
    return ModelRunner::ForwardSample(batch, sample, tokens, logprobs);
  }
  // The device clock: from before the first upload to after the last kernel
  // (StepEvents::MarkEnd below and in DeviceLogprobs); a failed step is not
  // counted.
  step_events_.Begin(stream_);
  TANDEM_RETURN_IF_ERROR(SampleOnDevice(batch, sample, tokens, logprobs));
  step_events_.Finish(&device_clock_);
  return absl::OkStatus();
}

absl::Status CudaRunnerBase::LaunchSample(std::span<const SequenceInput> batch,
                                          std::span<const SampleRequest> sample, bool want_logprobs,
                                          std::function<void()> on_done) {
  if (!runner_opts_.async_launch || want_logprobs || sample.size() != batch.size()) {
    return ModelRunner::LaunchSample(batch, sample, want_logprobs, std::move(on_done));
  }
  Launched& l = launched_;
  l = Launched{};
  step_events_.Begin(stream_);
  // As SampleOnDevice, up to the downloads: nothing else is in flight on
  // the stream (the step before was finished), so its synchronous uploads
  // wait for nothing.
  TANDEM_RETURN_IF_ERROR(RunAndDraw(batch, sample, &l.drawn_rows, &l.rows));
  const int32_t draws = static_cast<int32_t>(l.drawn_rows.size());
  l.samples.resize(sample.size());
  for (size_t i = 0; i < sample.size(); ++i) l.samples[i] = sample[i].params != nullptr;
  if (l.rows > 0) {
    const size_t bytes = sizeof(int32_t) * static_cast<size_t>(l.rows + draws);
    if (token_staging_.size() < bytes) {
      token_staging_ = PinnedBuffer();
      TANDEM_ASSIGN_OR_RETURN(token_staging_,
                              PinnedBuffer::Allocate(std::max<size_t>(bytes, 4096),
                                                     {.lock = false, .what = "sampled token ids"}));
    }
    TANDEM_RETURN_IF_ERROR(CudaStatus(kd::CopyAsync(token_staging_.data(), argmax_.get<int32_t>(),
                                                    sizeof(int32_t) * l.rows, stream_),
                                      "token download"));
    if (draws > 0) {
      TANDEM_RETURN_IF_ERROR(
          CudaStatus(kd::CopyAsync(token_staging_.data() + sizeof(int32_t) * l.rows,
                                   sample_tokens_.get<int32_t>(), sizeof(int32_t) * draws, stream_),
                     "sampled token download"));
    }
  }
  // FinishSample waits for this event, not for the host function after it
  // (which may run late): the CUDA runtime's callback thread is one more
  // wake-up between the step's end and its tokens.
  if (launched_end_ == nullptr) {
    TANDEM_RETURN_IF_ERROR(CudaStatus(kd::EventCreate(&launched_end_), "event"));
  }
  TANDEM_RETURN_IF_ERROR(CudaStatus(kd::EventRecord(launched_end_, stream_), "event"));
  // The callback owns its copy of on_done: it may run after the next launch.
  auto* done = new std::function<void()>(std::move(on_done));
  if (const int err = kd::LaunchHostFunc(stream_, &CudaRunnerBase::LaunchedStepDone, done);
      err != 0) {
    delete done;
    return CudaStatus(err, "step end callback");
  }
  l.active = true;
  return absl::OkStatus();
}

void CudaRunnerBase::LaunchedStepDone(void* on_done) {
  auto* done = static_cast<std::function<void()>*>(on_done);
  (*done)();
  delete done;
}

absl::Status CudaRunnerBase::FinishSample(std::vector<int32_t>* tokens,
                                          std::vector<SampleLogprobs>* logprobs) {
  if (!launched_.active) return ModelRunner::FinishSample(tokens, logprobs);
  Launched& l = launched_;
  l.active = false;
  logprobs->clear();
  TANDEM_RETURN_IF_ERROR(CudaStatus(kd::EventSynchronize(launched_end_), "step"));
  tokens->assign(l.samples.size(), -1);
  const auto* staged = reinterpret_cast<const int32_t*>(token_staging_.data());
  if (l.rows > 0) {
    for (size_t i = 0; i < l.samples.size(); ++i) {
      if (l.samples[i]) (*tokens)[i] = staged[i];
    }
    for (size_t j = 0; j < l.drawn_rows.size(); ++j) {
      (*tokens)[static_cast<size_t>(l.drawn_rows[j])] = staged[l.rows + static_cast<int64_t>(j)];
    }
  }
  step_events_.Finish(&device_clock_);
  return absl::OkStatus();
}

absl::Status CudaRunnerBase::RunAndDraw(std::span<const SequenceInput> batch,
                                        std::span<const SampleRequest> sample,
                                        std::vector<int32_t>* drawn_rows, int32_t* rows) {
  // The draws' arguments go up before the step: a synchronous copy after
  // it would wait for the step.
  TANDEM_ASSIGN_OR_RETURN(*drawn_rows, UploadDraws(sample));
  TANDEM_RETURN_IF_ERROR(Run(batch, /*argmax=*/true, rows));
  if (*rows == 0) return absl::OkStatus();
  const int32_t draws = static_cast<int32_t>(drawn_rows->size());
  if (draws > 0) {
    TANDEM_RETURN_IF_ERROR(CudaStatus(
        kd::Sample(logits_.get<float>(), draws, model_->config().vocab_size,
                   sample_args_.get<kernels::SampleArgs>(), sample_banned_.get<int32_t>(),
                   sample_penalties_.get<kernels::SamplePenalty>(), sample_tokens_.get<int32_t>(),
                   sample_scratch_.get<float>(), stream_),
        "sample"));
  }
  step_events_.MarkEnd(stream_);  // the downloads are a few bytes
  return absl::OkStatus();
}

absl::Status CudaRunnerBase::SampleOnDevice(std::span<const SequenceInput> batch,
                                            std::span<const SampleRequest> sample,
                                            std::vector<int32_t>* tokens,
                                            std::vector<SampleLogprobs>* logprobs) {
  std::vector<int32_t> drawn_rows;
  int32_t rows = 0;
  TANDEM_RETURN_IF_ERROR(RunAndDraw(batch, sample, &drawn_rows, &rows));
  tokens->assign(batch.size(), -1);
  if (rows == 0) return absl::OkStatus();
  const int32_t draws = static_cast<int32_t>(drawn_rows.size());
  std::vector<int32_t> greedy(static_cast<size_t>(rows));
  TANDEM_RETURN_IF_ERROR(CudaStatus(
      kd::CopyToHost(greedy.data(), argmax_.get<int32_t>(), greedy.size() * sizeof(int32_t)),
      "token download"));
  std::vector<int32_t> drawn(drawn_rows.size());
  if (draws > 0) {
    TANDEM_RETURN_IF_ERROR(CudaStatus(
        kd::CopyToHost(drawn.data(), sample_tokens_.get<int32_t>(), drawn.size() * sizeof(int32_t)),
        "sampled token download"));
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    if (sample[i].params != nullptr) (*tokens)[i] = greedy[i];
  }
  for (size_t j = 0; j < drawn.size(); ++j) {
    (*tokens)[static_cast<size_t>(drawn_rows[j])] = drawn[j];
  }
  if (logprobs == nullptr) return absl::OkStatus();
  return DeviceLogprobs(batch, sample, *tokens, logprobs);
}

// The logprobs on the device (kernels/logprobs.h): one block per position
// asked for, after the step on the same stream; only each position's
// logprob, rank and top-n come back, not its row of logits.
absl::Status CudaRunnerBase::DeviceLogprobs(std::span<const SequenceInput> batch,
                                            std::span<const SampleRequest> sample,
                                            std::span<const int32_t> tokens,
                                            std::vector<SampleLogprobs>* logprobs) {
  const int32_t vocab = model_->config().vocab_size;
  TANDEM_ASSIGN_OR_RETURN(const std::vector<LogprobTarget> targets,
                          LogprobTargets(batch, sample, tokens, vocab));
  if (targets.empty()) {
    AssembleLogprobs(targets, {}, sample.size(), logprobs);
    return absl::OkStatus();
  }
  std::vector<kernels::LogprobJob> jobs;
  jobs.reserve(targets.size());
  int32_t top_total = 0;
  for (const LogprobTarget& t : targets) {
    jobs.push_back(
        {.row = t.logits_row, .token = t.token, .top_n = t.top_n, .top_begin = top_total});
    top_total += t.top_n;
  }
  const int32_t num_jobs = static_cast<int32_t>(jobs.size());
  TANDEM_RETURN_IF_ERROR(logprob_jobs_.Upload(jobs));
  TANDEM_RETURN_IF_ERROR(logprob_results_.Reserve(sizeof(kernels::LogprobResult) * num_jobs));
  TANDEM_RETURN_IF_ERROR(logprob_top_ids_.Reserve(sizeof(int32_t) * std::max(top_total, 1)));
  TANDEM_RETURN_IF_ERROR(logprob_top_values_.Reserve(sizeof(float) * std::max(top_total, 1)));
  TANDEM_RETURN_IF_ERROR(CudaStatus(
      kd::Logprobs(logits_.get<float>(), vocab, logprob_jobs_.get<kernels::LogprobJob>(), num_jobs,
                   logprob_results_.get<kernels::LogprobResult>(), logprob_top_ids_.get<int32_t>(),
                   logprob_top_values_.get<float>(), stream_),
      "logprobs"));
  step_events_.MarkEnd(stream_);
  std::vector<kernels::LogprobResult> results(jobs.size());
  std::vector<int32_t> top_ids(static_cast<size_t>(top_total));
  std::vector<float> top_values(static_cast<size_t>(top_total));
  TANDEM_RETURN_IF_ERROR(
      CudaStatus(kd::CopyToHost(results.data(), logprob_results_.get<kernels::LogprobResult>(),
                                results.size() * sizeof(kernels::LogprobResult)),
                 "logprobs download"));
  if (top_total > 0) {
    TANDEM_RETURN_IF_ERROR(
        CudaStatus(kd::CopyToHost(top_ids.data(), logprob_top_ids_.get<int32_t>(),
                                  top_ids.size() * sizeof(int32_t)),
                   "top logprob ids download"));
    TANDEM_RETURN_IF_ERROR(
        CudaStatus(kd::CopyToHost(top_values.data(), logprob_top_values_.get<float>(),
                                  top_values.size() * sizeof(float)),
                   "top logprobs download"));
  }
  std::vector<TokenLogprobs> out;
  out.reserve(jobs.size());
  for (size_t j = 0; j < jobs.size(); ++j) {
    const auto first = static_cast<size_t>(jobs[j].top_begin);
    const auto last = first + static_cast<size_t>(jobs[j].top_n);
    out.push_back(TokenLogprobs{
        .token_id = jobs[j].token,
        .logprob = results[j].logprob,
        .rank = results[j].rank,
        .top_token_ids = std::vector<int32_t>(top_ids.begin() + first, top_ids.begin() + last),
        .top_logprobs = std::vector<float>(top_values.begin() + first, top_values.begin() + last)});
  }
  AssembleLogprobs(targets, std::move(out), sample.size(), logprobs);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> CudaRunnerBase::UploadDraws(
    std::span<const SampleRequest> sample) {
  std::vector<kernels::SampleArgs> args;
  std::vector<int32_t> banned, rows;
  std::vector<kernels::SamplePenalty> history;
  for (size_t i = 0; i < sample.size(); ++i) {
    const SampleRequest& r = sample[i];
    if (r.params == nullptr || (r.params->temperature == 0.0f && r.banned_token_ids.empty() &&
                                r.allowed_mask.empty() && !r.params->AdjustsLogits())) {
      continue;
    }
    const size_t history_begin = history.size();
    SampleAdjustments(*r.params, r.prompt_token_ids, r.output_token_ids, &history);
    kernels::SampleArgs a = ToSampleArgs(*r.params, r.output_position, r.banned_token_ids.size(),
                                         history.size() - history_begin, r.allowed_mask.size());
    a.row = static_cast<int32_t>(i);
    a.banned_begin = static_cast<int32_t>(banned.size());
    a.penalty_begin = static_cast<int32_t>(history_begin);
    AppendSampleIds(*r.params, r.banned_token_ids, r.allowed_mask, &banned);
    args.push_back(a);
    rows.push_back(a.row);
  }
  if (args.empty()) return rows;
  TANDEM_RETURN_IF_ERROR(CudaStatus(kd::SetDevice(device_), "set device"));
  TANDEM_RETURN_IF_ERROR(sample_args_.Upload(args));
  // Each reserves a byte at least, so neither pointer is null.
  TANDEM_RETURN_IF_ERROR(sample_banned_.Upload(banned));
  TANDEM_RETURN_IF_ERROR(sample_penalties_.Upload(history));
  const size_t n = args.size(), vocab = static_cast<size_t>(model_->config().vocab_size);
  TANDEM_RETURN_IF_ERROR(sample_scratch_.Reserve(sizeof(float) * n * vocab));
  TANDEM_RETURN_IF_ERROR(sample_tokens_.Reserve(sizeof(int32_t) * n));
  return rows;
}

absl::Status CudaRunnerBase::CopyBlocksFromHost(std::span<const int32_t> block_ids,
                                                std::span<const std::span<const std::byte>> in) {
  TANDEM_RETURN_IF_ERROR(ValidateBlockCopies(block_ids, in));
  if (block_ids.empty()) return absl::OkStatus();
  TANDEM_RETURN_IF_ERROR(CudaStatus(kd::SetDevice(device_), "set device"));
  TANDEM_RETURN_IF_ERROR(copies_out_.OrderBefore(block_ids, stream_, /*host_waits=*/false));
  TANDEM_RETURN_IF_ERROR(copies_in_.OrderBefore(block_ids, stream_, /*host_waits=*/false));
  for (size_t i = 0; i < block_ids.size(); ++i) {
    TANDEM_RETURN_IF_ERROR(CudaStatus(
        kd::CopyAsync(BlockPtr(block_ids[i]), in[i].data(), in[i].size(), stream_), "block copy"));
  }
  return CudaStatus(kd::StreamSynchronize(stream_), "block copies");
}

absl::StatusOr<ModelRunner::BlockCopyWait> CudaRunnerBase::CopyBlocksToHostAsync(
    std::span<const int32_t> block_ids, std::span<const std::span<std::byte>> out) {
  TANDEM_RETURN_IF_ERROR(ValidateBlockCopies(block_ids, out));
  TANDEM_RETURN_IF_ERROR(CudaStatus(kd::SetDevice(device_), "set device"));
  // A block still being loaded is never stored (its request computes
  // nothing until the load is reported); should one be, the host waits.
  TANDEM_RETURN_IF_ERROR(copies_in_.OrderBefore(block_ids, nullptr, /*host_waits=*/true));
  std::vector<BlockCopies::Piece> pieces;
  pieces.reserve(block_ids.size());
  for (size_t i = 0; i < block_ids.size(); ++i) {
    pieces.push_back({.dst = out[i].data(), .src = BlockPtr(block_ids[i]), .bytes = out[i].size()});
  }
  TANDEM_ASSIGN_OR_RETURN(std::shared_ptr<void> copied,
                          copies_out_.Begin(stream_, block_ids, pieces, "block copy to host"));
  return BlockCopies::WaitFor(std::move(copied), device_, "block copy to host");
}

absl::StatusOr<ModelRunner::BlockCopyIn> CudaRunnerBase::CopyBlocksFromHostAsync(
    std::span<const int32_t> block_ids, std::span<const std::span<const std::byte>> in) {
  TANDEM_RETURN_IF_ERROR(ValidateBlockCopies(block_ids, in));
  if (block_ids.empty()) {
    return BlockCopyIn{.done = [] { return true; }, .wait = [] { return absl::OkStatus(); }};
  }
  TANDEM_RETURN_IF_ERROR(CudaStatus(kd::SetDevice(device_), "set device"));
  // A copy out of one of these blocks (a store of the request that held it
  // before) reads it first: the copy stream waits for it on the device.
  TANDEM_ASSIGN_OR_RETURN(void* copy_stream, copies_in_.Stream());
  TANDEM_RETURN_IF_ERROR(copies_out_.OrderBefore(block_ids, copy_stream, /*host_waits=*/false));
  std::vector<BlockCopies::Piece> pieces;
  pieces.reserve(block_ids.size());
  for (size_t i = 0; i < block_ids.size(); ++i) {
    pieces.push_back({.dst = BlockPtr(block_ids[i]), .src = in[i].data(), .bytes = in[i].size()});
  }
  TANDEM_ASSIGN_OR_RETURN(std::shared_ptr<void> copied,
                          copies_in_.Begin(stream_, block_ids, pieces, "block copy into the cache"));
  return BlockCopyIn{.done = [copied] { return BlockCopies::Ended(copied); },
                     .wait = BlockCopies::WaitFor(copied, device_, "block copy into the cache")};
}

absl::Status CudaRunnerBase::InitCommon() {
  const ModelConfig& c = model_->config();
  TANDEM_RETURN_IF_ERROR(CudaStatus(kd::SetDevice(device_), "set device"));
  TANDEM_RETURN_IF_ERROR(ReadMemory(&memory_.free_at_start));
  shape_ = KvCacheShape{.num_blocks = opts_.num_blocks,
                        .num_layers = c.num_layers,
                        .block_size = opts_.block_size,
                        .num_kv_heads = c.num_kv_heads,
                        .head_size = c.head_size};
  TANDEM_RETURN_IF_ERROR(CudaStatus(kd::CreateBlas(&blas_), "cublasCreate"));
  TANDEM_RETURN_IF_ERROR(CudaStatus(kd::StreamCreate(&stream_), "stream"));
  // cuBLAS's recommended workspace on Hopper, fixed so that captures
  // allocate nothing.
  constexpr size_t kBlasWorkspace = size_t{32} << 20;
  TANDEM_RETURN_IF_ERROR(blas_workspace_.Reserve(kBlasWorkspace));
  TANDEM_RETURN_IF_ERROR(
      CudaStatus(kd::SetBlasStream(blas_, stream_, blas_workspace_.get<void>(), kBlasWorkspace),
                 "cuBLAS stream"));
  // Head size 256 and the softcap (Gemma) on the tensor-core prefill kernel
  // only when asked for (ModelRunnerOptions::tensor_core_prefill_gemma).
  const bool gemma_tiles = c.head_size == 256 || c.attn_logit_softcap > 0;
  tensor_core_attention_ =
      tensor_core_attention_ && (!gemma_tiles || runner_opts_.tensor_core_prefill_gemma) &&
      opts_.dtype == DType::kBFloat16 && kd::DeviceHasTensorCoreAttention(device_);
  prefill_wide_ =
      tensor_core_attention_ && runner_opts_.tensor_core_prefill_wide && c.head_size == 128;
  decode_tensor_cores_ = decode_tensor_cores_ && opts_.dtype == DType::kBFloat16 &&
                         kernels::TensorCoreHeadSize(c.head_size) &&
                         kernels::TensorCoreDecodeBlockSize(opts_.block_size) &&
                         kd::DeviceHasTensorCoreAttention(device_);
  graphs_enabled_ = graphs_enabled_ && opts_.dtype == DType::kBFloat16;
  dependent_launch_ = dependent_launch_ && opts_.dtype == DType::kBFloat16 &&
                      kd::DeviceHasDependentLaunch(device_);
  if (!c.local_rope_layers.empty()) {
    TANDEM_RETURN_IF_ERROR(local_inv_freq_.Upload(c.RopeInverseFrequencies(/*local=*/true)));
  }
  return inv_freq_.Upload(c.RopeInverseFrequencies());
}

const float* CudaRunnerBase::InvFreq(int32_t layer) const {
  return (model_->config().LocalRope(layer) ? local_inv_freq_ : inv_freq_).get<float>();
}

absl::Status CudaRunnerBase::AllocateCache() {
  if (opts_.num_blocks == 0) {
    TANDEM_RETURN_IF_ERROR(ReadMemory(&memory_.free_after_weights));
    TANDEM_ASSIGN_OR_RETURN(
        opts_.num_blocks,
        KvBlocksForMemoryUtilization(
            runner_opts_.gpu_memory_utilization, memory_,
            StepReserveBytes(model_->config(), runner_opts_.max_step_tokens), block_bytes()));
    shape_.num_blocks = opts_.num_blocks;
  }
  const size_t cache_bytes = static_cast<size_t>(block_bytes()) * opts_.num_blocks;
  TANDEM_RETURN_IF_ERROR(cache_.Reserve(cache_bytes));
  return CudaStatus(kd::Memset(cache_.get<void>(), 0, cache_bytes), "memset");
}

absl::Status CudaRunnerBase::Run(std::span<const SequenceInput> batch, bool argmax, int32_t* rows) {
  TANDEM_RETURN_IF_ERROR(ValidateBatch(batch));
  *rows = static_cast<int32_t>(batch.size());
  if (batch.empty()) return absl::OkStatus();
  TANDEM_RETURN_IF_ERROR(CudaStatus(kd::SetDevice(device_), "set device"));
  // The float32 mode's kernels run on the legacy stream: the host waits.
  const bool host_waits = opts_.dtype != DType::kBFloat16;
  if (!copies_out_.empty()) {
    TANDEM_RETURN_IF_ERROR(
        copies_out_.OrderBefore(WrittenBlocks(batch, opts_.block_size), stream_, host_waits));
  }
  if (!copies_in_.empty()) {  // never met while the worker keeps its rule (see above)
    TANDEM_RETURN_IF_ERROR(copies_in_.OrderBefore(
        WrittenBlocks(batch, opts_.block_size, /*read_too=*/true), stream_, host_waits));
  }
  BatchLayout lay = MakeBatchLayout(batch, opts_.block_size);
  const int32_t bucket = GraphBatchBucket(*rows);
  // A decode batch has no rows beyond its last ones (all_logits adds none
  // for a one-token chunk).
  if (argmax && graphs_enabled_ && bucket > 0 && IsDecodeBatch(batch)) {
    return RunGraph(std::move(lay), bucket);
  }
  const ModelConfig& c = model_->config();
  plan_ =
      kernels::PlanAttention(lay.row_pos, lay.row_table_offset, c.head_size,
                             c.num_heads / c.num_kv_heads, tensor_core_attention_, prefill_wide_);
  StepInputs in;
  in.plan = &plan_;
  TANDEM_RETURN_IF_ERROR(Upload(lay, &in));
  *rows = static_cast<int32_t>(lay.last_rows.size());  // and all_logits rows
  TANDEM_RETURN_IF_ERROR(ReserveOutputs(*rows));
  return RunStep(lay, in, *rows, argmax);
}

absl::Status CudaRunnerBase::RunGraph(BatchLayout lay, int32_t bucket) {
  const int32_t splits = GraphSplitsBucket(kd::AttentionSplits(lay.max_context));
  PadDecodeLayout(&lay, bucket);
  plan_ = kernels::AttentionPlan{};
  for (int32_t r = 0; r < bucket; ++r) plan_.single_rows.push_back(r);
  plan_.single_max_context = splits * kd::kAttentionSplitTokens;
  StepInputs in;
  in.plan = &plan_;
  TANDEM_RETURN_IF_ERROR(Upload(lay, &in));
  TANDEM_RETURN_IF_ERROR(ReserveOutputs(bucket));
  TANDEM_RETURN_IF_ERROR(ReserveLayers(bucket, plan_.single_max_context));
  // A graph holds the buffers' addresses: if one moved, every graph is stale.
  const std::vector<void*> pointers = GraphPointers();
  if (pointers != graph_pointers_) {
    DropGraphs();
    graph_pointers_ = pointers;
  }
  void*& exec = graphs_[{bucket, splits}];
  if (exec == nullptr) {
    absl::Status s = CudaStatus(kd::BeginCapture(stream_), "graph capture");
    if (s.ok()) {
      s = RunStep(lay, in, bucket, /*argmax=*/true);
      const absl::Status end = CudaStatus(kd::EndCapture(stream_, &exec), "graph capture");
      if (s.ok()) s = end;
    }
    if (!s.ok() || exec == nullptr) {
      TANDEM_LOG(WARNING) << "CUDA runner: decode graphs off, running eagerly: " << s;
      graphs_.erase({bucket, splits});
      graphs_enabled_ = false;
      return RunStep(lay, in, bucket, /*argmax=*/true);
    }
  }
  ++graph_replays_;
  return CudaStatus(kd::GraphLaunch(exec, stream_), "graph launch");
}

absl::Status CudaRunnerBase::Upload(const BatchLayout& lay, StepInputs* in) {
  size_t offset = 0;
  std::vector<std::pair<const void*, size_t>> parts;
  std::vector<size_t> offsets;
  auto add = [&](const void* p, size_t bytes) {
    offset = (offset + 7) / 8 * 8;
    offsets.push_back(offset);
    parts.emplace_back(p, bytes);
    offset += bytes;
  };
  // The block tables last: in a decode graph's step every other part's
  // place depends on the row count only.
  add(lay.slots.data(), lay.slots.size() * sizeof(int64_t));
  add(lay.tokens.data(), lay.tokens.size() * sizeof(int32_t));
  add(lay.row_pos.data(), lay.row_pos.size() * sizeof(int32_t));
  add(lay.row_table_offset.data(), lay.row_table_offset.size() * sizeof(int32_t));
  add(lay.last_rows.data(), lay.last_rows.size() * sizeof(int32_t));
  add(plan_.tiles.data(), plan_.tiles.size() * sizeof(int32_t));
  add(plan_.single_rows.data(), plan_.single_rows.size() * sizeof(int32_t));
  add(lay.block_tables.data(), lay.block_tables.size() * sizeof(int32_t));
  // Powers of two: a decode graph's tables grow a little every few steps,
  // and a moved inputs_ would drop the graphs.
  const size_t capacity = std::bit_ceil(std::max<size_t>(offset, size_t{64} << 10));
  if (staging_.size() < capacity) {
    staging_ = PinnedBuffer();  // the old one goes first (no step reads it: see below)
    TANDEM_ASSIGN_OR_RETURN(
        staging_, PinnedBuffer::Allocate(capacity, {.lock = false, .what = "step inputs"}));
  }
  TANDEM_RETURN_IF_ERROR(inputs_.Reserve(capacity));
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].second > 0) {
      std::memcpy(staging_.data() + offsets[i], parts[i].first, parts[i].second);
    }
  }
  // The previous step's kernels may still read inputs_: the copy is on the
  // same stream, so it waits for them; the host waits for the copy before
  // the next step rewrites staging_ (Forward ends with a synchronous copy).
  TANDEM_RETURN_IF_ERROR(CudaStatus(
      kd::CopyAsync(inputs_.get<std::byte>(), staging_.data(), offset, stream_), "input upload"));
  const std::byte* base = inputs_.get<std::byte>();
  in->slots = reinterpret_cast<const int64_t*>(base + offsets[0]);
  in->tokens = reinterpret_cast<const int32_t*>(base + offsets[1]);
  in->row_pos = reinterpret_cast<const int32_t*>(base + offsets[2]);
  in->row_off = reinterpret_cast<const int32_t*>(base + offsets[3]);
  in->last_rows = reinterpret_cast<const int32_t*>(base + offsets[4]);
  in->tiles = reinterpret_cast<const int32_t*>(base + offsets[5]);
  in->single_rows = reinterpret_cast<const int32_t*>(base + offsets[6]);
  in->tables = reinterpret_cast<const int32_t*>(base + offsets[7]);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCudaRunner(const Model* model,
                                                              KvCacheOptions opts,
                                                              ModelRunnerOptions runner_opts) {
  const int devices = kd::DeviceCount();
  if (devices == 0) {
    return absl::UnavailableError("CUDA backend: no CUDA device is present");
  }
  if (runner_opts.cuda_device >= devices) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA device ", runner_opts.cuda_device,
                                                   " does not exist: ", devices,
                                                   " device(s) present"));
  }
  std::unique_ptr<CudaRunnerBase> runner;
  if (opts.dtype == DType::kBFloat16) {
    runner = NewCudaBf16Runner(model, opts, runner_opts);
  } else {
    runner = NewCudaF32Runner(model, opts, runner_opts);
  }
  TANDEM_RETURN_IF_ERROR(runner->Init());
  return std::unique_ptr<ModelRunner>(std::move(runner));
}

}  // namespace tandem::model::internal
