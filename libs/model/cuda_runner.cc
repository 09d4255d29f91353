// The CUDA backend (built only with TANDEM_HAVE_CUDA), in two modes:
//  - float32: a thin composition of cuda_ops.h in the CPU backend's order
//    (matmuls through cuBLAS SGEMM), for exactness against the CPU backend;
//  - bfloat16: the fast path of cuda_bf16_ops.h (see DType).
// Both upload a step's inputs in one pinned host-to-device copy and sample
// greedy rows on the GPU (ForwardSample). The runner's own stream is a
// blocking one: bf16 kernels and every cuBLAS call go there, float32's
// kernels and the synchronous copies on the legacy default stream, which
// orders itself with it. bfloat16 decode steps replay CUDA graphs
// (decode_graphs.h); prefill chunks of 16+ rows take the tensor-core
// attention kernel (kernels/attention_plan.h).
#include <algorithm>
#include <bit>
#include <cstring>
#include <map>
#include <span>

#include "absl/strings/str_cat.h"
#include "block_copies_out.h"
#include "cpu_runner.h"
#include "cuda_buffers.h"
#include "decode_graphs.h"
#include "tandem/common/logging.h"
#include "tandem/common/pinned_memory.h"
#include "tandem/common/status.h"
#include "tandem/kernels/attention_plan.h"
#include "tandem/kernels/cuda_bf16_ops.h"
#include "tandem/kernels/cuda_ops.h"
#include "tandem/model/checkpoint.h"
#include "tandem/model/sampler.h"

namespace tandem::model::internal {
namespace {

using kernels::KvCacheShape;
using kernels::PagedAttentionArgs;
using kernels::RopeKind;

RopeKind ToKernel(RopeStyle style) {
  return style == RopeStyle::kRotateHalf ? RopeKind::kRotateHalf : RopeKind::kAdjacentPairs;
}

kernels::ActKind ToKernel(Activation a) {
  return a == Activation::kGeluTanh ? kernels::ActKind::kGeluTanh : kernels::ActKind::kSilu;
}

// Device pointers of one step's metadata, all in one buffer uploaded by one
// copy from pinned memory.
struct StepInputs {
  const int32_t* tokens = nullptr;
  const int32_t* row_pos = nullptr;
  const int32_t* row_off = nullptr;
  const int32_t* tables = nullptr;
  const int64_t* slots = nullptr;
  const int32_t* last_rows = nullptr;
  // Which attention kernel takes which rows (bf16), and its two row lists.
  const kernels::AttentionPlan* plan = nullptr;
  const int32_t* tiles = nullptr;
  const int32_t* single_rows = nullptr;
};

// What both modes share: the step upload, the logits, sampling and block
// copies. A mode implements Init() and RunLayers(), which leaves the logits of
// the rows in BatchLayout::last_rows in logits_.
class CudaRunnerBase : public ModelRunner {
 public:
  CudaRunnerBase(const Model* model, KvCacheOptions opts, ModelRunnerOptions runner_opts)
      : ModelRunner(model, opts, Backend::kCuda),
        runner_opts_(runner_opts),
        device_(runner_opts.cuda_device),
        tensor_core_attention_(runner_opts.tensor_core_attention),
        graphs_enabled_(runner_opts.cuda_graphs) {}
  ~CudaRunnerBase() override {
    DropGraphs();
    kd::DestroyBlas(blas_);
    kd::StreamDestroy(stream_);
  }

  virtual absl::Status Init() = 0;

  absl::Status Forward(std::span<const SequenceInput> batch, std::vector<float>* logits) override {
    int32_t rows = 0;
    TANDEM_RETURN_IF_ERROR(Run(batch, /*argmax=*/false, &rows));
    logits->resize(static_cast<size_t>(rows) * model_->config().vocab_size);
    return CudaStatus(kd::CopyToHost(logits->data(), logits_.get<float>(),
                                     logits->size() * sizeof(float)),
                      "logits download");
  }

  absl::Status ForwardSample(std::span<const SequenceInput> batch,
                             std::span<const SampleRequest> sample, std::vector<int32_t>* tokens,
                             std::vector<SampleLogprobs>* logprobs) override {
    if (sample.size() != batch.size()) {
      return ModelRunner::ForwardSample(batch, sample, tokens, logprobs);
    }
    int32_t rows = 0;
    TANDEM_RETURN_IF_ERROR(Run(batch, /*argmax=*/true, &rows));
    tokens->assign(batch.size(), -1);
    if (rows == 0) return absl::OkStatus();
    const int32_t vocab = model_->config().vocab_size;
    std::vector<int32_t> greedy(static_cast<size_t>(rows));
    TANDEM_RETURN_IF_ERROR(CudaStatus(
        kd::CopyToHost(greedy.data(), argmax_.get<int32_t>(), greedy.size() * sizeof(int32_t)),
        "token download"));
    // Rows needed on the host (temperature sampling, logprobs), one at a time.
    std::vector<float> row_logits(static_cast<size_t>(vocab));
    auto download = [&](int32_t row) -> absl::StatusOr<std::span<const float>> {
      TANDEM_RETURN_IF_ERROR(
          CudaStatus(kd::CopyToHost(row_logits.data(), logits_.get<float>() + int64_t{row} * vocab,
                                    row_logits.size() * sizeof(float)),
                     "logits download"));
      return std::span<const float>(row_logits);
    };
    for (size_t i = 0; i < batch.size(); ++i) {
      const SampleRequest& r = sample[i];
      if (r.params == nullptr) continue;
      if (r.params->temperature == 0.0f && r.banned_token_ids.empty()) {
        (*tokens)[i] = greedy[i];
        continue;
      }
      // Temperature rows and rows with banned tokens: the CPU sampler over
      // this row's logits.
      TANDEM_ASSIGN_OR_RETURN(std::span<const float> logits, download(static_cast<int32_t>(i)));
      (*tokens)[i] = SampleToken(logits, *r.params, r.output_position, r.banned_token_ids);
    }
    if (logprobs == nullptr) return absl::OkStatus();
    return ComputeBatchLogprobs(batch, sample, *tokens, download, logprobs);
  }

  std::span<std::byte> BlockBytes(int32_t) override { return {}; }
  int64_t graph_replays() const override { return graph_replays_; }

  absl::Status CopyBlockToHost(int32_t block_id, std::span<std::byte> out) override {
    TANDEM_RETURN_IF_ERROR(ValidateBlockCopy(block_id, out.size()));
    TANDEM_RETURN_IF_ERROR(CudaStatus(kd::SetDevice(device_), "set device"));
    return CudaStatus(kd::CopyToHost(out.data(), BlockPtr(block_id), out.size()), "block copy");
  }
  absl::Status CopyBlockFromHost(int32_t block_id, std::span<const std::byte> in) override {
    TANDEM_RETURN_IF_ERROR(ValidateBlockCopy(block_id, in.size()));
    TANDEM_RETURN_IF_ERROR(CudaStatus(kd::SetDevice(device_), "set device"));
    // A synchronous copy on the legacy stream: the host waits for a copy
    // out of this block first (rare: only a block freed and reused while
    // its store was still being copied).
    const int32_t blocks[] = {block_id};
    TANDEM_RETURN_IF_ERROR(copies_out_.OrderBefore(blocks, stream_, /*host_waits=*/true));
    return CudaStatus(kd::CopyToDevice(BlockPtr(block_id), in.data(), in.size()), "block copy");
  }

  // The KV-store's loads: every copy queued on the step stream behind the
  // copies out that still read one of the blocks (a wait on the device),
  // then one wait for all of them, instead of a synchronous copy per block.
  // From the connector's pinned staging each is a DMA of its own.
  absl::Status CopyBlocksFromHost(std::span<const int32_t> block_ids,
                                  std::span<const std::span<const std::byte>> in) override {
    TANDEM_RETURN_IF_ERROR(ValidateBlockCopies(block_ids, in));
    if (block_ids.empty()) return absl::OkStatus();
    TANDEM_RETURN_IF_ERROR(CudaStatus(kd::SetDevice(device_), "set device"));
    TANDEM_RETURN_IF_ERROR(copies_out_.OrderBefore(block_ids, stream_, /*host_waits=*/false));
    for (size_t i = 0; i < block_ids.size(); ++i) {
      TANDEM_RETURN_IF_ERROR(
          CudaStatus(kd::CopyAsync(BlockPtr(block_ids[i]), in[i].data(), in[i].size(), stream_),
                     "block copy"));
    }
    return CudaStatus(kd::StreamSynchronize(stream_), "block copies");
  }

  // Beside the steps, on copies_out_'s stream; a later step that writes one
  // of the blocks waits for its copy on the device (Run).
  absl::StatusOr<BlockCopyWait> CopyBlocksToHostAsync(
      std::span<const int32_t> block_ids, std::span<const std::span<std::byte>> out) override {
    TANDEM_RETURN_IF_ERROR(ValidateBlockCopies(block_ids, out));
    TANDEM_RETURN_IF_ERROR(CudaStatus(kd::SetDevice(device_), "set device"));
    return copies_out_.Begin(stream_, device_, cache_.get<std::byte>(), block_bytes(), block_ids,
                             out);
  }

 protected:
  // Shared start of Init: device, cuBLAS, stream. Init then uploads the
  // weights and ends with AllocateCache.
  absl::Status InitCommon() {
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
    TANDEM_RETURN_IF_ERROR(CudaStatus(
        kd::SetBlasStream(blas_, stream_, blas_workspace_.get<void>(), kBlasWorkspace),
        "cuBLAS stream"));
    tensor_core_attention_ = tensor_core_attention_ && opts_.dtype == DType::kBFloat16 &&
                             kd::DeviceHasTensorCoreAttention(device_);
    graphs_enabled_ = graphs_enabled_ && opts_.dtype == DType::kBFloat16;
    return inv_freq_.Upload(c.RopeInverseFrequencies());
  }

  // The zeroed cache, after the weights: num_blocks as given, or (0) what
  // --gpu-memory-utilization leaves (KvBlocksForMemoryUtilization).
  absl::Status AllocateCache() {
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

  absl::Status ReadMemory(int64_t* free_bytes) {
    size_t free = 0, total = 0;
    TANDEM_RETURN_IF_ERROR(CudaStatus(kd::MemGetInfo(&free, &total), "cudaMemGetInfo"));
    *free_bytes = static_cast<int64_t>(free);
    memory_.total = static_cast<int64_t>(total);
    return absl::OkStatus();
  }

  // Grows the step buffers RunLayers uses for T rows and attention over
  // max_context positions (without running anything).
  virtual absl::Status ReserveLayers(int32_t T, int32_t max_context) = 0;
  // Runs the layers of one validated, non-empty batch on stream_.
  virtual absl::Status RunLayers(const BatchLayout& lay, const StepInputs& in, int32_t rows) = 0;

  const ModelRunnerOptions runner_opts_;
  DeviceMemory memory_;  // for gpu_memory_utilization
  KvCacheShape shape_;
  kd::BlasHandle* blas_ = nullptr;
  void* stream_ = nullptr;  // every kernel of a step, and the graphs
  DeviceBuffer cache_, logits_;
  DeviceBuffer inv_freq_;  // RoPE's inverse frequencies, [head_size / 2]

 private:
  // One step: logits_ of the sequences' last rows and, with argmax, their
  // greedy tokens in argmax_. A decode step replays a CUDA graph when
  // graphs are on (decode_graphs.h).
  absl::Status Run(std::span<const SequenceInput> batch, bool argmax, int32_t* rows) {
    TANDEM_RETURN_IF_ERROR(ValidateBatch(batch));
    *rows = static_cast<int32_t>(batch.size());
    if (batch.empty()) return absl::OkStatus();
    TANDEM_RETURN_IF_ERROR(CudaStatus(kd::SetDevice(device_), "set device"));
    if (!copies_out_.empty()) {
      // The float32 mode's kernels run on the legacy stream: the host waits.
      TANDEM_RETURN_IF_ERROR(
          copies_out_.OrderBefore(WrittenBlocks(batch, opts_.block_size), stream_,
                                  /*host_waits=*/opts_.dtype != DType::kBFloat16));
    }
    BatchLayout lay = MakeBatchLayout(batch, opts_.block_size);
    const int32_t bucket = GraphBatchBucket(*rows);
    // A decode batch has no rows beyond its last ones (all_logits adds none
    // for a one-token chunk).
    if (argmax && graphs_enabled_ && bucket > 0 && IsDecodeBatch(batch)) {
      return RunGraph(std::move(lay), bucket);
    }
    const ModelConfig& c = model_->config();
    plan_ = kernels::PlanAttention(lay.row_pos, lay.row_table_offset, c.head_size,
                                   c.num_heads / c.num_kv_heads, tensor_core_attention_);
    StepInputs in;
    in.plan = &plan_;
    TANDEM_RETURN_IF_ERROR(Upload(lay, &in));
    *rows = static_cast<int32_t>(lay.last_rows.size());  // and all_logits rows
    TANDEM_RETURN_IF_ERROR(ReserveOutputs(*rows));
    return RunStep(lay, in, *rows, argmax);
  }

  absl::Status ReserveOutputs(int32_t rows) {
    TANDEM_RETURN_IF_ERROR(
        logits_.Reserve(sizeof(float) * rows * model_->config().vocab_size));
    return argmax_.Reserve(sizeof(int32_t) * rows);
  }

  absl::Status RunStep(const BatchLayout& lay, const StepInputs& in, int32_t rows, bool argmax) {
    TANDEM_RETURN_IF_ERROR(RunLayers(lay, in, rows));
    if (!argmax) return absl::OkStatus();
    return CudaStatus(kd::ArgMaxRows(logits_.get<float>(), rows, model_->config().vocab_size,
                                     argmax_.get<int32_t>(), stream_),
                      "argmax");
  }

  // A decode step of lay.num_rows <= bucket sequences through the graph of
  // (bucket, its splits bucket), captured on first use. Any failure to
  // capture turns graphs off for this runner (logged) and runs the step
  // eagerly with the same inputs.
  absl::Status RunGraph(BatchLayout lay, int32_t bucket) {
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

  std::vector<void*> GraphPointers() const {
    std::vector<void*> p = {inputs_.get<void>(), logits_.get<void>(), argmax_.get<void>()};
    AppendStepBuffers(&p);
    return p;
  }
  // The addresses of the mode's step buffers (GraphPointers).
  virtual void AppendStepBuffers(std::vector<void*>* out) const = 0;

  void DropGraphs() {
    for (auto& [key, exec] : graphs_) kd::GraphDestroy(exec);
    graphs_.clear();
  }

  // Packs the layout into pinned memory and copies it in one transfer.
  absl::Status Upload(const BatchLayout& lay, StepInputs* in) {
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

  std::byte* BlockPtr(int32_t block_id) const {
    return cache_.get<std::byte>() + int64_t{block_id} * block_bytes();
  }

  int32_t device_;
  bool tensor_core_attention_;
  bool graphs_enabled_;
  kernels::AttentionPlan plan_;  // of the step being run
  PinnedBuffer staging_;         // cudaHostAlloc: the upload is one async copy
  DeviceBuffer inputs_, argmax_, blas_workspace_;
  std::map<std::pair<int32_t, int32_t>, void*> graphs_;  // (rows, splits) -> exec
  std::vector<void*> graph_pointers_;  // the buffers' addresses the graphs hold
  int64_t graph_replays_ = 0;
  BlockCopiesOut copies_out_;  // CopyBlocksToHostAsync's
};

struct DeviceLayer {
  DeviceBuffer rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3;
  DeviceBuffer bq, bk, bv, bo, q_norm, k_norm;  // when the config has them
};

// float32: the CPU backend's order of operations.
class CudaF32Runner final : public CudaRunnerBase {
 public:
  using CudaRunnerBase::CudaRunnerBase;

  absl::Status Init() override {
    TANDEM_RETURN_IF_ERROR(InitCommon());
    const Model& m = *model_;
    using K = WeightKind;
    TANDEM_RETURN_IF_ERROR(UploadWeights<float>(m, &embedding_, {K::kEmbedding}, 0));
    TANDEM_RETURN_IF_ERROR(UploadWeights<float>(m, &rms_final_, {K::kRmsFinal}, 0));
    TANDEM_RETURN_IF_ERROR(UploadWeights<float>(m, &classifier_, {K::kClassifier}, 0));
    layers_ = std::vector<DeviceLayer>(static_cast<size_t>(m.config().num_layers));
    for (int32_t i = 0; i < m.config().num_layers; ++i) {
      DeviceLayer& d = layers_[static_cast<size_t>(i)];
      for (auto [buffer, kind] : std::initializer_list<std::pair<DeviceBuffer*, WeightKind>>{
               {&d.rms_att, K::kRmsAtt}, {&d.wq, K::kWq},         {&d.wk, K::kWk},
               {&d.wv, K::kWv},          {&d.wo, K::kWo},         {&d.rms_ffn, K::kRmsFfn},
               {&d.w1, K::kW1},          {&d.w2, K::kW2},         {&d.w3, K::kW3},
               {&d.bq, K::kBq},          {&d.bk, K::kBk},         {&d.bv, K::kBv},
               {&d.bo, K::kBo},          {&d.q_norm, K::kQNorm},  {&d.k_norm, K::kKNorm}}) {
        TANDEM_RETURN_IF_ERROR(UploadWeights<float>(m, buffer, {kind}, i));
      }
    }
    return AllocateCache();
  }

 private:
  absl::Status ReserveLayers(int32_t T, int32_t max_context) override {
    const ModelConfig& c = model_->config();
    const size_t f = sizeof(float), dim = c.dim, kv = c.kv_dim(), hidden = c.hidden_dim,
                 qd = c.q_dim();
    for (DeviceBuffer* b : {&x_, &xb_}) TANDEM_RETURN_IF_ERROR(b->Reserve(T * dim * f));
    for (DeviceBuffer* b : {&q_, &att_}) {
      TANDEM_RETURN_IF_ERROR(b->Reserve(T * std::max(dim, qd) * f));
    }
    for (DeviceBuffer* b : {&k_, &v_}) TANDEM_RETURN_IF_ERROR(b->Reserve(T * kv * f));
    for (DeviceBuffer* b : {&hb_, &hb2_}) TANDEM_RETURN_IF_ERROR(b->Reserve(T * hidden * f));
    return scratch_.Reserve(size_t{1} * T * c.num_heads * max_context * f);
  }

  void AppendStepBuffers(std::vector<void*>* out) const override {
    for (const DeviceBuffer* b : {&x_, &xb_, &q_, &att_, &k_, &v_, &hb_, &hb2_, &scratch_}) {
      out->push_back(b->get<void>());
    }
  }

  // On the legacy default stream (ordered with stream_, which is blocking);
  // decode graphs are a bfloat16 feature.
  absl::Status RunLayers(const BatchLayout& lay, const StepInputs& in, int32_t B) override {
    const ModelConfig& c = model_->config();
    const int32_t T = lay.num_rows;
    const size_t dim = c.dim, hidden = c.hidden_dim;
    TANDEM_RETURN_IF_ERROR(ReserveLayers(T, lay.max_context));
    float *x = x_.get<float>(), *xb = xb_.get<float>(), *q = q_.get<float>(),
          *att = att_.get<float>(), *k = k_.get<float>(), *v = v_.get<float>(),
          *hb = hb_.get<float>(), *hb2 = hb2_.get<float>();
    const RopeKind rope = ToKernel(c.rope_style);
    auto ok = [](int err, const char* what) { return CudaStatus(err, what); };
    TANDEM_RETURN_IF_ERROR(
        ok(kd::EmbeddingGather(embedding_.get<float>(), c.dim, in.tokens, T, x), "embedding"));
    if (c.embedding_scale != 1.0f) {
      TANDEM_RETURN_IF_ERROR(ok(kd::Scale(x, T * dim, c.embedding_scale), "embedding scale"));
    }
    for (int32_t li = 0; li < c.num_layers; ++li) {
      const DeviceLayer& l = layers_[static_cast<size_t>(li)];
      TANDEM_RETURN_IF_ERROR(
          ok(kd::RmsNorm(x, l.rms_att.get<float>(), T, c.dim, c.norm_eps, xb), "rmsnorm"));
      TANDEM_RETURN_IF_ERROR(
          ok(kd::Matmul(blas_, l.wq.get<float>(), c.q_dim(), c.dim, xb, T, q), "wq"));
      TANDEM_RETURN_IF_ERROR(
          ok(kd::Matmul(blas_, l.wk.get<float>(), c.kv_dim(), c.dim, xb, T, k), "wk"));
      TANDEM_RETURN_IF_ERROR(
          ok(kd::Matmul(blas_, l.wv.get<float>(), c.kv_dim(), c.dim, xb, T, v), "wv"));
      if (c.qkv_bias) {
        TANDEM_RETURN_IF_ERROR(
            ok(kd::AddBias(q, l.bq.get<float>(), T, c.q_dim(), c.q_dim()), "q bias"));
        TANDEM_RETURN_IF_ERROR(
            ok(kd::AddBias(k, l.bk.get<float>(), T, c.kv_dim(), c.kv_dim()), "k bias"));
        TANDEM_RETURN_IF_ERROR(
            ok(kd::AddBias(v, l.bv.get<float>(), T, c.kv_dim(), c.kv_dim()), "v bias"));
      }
      if (c.qk_norm) {  // per head, in place, as the CPU backend
        TANDEM_RETURN_IF_ERROR(ok(kd::RmsNorm(q, l.q_norm.get<float>(), T * c.num_heads,
                                              c.head_size, c.norm_eps, q),
                                  "q norm"));
        TANDEM_RETURN_IF_ERROR(ok(kd::RmsNorm(k, l.k_norm.get<float>(), T * c.num_kv_heads,
                                              c.head_size, c.norm_eps, k),
                                  "k norm"));
      }
      const float* inv_freq = inv_freq_.get<float>();
      TANDEM_RETURN_IF_ERROR(
          ok(kd::Rope(q, T, in.row_pos, c.num_heads, c.head_size, rope, c.rope_theta, inv_freq),
             "rope q"));
      TANDEM_RETURN_IF_ERROR(ok(
          kd::Rope(k, T, in.row_pos, c.num_kv_heads, c.head_size, rope, c.rope_theta, inv_freq),
          "rope k"));
      // All K/V of the step before any attention of this layer (same stream).
      TANDEM_RETURN_IF_ERROR(
          ok(kd::KvWrite(cache_.get<float>(), shape_, li, k, v, T, in.slots), "kv write"));
      const PagedAttentionArgs args{.q = q,
                                    .out = att,
                                    .cache = cache_.get<float>(),
                                    .shape = shape_,
                                    .layer = li,
                                    .num_heads = c.num_heads,
                                    .num_rows = T,
                                    .row_pos = in.row_pos,
                                    .row_table_offset = in.row_off,
                                    .block_tables = in.tables};
      TANDEM_RETURN_IF_ERROR(
          ok(kd::PagedAttention(args, scratch_.get<float>(), lay.max_context), "attention"));
      TANDEM_RETURN_IF_ERROR(
          ok(kd::Matmul(blas_, l.wo.get<float>(), c.dim, c.q_dim(), att, T, xb), "wo"));
      if (c.o_bias) {
        TANDEM_RETURN_IF_ERROR(ok(kd::AddBias(xb, l.bo.get<float>(), T, c.dim, c.dim), "o bias"));
      }
      TANDEM_RETURN_IF_ERROR(ok(kd::ResidualAdd(x, xb, T * dim), "residual"));
      TANDEM_RETURN_IF_ERROR(
          ok(kd::RmsNorm(x, l.rms_ffn.get<float>(), T, c.dim, c.norm_eps, xb), "rmsnorm"));
      TANDEM_RETURN_IF_ERROR(
          ok(kd::Matmul(blas_, l.w1.get<float>(), c.hidden_dim, c.dim, xb, T, hb), "w1"));
      TANDEM_RETURN_IF_ERROR(
          ok(kd::Matmul(blas_, l.w3.get<float>(), c.hidden_dim, c.dim, xb, T, hb2), "w3"));
      TANDEM_RETURN_IF_ERROR(
          ok(kd::SiluMul(hb, hb2, T * hidden, hb, ToKernel(c.activation)), "activation"));
      TANDEM_RETURN_IF_ERROR(
          ok(kd::Matmul(blas_, l.w2.get<float>(), c.dim, c.hidden_dim, hb, T, xb), "w2"));
      TANDEM_RETURN_IF_ERROR(ok(kd::ResidualAdd(x, xb, T * dim), "residual"));
    }
    // Last token of each sequence: gather its row (an embedding gather over x).
    TANDEM_RETURN_IF_ERROR(ok(kd::EmbeddingGather(x, c.dim, in.last_rows, B, att), "gather last"));
    TANDEM_RETURN_IF_ERROR(
        ok(kd::RmsNorm(att, rms_final_.get<float>(), B, c.dim, c.norm_eps, xb), "rmsnorm"));
    return ok(kd::Matmul(blas_, classifier_.get<float>(), c.vocab_size, c.dim, xb, B,
                         logits_.get<float>()),
              "classifier");
  }

  DeviceBuffer embedding_, rms_final_, classifier_;
  std::vector<DeviceLayer> layers_;
  DeviceBuffer x_, xb_, q_, att_, k_, v_, hb_, hb2_, scratch_;
};

struct Bf16Layer {
  DeviceBuffer rms_att, wqkv, wo, rms_ffn, w13, w2;
  DeviceBuffer bqkv, bo, q_norm, k_norm;  // fp32, when the config has them
};

// bfloat16: fused GEMMs, split-K attention; see DType.
class CudaBf16Runner final : public CudaRunnerBase {
 public:
  using CudaRunnerBase::CudaRunnerBase;

  absl::Status Init() override {
    TANDEM_RETURN_IF_ERROR(InitCommon());
    const ModelConfig& c = model_->config();
    if (c.head_size > kd::kMaxAttentionHeadSize) {
      return absl::InvalidArgumentError(absl::StrCat("dtype bfloat16: head size ", c.head_size,
                                                     " exceeds the attention kernel's ",
                                                     kd::kMaxAttentionHeadSize));
    }
    // bf16 tensors go from the mapped checkpoint straight to the device;
    // others are converted one at a time.
    const Model& m = *model_;
    using K = WeightKind;
    TANDEM_RETURN_IF_ERROR(UploadWeights<kd::Bf16>(m, &embedding_, {K::kEmbedding}, 0));
    TANDEM_RETURN_IF_ERROR(UploadWeights<float>(m, &rms_final_, {K::kRmsFinal}, 0));
    TANDEM_RETURN_IF_ERROR(UploadWeights<kd::Bf16>(m, &classifier_, {K::kClassifier}, 0));
    layers_ = std::vector<Bf16Layer>(static_cast<size_t>(c.num_layers));
    for (int32_t i = 0; i < c.num_layers; ++i) {
      Bf16Layer& d = layers_[static_cast<size_t>(i)];
      TANDEM_RETURN_IF_ERROR(UploadWeights<float>(m, &d.rms_att, {K::kRmsAtt}, i));
      TANDEM_RETURN_IF_ERROR(UploadWeights<kd::Bf16>(m, &d.wqkv, {K::kWq, K::kWk, K::kWv}, i));
      TANDEM_RETURN_IF_ERROR(UploadWeights<kd::Bf16>(m, &d.wo, {K::kWo}, i));
      TANDEM_RETURN_IF_ERROR(UploadWeights<float>(m, &d.rms_ffn, {K::kRmsFfn}, i));
      TANDEM_RETURN_IF_ERROR(UploadWeights<kd::Bf16>(m, &d.w13, {K::kW1, K::kW3}, i));
      TANDEM_RETURN_IF_ERROR(UploadWeights<kd::Bf16>(m, &d.w2, {K::kW2}, i));
      TANDEM_RETURN_IF_ERROR(UploadWeights<float>(m, &d.bqkv, {K::kBq, K::kBk, K::kBv}, i));
      TANDEM_RETURN_IF_ERROR(UploadWeights<float>(m, &d.bo, {K::kBo}, i));
      TANDEM_RETURN_IF_ERROR(UploadWeights<float>(m, &d.q_norm, {K::kQNorm}, i));
      TANDEM_RETURN_IF_ERROR(UploadWeights<float>(m, &d.k_norm, {K::kKNorm}, i));
    }
    return AllocateCache();
  }

 private:
  absl::Status ReserveLayers(int32_t T, int32_t max_context) override {
    const ModelConfig& c = model_->config();
    const int32_t qd = c.q_dim();
    const int32_t qkv_width = qd + 2 * c.kv_dim();
    const size_t f = sizeof(float), h = sizeof(kd::Bf16);
    TANDEM_RETURN_IF_ERROR(x_.Reserve(f * T * c.dim));
    TANDEM_RETURN_IF_ERROR(xn_.Reserve(h * T * std::max(c.dim, c.hidden_dim)));
    TANDEM_RETURN_IF_ERROR(qkv_.Reserve(f * T * std::max(qkv_width, 2 * c.hidden_dim)));
    TANDEM_RETURN_IF_ERROR(att_.Reserve(h * T * qd));
    return scratch_.Reserve(
        f * std::max<int64_t>(1, kd::AttentionScratchFloats(T, c.num_heads, c.head_size,
                                                            max_context)));
  }

  void AppendStepBuffers(std::vector<void*>* out) const override {
    for (const DeviceBuffer* b : {&x_, &xn_, &qkv_, &att_, &scratch_}) out->push_back(b->get<void>());
  }

  absl::Status RunLayers(const BatchLayout& lay, const StepInputs& in, int32_t B) override {
    const ModelConfig& c = model_->config();
    const int32_t T = lay.num_rows;
    const int32_t qd = c.q_dim();
    const int32_t qkv_width = qd + 2 * c.kv_dim();
    TANDEM_RETURN_IF_ERROR(ReserveLayers(T, in.plan->single_max_context));
    void* const st = stream_;
    float* x = x_.get<float>();
    float* qkv = qkv_.get<float>();  // also the gate/up output
    kd::Bf16* xn = xn_.get<kd::Bf16>();
    kd::Bf16* att = att_.get<kd::Bf16>();
    kd::Bf16* cache = cache_.get<kd::Bf16>();
    const RopeKind rope = ToKernel(c.rope_style);
    auto ok = [](int err, const char* what) { return CudaStatus(err, what); };
    TANDEM_RETURN_IF_ERROR(ok(
        kd::EmbeddingGatherBf16(embedding_.get<kd::Bf16>(), c.dim, in.tokens, T, x, st),
        "embedding"));
    if (c.embedding_scale != 1.0f) {
      TANDEM_RETURN_IF_ERROR(
          ok(kd::Scale(x, int64_t{T} * c.dim, c.embedding_scale, st), "embedding scale"));
    }
    for (int32_t li = 0; li < c.num_layers; ++li) {
      const Bf16Layer& l = layers_[static_cast<size_t>(li)];
      TANDEM_RETURN_IF_ERROR(ok(kd::RmsNormBf16(x, nullptr, l.rms_att.get<float>(), T, c.dim,
                                                c.norm_eps, xn, st),
                                "rmsnorm"));
      TANDEM_RETURN_IF_ERROR(ok(
          kd::MatmulBf16(blas_, l.wqkv.get<kd::Bf16>(), qkv_width, c.dim, xn, T, qkv, 0.0f),
          "wqkv"));
      if (c.qkv_bias) {
        TANDEM_RETURN_IF_ERROR(
            ok(kd::AddBias(qkv, l.bqkv.get<float>(), T, qkv_width, qkv_width, st), "qkv bias"));
      }
      if (c.qk_norm) {
        TANDEM_RETURN_IF_ERROR(ok(kd::HeadRmsNorm(qkv, l.q_norm.get<float>(), T, c.num_heads,
                                                  c.head_size, qkv_width, c.norm_eps, st),
                                  "q norm"));
        TANDEM_RETURN_IF_ERROR(ok(kd::HeadRmsNorm(qkv + qd, l.k_norm.get<float>(), T,
                                                  c.num_kv_heads, c.head_size, qkv_width,
                                                  c.norm_eps, st),
                                  "k norm"));
      }
      // All K/V of the step before any attention of this layer (same stream).
      TANDEM_RETURN_IF_ERROR(ok(kd::RopeKvWriteBf16(qkv, qkv_width, T, in.row_pos, c.num_heads,
                                                    shape_, rope, c.rope_theta, cache, li,
                                                    in.slots, st, inv_freq_.get<float>()),
                                "rope + kv write"));
      const kd::Bf16AttentionArgs args{.q = qkv,
                                       .q_stride = qkv_width,
                                       .out = att,
                                       .cache = cache,
                                       .shape = shape_,
                                       .layer = li,
                                       .num_heads = c.num_heads,
                                       .num_rows = in.plan->num_single_rows(),
                                       .row_pos = in.row_pos,
                                       .row_table_offset = in.row_off,
                                       .block_tables = in.tables,
                                       .rows = in.single_rows};
      TANDEM_RETURN_IF_ERROR(ok(
          kd::PrefillAttentionBf16(args, in.tiles, in.plan->num_tiles(), st),
          "prefill attention"));
      TANDEM_RETURN_IF_ERROR(ok(kd::PagedAttentionBf16(args, in.plan->single_max_context,
                                                       scratch_.get<float>(), st),
                                "attention"));
      // x += att * Wo^T: the residual add is the GEMM's beta = 1.
      TANDEM_RETURN_IF_ERROR(
          ok(kd::MatmulBf16(blas_, l.wo.get<kd::Bf16>(), c.dim, qd, att, T, x, 1.0f), "wo"));
      if (c.o_bias) {
        TANDEM_RETURN_IF_ERROR(ok(kd::AddBias(x, l.bo.get<float>(), T, c.dim, c.dim, st), "o bias"));
      }
      TANDEM_RETURN_IF_ERROR(ok(kd::RmsNormBf16(x, nullptr, l.rms_ffn.get<float>(), T, c.dim,
                                                c.norm_eps, xn, st),
                                "rmsnorm"));
      TANDEM_RETURN_IF_ERROR(ok(
          kd::MatmulBf16(blas_, l.w13.get<kd::Bf16>(), 2 * c.hidden_dim, c.dim, xn, T, qkv, 0.0f),
          "w13"));
      TANDEM_RETURN_IF_ERROR(ok(
          kd::SiluMulBf16(qkv, T, c.hidden_dim, xn, st, ToKernel(c.activation)),
          "activation"));
      TANDEM_RETURN_IF_ERROR(ok(
          kd::MatmulBf16(blas_, l.w2.get<kd::Bf16>(), c.dim, c.hidden_dim, xn, T, x, 1.0f), "w2"));
    }
    TANDEM_RETURN_IF_ERROR(ok(kd::RmsNormBf16(x, in.last_rows, rms_final_.get<float>(), B, c.dim,
                                              c.norm_eps, xn, st),
                              "rmsnorm"));
    return ok(kd::MatmulBf16(blas_, classifier_.get<kd::Bf16>(), c.vocab_size, c.dim, xn, B,
                             logits_.get<float>(), 0.0f),
              "classifier");
  }

  DeviceBuffer embedding_, rms_final_, classifier_;
  std::vector<Bf16Layer> layers_;
  DeviceBuffer x_, xn_, qkv_, att_, scratch_;
};

}  // namespace

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
    runner = std::make_unique<CudaBf16Runner>(model, opts, runner_opts);
  } else {
    runner = std::make_unique<CudaF32Runner>(model, opts, runner_opts);
  }
  TANDEM_RETURN_IF_ERROR(runner->Init());
  return std::unique_ptr<ModelRunner>(std::move(runner));
}

}  // namespace tandem::model::internal
