#include "tandem/sched/scheduler.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tandem/common/logging.h"
#include "tandem/common/status.h"
#include "tandem/grammar/json_schema.h"
#include "tandem/sched/preemption.h"
#include "tandem/sched/request_id.h"

namespace tandem::sched {
namespace {

const SchedulerConfig& Checked(const SchedulerConfig& config) {
  absl::Status s = config.Validate();
  TANDEM_CHECK(s.ok()) << std::string(s.message());
  return config;
}

absl::string_view AsAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace

Scheduler::Scheduler(SchedulerConfig config, KvConnectorScheduler* connector)
    : config_(Checked(config)),
      connector_(connector),
      kv_(config_.num_gpu_blocks, config_.block_size, config_.enable_prefix_caching),
      waiting_(config_.policy) {}

Scheduler::~Scheduler() = default;

Request* Scheduler::NewRequest() {
  if (free_slots_.empty()) {
    return &slab_.emplace_back();
  }
  Request* r = free_slots_.back();
  free_slots_.pop_back();
  // Keep the epoch: stale in-flight entries naming this slot must not match.
  const uint64_t epoch = r->epoch + 1;
  std::vector<int32_t> tokens = std::move(r->all_token_ids);
  std::vector<BlockHash> hashes = std::move(r->block_hashes);
  std::vector<int32_t> blocks = std::move(r->block_ids);
  *r = Request{};
  r->epoch = epoch;
  r->all_token_ids = std::move(tokens);
  r->all_token_ids.clear();
  r->block_hashes = std::move(hashes);
  r->block_hashes.clear();
  r->block_ids = std::move(blocks);
  r->block_ids.clear();
  return r;
}

void Scheduler::ReleaseRequest(Request* request) {
  ++request->epoch;
  free_slots_.push_back(request);
}

absl::Status Scheduler::ValidateRequest(const RequestSpec& spec, const SchedulerConfig& config,
                                        int32_t num_total_blocks) {
  // The one validation of a request's content (the services only convert);
  // the messages name the GenerateRequest's fields.
  TANDEM_RETURN_IF_ERROR(ValidateRequestId(spec.request_id));
  // vLLM refuses a priority it would not honour.
  if (spec.priority != 0 && config.policy != SchedulingPolicy::kPriority) {
    return absl::InvalidArgumentError(absl::StrCat(
        "priority = ", spec.priority,
        " but priority scheduling is not enabled (the scheduler runs --scheduling-policy fcfs)"));
  }
  if (spec.prompt_token_ids.empty()) {
    return absl::InvalidArgumentError(
        "prompt_token_ids is empty; a prompt needs at least one token");
  }
  const std::string vocab_range =
      absl::StrCat("[0, ", config.vocab_size > 0 ? absl::StrCat(config.vocab_size) : "inf", ")");
  for (size_t i = 0; i < spec.prompt_token_ids.size(); ++i) {
    const int32_t t = spec.prompt_token_ids[i];
    if (t < 0 || (config.vocab_size > 0 && t >= config.vocab_size)) {
      return absl::InvalidArgumentError(absl::StrCat("prompt_token_ids[", i, "] = ", t,
                                                     " is outside the vocabulary ", vocab_range));
    }
  }
  if (absl::Status s = spec.sampling.Validate(
          config.vocab_size > 0 ? config.vocab_size : std::numeric_limits<int32_t>::max());
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("sampling: ", s.message()));
  }
  if (spec.sampling.HasGrammar() && !config.structured_outputs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sampling: ", spec.sampling.GrammarField(),
        " (structured outputs) needs the model's tokenizer on the worker, and this scheduler's "
        "worker has none (tandem-worker --tokenizer)"));
  }
  if (spec.sampling.HasGrammar()) {
    // Kept: the gRPC handler compiled it as the request arrived
    // (Engine::Submit), so the engine loop does not.
    if (auto compiled = grammar::CompileGrammarKept(spec.sampling); !compiled.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("sampling: ", compiled.status().message()));
    }
  }
  for (auto [name, n] : {std::pair{"logprobs", spec.sampling.logprobs},
                         std::pair{"prompt_logprobs", spec.sampling.prompt_logprobs}}) {
    if (n > config.max_logprobs) {
      return absl::InvalidArgumentError(absl::StrCat("sampling: ", name, " = ", n,
                                                     " exceeds the server's max_logprobs ",
                                                     config.max_logprobs));
    }
  }
  for (const int32_t t : spec.resumed_output_token_ids) {
    if (t < 0 || (config.vocab_size > 0 && t >= config.vocab_size)) {
      return absl::InvalidArgumentError(
          absl::StrCat("resumed output token id ", t, " is outside the vocabulary"));
    }
  }
  if (static_cast<int64_t>(spec.resumed_output_token_ids.size()) >= spec.sampling.max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a resumed request with ", spec.resumed_output_token_ids.size(),
        " output tokens has nothing left to generate (max_tokens ", spec.sampling.max_tokens, ")"));
  }
  const int64_t total =
      static_cast<int64_t>(spec.prompt_token_ids.size()) + spec.sampling.max_tokens;
  if (total > config.max_model_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt (", spec.prompt_token_ids.size(), " tokens) + max_tokens (",
        spec.sampling.max_tokens, ") = ", total, " exceeds max_model_len ", config.max_model_len));
  }
  // The KV of prompt + max_tokens - 1 tokens must fit the pool on its own.
  const int32_t blocks_needed = CeilDiv(static_cast<int32_t>(total) - 1, config.block_size);
  if (blocks_needed > num_total_blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request needs up to ", blocks_needed, " KV blocks but the pool has ", num_total_blocks));
  }
  return absl::OkStatus();
}

absl::Status Scheduler::AddRequest(RequestSpec spec, int64_t arrival_time_ns, bool resumed) {
  TANDEM_RETURN_IF_ERROR(ValidateRequest(spec, config_, num_total_blocks()));
  const int64_t total =
      static_cast<int64_t>(spec.prompt_token_ids.size()) + spec.sampling.max_tokens;
  const int32_t blocks_needed = CeilDiv(static_cast<int32_t>(total) - 1, config_.block_size);
  if (live_.contains(spec.request_id)) {
    return absl::AlreadyExistsError(
        absl::StrCat("request id \"", spec.request_id, "\" is already in use"));
  }
  if (auto it = held_.find(spec.request_id); it != held_.end()) {
    return absl::AlreadyExistsError(absl::StrCat(
        "request id \"", spec.request_id,
        "\" is still in use: the worker has not yet reported the KV ",
        it->second->awaiting_recv ? "load" : "store", " of the finished request with that id"));
  }
  if (!resumed && num_waiting() >= config_.max_waiting_requests) {
    return absl::ResourceExhaustedError(
        absl::StrCat("waiting queue is full (", config_.max_waiting_requests, " requests)"));
  }

  Request* r = NewRequest();
  r->request_id = std::move(spec.request_id);
  r->sampling = std::move(spec.sampling);
  r->priority = spec.priority;
  r->arrival_time_ns = arrival_time_ns;
  r->arrival_seq = next_arrival_seq_++;
  r->all_token_ids = std::move(spec.prompt_token_ids);
  r->num_prompt_tokens = r->num_tokens();
  r->all_token_ids.insert(r->all_token_ids.end(), spec.resumed_output_token_ids.begin(),
                          spec.resumed_output_token_ids.end());
  r->num_resumed_output_tokens = static_cast<int32_t>(spec.resumed_output_token_ids.size());
  // Grown once: no reallocation on the hot path (total <= max_model_len).
  r->all_token_ids.reserve(static_cast<size_t>(total));
  r->block_ids.reserve(static_cast<size_t>(blocks_needed));
  r->block_hashes.reserve(static_cast<size_t>(total / config_.block_size));
  r->state = RequestState::kWaiting;
  HashRootParams root = config_.hash_root;
  root.cache_salt = std::move(spec.cache_salt);
  r->root_hash = ComputeRootHash(root);
  if (config_.enable_prefix_caching || connector_ != nullptr) {
    ExtendBlockHashes(r->root_hash, r->all_token_ids, config_.block_size, &r->block_hashes);
  }
  live_.emplace(r->request_id, r);
  waiting_.Add(r);
  return absl::OkStatus();
}

SchedulerOutput Scheduler::Schedule() {
  SchedulerOutput out;
  ScheduleInto(&out);
  return out;
}

const char* PreemptionReasonName(PreemptionReason reason) {
  switch (reason) {
    case PreemptionReason::kKvCacheFull:
      return "kv_cache_full";
    case PreemptionReason::kStepFailed:
      return "step_failed";
    case PreemptionReason::kWorkerLost:
      return "worker_lost";
  }
  return "unknown";
}

const char* AdmissionLimitName(AdmissionLimit limit) {
  switch (limit) {
    case AdmissionLimit::kMaxNumSeqs:
      return "max_num_seqs";
    case AdmissionLimit::kTokenBudget:
      return "token_budget";
    case AdmissionLimit::kKvBlocks:
      return "kv_blocks";
    case AdmissionLimit::kAsyncLoadGate:
      return "async_load_gate";
  }
  return "unknown";
}

void Scheduler::Preempt(Request* victim, const Request* preemptor, PreemptionReason reason) {
  const bool was_running = victim->state == RequestState::kRunning;
  if (!was_running) {
    TANDEM_CHECK(HoldsLoadedKv(*victim)) << victim->request_id << " is not preemptable";
    --num_loaded_;  // keeps its place in the queue
  }
  preemption_events_.push_back(
      PreemptionEvent{.victim_id = victim->request_id,
                      .preemptor_id = preemptor != nullptr ? preemptor->request_id : std::string(),
                      .reason = reason,
                      .num_computed_tokens = victim->num_computed_tokens});
  stats_.num_recomputed_tokens += static_cast<uint64_t>(victim->num_computed_tokens);
  kv_.FreeBlocks(victim);
  victim->state = RequestState::kPreempted;
  victim->num_computed_tokens = 0;
  victim->num_output_placeholders = 0;
  victim->num_in_flight_tokens = 0;
  victim->resumed_pending = true;
  ++victim->epoch;  // drop its output still in flight
  ++victim->num_preemptions;
  if (was_running) waiting_.AddPreempted(victim);
  if (victim->known_to_worker) preempted_.push_back(victim);
  ++stats_.num_preemptions_total;
  ++stats_.num_preemptions_by_reason[static_cast<int>(reason)];
}

bool Scheduler::KeepsBlocksBefore(const Request& a, const Request& b) const {
  return config_.policy == SchedulingPolicy::kPriority ? PriorityPreemptionOrder{}(a, b)
                                                       : FcfsPreemptionOrder{}(a, b);
}

Scheduler::Victim Scheduler::PickVictim(const Request* r) const {
  Victim v;
  auto consider = [&](Request* c, bool running, size_t index) {
    if (v.request == nullptr || KeepsBlocksBefore(*v.request, *c)) {
      v = Victim{.request = c, .running = running, .index = index};
    }
  };
  for (size_t i = 0; i < running_.size(); ++i) consider(running_[i], true, i);
  if (num_loaded_ > 0) {
    for (Request* w : waiting_) {
      if (HoldsLoadedKv(*w)) consider(w, false, 0);
    }
  }
  if (v.request != r) return v;
  // Nobody after r: wait when blocks come back by themselves.
  for (const auto& [id, h] : held_) {
    if (!h->block_ids.empty()) return Victim{};
  }
  if (num_loading_ > 0) {
    for (const Request* w : waiting_) {
      if (w->state == RequestState::kWaitingForRemoteKv && KeepsBlocksBefore(*r, *w)) {
        return Victim{};
      }
    }
  }
  return v;  // r itself
}

bool Scheduler::LocalCacheHoldsWholePrompt(const Request& r, const PrefixHit& hit) const {
  const int32_t bs = config_.block_size;
  const size_t num_hit = hit.block_ids.size();
  return r.num_tokens() % bs == 0 && static_cast<int32_t>(num_hit + 1) * bs == r.num_tokens() &&
         num_hit < r.block_hashes.size() && kv_.pool().Lookup(r.block_hashes[num_hit]).has_value();
}

bool Scheduler::LoadGateAllows(const Request& request, const PrefixHit& hit) const {
  // Blocks still to be allocated by prefills in progress and by the rest of
  // the prompts of waiting requests that hold a load, running or finished.
  // So the loads' whole prompts stay within the pool: once nothing runs,
  // every finished load fits (and is admitted first).
  int32_t reserved = 0;
  for (const Request* r : running_) {
    if (r->num_computed_tokens < r->num_tokens()) {
      reserved += kv_.NumBlocksToCover(*r, r->num_tokens() + r->num_output_placeholders);
    }
  }
  for (const Request* r : waiting_) {
    if (!r->block_ids.empty()) reserved += kv_.NumBlocksToCover(*r, r->num_tokens());
  }
  const SlotRequest whole_prompt{.num_new_tokens = request.num_tokens() - hit.num_tokens,
                                 .hit = &hit};
  return kv_.pool().num_free_blocks() - reserved >= kv_.NumFreeBlocksNeeded(request, whole_prompt);
}

Scheduler::Admit Scheduler::TryAdmit(Request* r, int32_t* token_budget) {
  if (r->state == RequestState::kWaitingForRemoteKv) return Admit::kSkip;
  const bool fresh = r->block_ids.empty();  // new or preempted; else its load finished
  PrefixHit& hit = hit_scratch_;
  hit.block_ids.clear();
  hit.num_tokens = 0;
  int32_t num_external = 0;
  // A request that scores its prompt computes all of it.
  if (fresh && !r->needs_prompt_logprobs()) {
    hit = kv_.FindPrefixHit(*r);
    if (connector_ != nullptr && !LocalCacheHoldsWholePrompt(*r, hit)) {
      std::optional<ExternalMatch> m = connector_->GetNumNewMatchedTokens(*r, hit.num_tokens);
      if (!m) return Admit::kDeferred;
      num_external = std::clamp(m->num_external_tokens, 0, r->num_tokens() - hit.num_tokens);
      num_external -= num_external % config_.block_size;
    }
  }

  if (num_external > 0) {  // async load
    if (!LoadGateAllows(*r, hit)) return Admit::kLoadGated;
    const SlotRequest slots{.hit = &hit, .num_external_tokens = num_external};
    if (!kv_.CanAllocateSlots(*r, slots)) return Admit::kNoBlocks;
    const int32_t first = kv_.AllocateSlots(r, slots);
    r->num_computed_tokens = hit.num_tokens;
    r->num_pending_external_tokens = num_external;
    r->load_first_block = first;
    r->load_num_blocks = num_external / config_.block_size;
    r->load_num_valid_blocks = r->load_num_blocks;
    NoteCachedTokens(r, hit.num_tokens, 0);
    r->state = RequestState::kWaitingForRemoteKv;
    ++num_loading_;
    stats_.prefix_cache_queries_tokens += static_cast<uint64_t>(r->num_tokens());
    stats_.prefix_cache_hits_tokens += static_cast<uint64_t>(hit.num_tokens);
    stats_.external_cache_queries_tokens += static_cast<uint64_t>(r->num_tokens() - hit.num_tokens);
    stats_.external_cache_hits_tokens += static_cast<uint64_t>(num_external);
    connector_->UpdateStateAfterAlloc(
        *r, std::span<const int32_t>(r->block_ids).subspan(first, r->load_num_blocks),
        num_external);
    if (config_.limit_async_load_admission) *token_budget -= std::min(num_external, *token_budget);
    return Admit::kSkip;  // keeps its place until the load is reported
  }

  int32_t n = r->num_tokens() - r->num_computed_tokens - hit.num_tokens;
  if (config_.long_prefill_token_threshold > 0) {
    n = std::min(n, config_.long_prefill_token_threshold);
  }
  if (!config_.enable_chunked_prefill && n > *token_budget) return Admit::kStop;
  n = std::min(n, *token_budget);
  const SlotRequest slots{.num_new_tokens = n, .hit = fresh ? &hit : nullptr};
  if (!kv_.CanAllocateSlots(*r, slots)) return Admit::kNoBlocks;
  kv_.AllocateSlots(r, slots);
  if (fresh) {
    r->num_computed_tokens = hit.num_tokens;
    NoteCachedTokens(r, hit.num_tokens, 0);
    stats_.prefix_cache_queries_tokens += static_cast<uint64_t>(r->num_tokens());
    stats_.prefix_cache_hits_tokens += static_cast<uint64_t>(hit.num_tokens);
    if (connector_ != nullptr) {
      stats_.external_cache_queries_tokens +=
          static_cast<uint64_t>(r->num_tokens() - hit.num_tokens);
      connector_->UpdateStateAfterAlloc(*r, {}, 0);
    }
  } else {
    --num_loaded_;  // its load finished
  }
  r->state = RequestState::kRunning;
  r->admit_seq = next_admit_seq_++;
  running_.push_back(r);
  const bool will_sample = r->num_computed_tokens + n == r->num_tokens();
  scheduled_.push_back(StepEntry{r, r->epoch, n, will_sample});
  // No preemption can follow in this step, so the blocks this step computes
  // can be published now: a later request of the same step shares them.
  kv_.CacheBlocks(r, r->num_computed_tokens + n, &published_);
  *token_budget -= n;
  return Admit::kAdmitted;
}

void Scheduler::ScheduleInto(SchedulerOutput* out) {
  TANDEM_CHECK_LT(in_flight_.size(), config_.async_scheduling ? 2u : 1u)
      << "too many steps in flight: call UpdateFromOutput first";
  scheduled_.clear();
  published_.clear();
  preemption_events_.clear();
  StepBudget budget{.token_budget = config_.max_num_batched_tokens};
  ScheduleRunning(&budget);
  const int32_t num_deferred = AdmitWaiting(&budget);
  StepRecord record = BuildStepOutput(out);
  AdvanceCounters(record);
  const int32_t total = out->total_num_scheduled_tokens;
  in_flight_.push_back(std::move(record));
  ComputeStats(total, budget.num_preempted, num_deferred);
}

// Running requests first, in admission order: each gets its next chunk if
// blocks allow, preempting by the policy when they do not.
void Scheduler::ScheduleRunning(StepBudget* budget) {
  int32_t& token_budget = budget->token_budget;
  int32_t& num_preempted = budget->num_preempted;
  bool& short_of_blocks = budget->short_of_blocks;
  for (size_t i = 0; i < running_.size() && token_budget > 0;) {
    if (i + 8 < running_.size()) __builtin_prefetch(running_[i + 8]);
    Request* r = running_[i];
    int32_t n = r->num_tokens() + r->num_output_placeholders - r->num_computed_tokens;
    if (config_.long_prefill_token_threshold > 0) {
      n = std::min(n, config_.long_prefill_token_threshold);
    }
    n = std::min({n, token_budget, config_.max_model_len - 1 - r->num_computed_tokens});
    // Async: steps in flight already reach max_tokens (or max_model_len).
    if (r->num_output_placeholders > 0 &&
        (r->num_output_tokens() + r->num_output_placeholders >= r->sampling.max_tokens ||
         r->num_tokens() + r->num_output_placeholders >= config_.max_model_len)) {
      n = 0;
    }
    if (n <= 0) {  // nothing to do now; never blocks the ones after it
      ++i;
      continue;
    }
    const SlotRequest slots{.num_new_tokens = n};
    bool preempted_self = false;
    bool wait = false;
    while (!kv_.CanAllocateSlots(*r, slots)) {
      const Victim v = PickVictim(r);
      if (v.request == nullptr) {
        wait = true;
        break;
      }
      Request* victim = v.request;
      if (v.running) {
        if (v.index < i) {  // already scheduled in this step: take it back
          auto it = std::find_if(scheduled_.begin(), scheduled_.end(),
                                 [victim](const StepEntry& e) { return e.request == victim; });
          if (it != scheduled_.end()) {
            token_budget += it->num_scheduled_tokens;
            scheduled_.erase(it);
          }
          --i;
        }
        running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(v.index));
      }
      Preempt(victim, r, PreemptionReason::kKvCacheFull);
      ++num_preempted;
      if (victim == r) {
        preempted_self = true;
        break;
      }
    }
    if (preempted_self) break;
    if (wait) {  // rule 2: no admission either in this step
      short_of_blocks = true;
      ++i;
      continue;
    }
    kv_.AllocateSlots(r, slots);
    const bool will_sample =
        r->num_computed_tokens + n == r->num_tokens() + r->num_output_placeholders;
    scheduled_.push_back(StepEntry{r, r->epoch, n, will_sample});
    token_budget -= n;
    ++i;
  }
  // Published only now: a request scheduled above may have been preempted
  // (and its step taken back) by a later one.
  for (const StepEntry& e : scheduled_) {
    kv_.CacheBlocks(e.request, e.request->num_computed_tokens + e.num_scheduled_tokens,
                    &published_);
  }
}

// Waiting requests, only if nothing was preempted and no running request
// waits for blocks. Returns how many wait for a KV-store lookup.
int32_t Scheduler::AdmitWaiting(StepBudget* budget) {
  int32_t& token_budget = budget->token_budget;
  const int32_t num_preempted = budget->num_preempted;
  const bool short_of_blocks = budget->short_of_blocks;
  // Requests whose async load has finished go first, in queue order: they
  // hold blocks that only their admission frees, so a request ahead of them
  // must not keep them waiting while it waits for blocks (maybe theirs).
  // Then the others in queue order, until one does not fit.
  int32_t num_deferred = 0;
  std::optional<AdmissionLimit> blocked_by;
  if ((num_preempted > 0 || short_of_blocks) && !waiting_.empty()) {
    blocked_by = AdmissionLimit::kKvBlocks;
  }
  if (num_preempted == 0 && !short_of_blocks && !waiting_.empty()) {
    admitted_mask_.assign(waiting_.size(), false);
    bool any_admitted = false;
    bool stop = false;
    for (int pass = num_loaded_ > 0 ? 0 : 1; pass < 2 && !stop; ++pass) {
      const bool loaded_pass = pass == 0;
      int32_t num_loaded_left = num_loaded_;
      for (size_t w = 0; w < waiting_.size() && token_budget > 0; ++w) {
        Request* r = waiting_[w];
        if (admitted_mask_[w] || HoldsLoadedKv(*r) != loaded_pass) continue;
        const int32_t num_seqs =
            num_running() + (config_.limit_async_load_admission ? num_loading_ : 0);
        if (num_seqs >= config_.max_num_seqs) {
          blocked_by = num_running() >= config_.max_num_seqs ? AdmissionLimit::kMaxNumSeqs
                                                             : AdmissionLimit::kAsyncLoadGate;
          stop = true;
          break;
        }
        const Admit a = TryAdmit(r, &token_budget);
        const bool out_of_blocks = a == Admit::kNoBlocks || a == Admit::kLoadGated;
        if (a == Admit::kStop || (out_of_blocks && !loaded_pass)) {
          blocked_by = a == Admit::kStop       ? AdmissionLimit::kTokenBudget
                       : a == Admit::kNoBlocks ? AdmissionLimit::kKvBlocks
                                               : AdmissionLimit::kAsyncLoadGate;
          stop = true;
          break;
        }
        if (a == Admit::kAdmitted) {
          admitted_mask_[w] = true;
          any_admitted = true;
          ++stats_.num_requests_admitted;
        }
        num_deferred += a == Admit::kDeferred ? 1 : 0;
        if (loaded_pass && --num_loaded_left == 0) break;
      }
    }
    if (any_admitted) waiting_.RemoveMarked(admitted_mask_);
    // Ran out of budget with requests left that could have been admitted.
    if (!blocked_by && token_budget <= 0 && num_waiting() > num_loading_ + num_deferred) {
      blocked_by = AdmissionLimit::kTokenBudget;
    }
  }
  if (blocked_by) ++stats_.num_admission_blocked_steps[static_cast<int>(*blocked_by)];
  return num_deferred;
}

// Then the counters advance: the scheduled tokens count as computed (and,
// async, a sampled token as a placeholder) from now on.
void Scheduler::AdvanceCounters(const StepRecord& record) {
  for (const StepEntry& e : record.entries) {
    Request* r = e.request;
    r->num_computed_tokens += e.num_scheduled_tokens;
    r->num_in_flight_tokens += e.num_scheduled_tokens;
    if (config_.async_scheduling && e.will_sample) ++r->num_output_placeholders;
  }
}

void Scheduler::ComputeStats(int32_t num_scheduled_tokens, int32_t num_preempted,
                             int32_t num_deferred) {
  ++stats_.num_steps;
  stats_.num_running = num_running();
  stats_.num_waiting = num_waiting();
  stats_.num_waiting_for_load = num_loading_;
  stats_.num_waiting_for_lookup = num_deferred;
  stats_.num_waiting_for_capacity = stats_.num_waiting - num_loading_ - num_deferred;
  stats_.num_scheduled_tokens = num_scheduled_tokens;
  stats_.num_preemptions_step = num_preempted;
  stats_.kv_cache_usage = kv_.pool().usage();
  stats_.num_free_blocks = kv_.pool().num_free_blocks();
}

std::optional<RequestOutput> Scheduler::AbortRequest(std::string_view request_id) {
  auto it = live_.find(AsAbsl(request_id));
  if (it == live_.end()) return std::nullopt;
  Request* r = it->second;
  if (r->state == RequestState::kRunning) {
    running_.erase(std::find(running_.begin(), running_.end(), r));
  } else {
    waiting_.Remove(r);
  }
  RequestOutput o;
  o.request_id = r->request_id;
  o.finished = RequestState::kFinishedAborted;
  o.num_prompt_tokens = r->num_prompt_tokens;
  o.num_output_tokens = r->num_output_tokens();
  o.num_cached_tokens_local = r->num_cached_tokens_local;
  o.num_cached_tokens_external = r->num_cached_tokens_external;
  Finish(r, RequestState::kFinishedAborted);
  return o;
}

bool Scheduler::HasUnfinishedRequests() const {
  return !waiting_.empty() || !running_.empty() || !pending_finished_ids_.empty() || !held_.empty();
}

const Request* Scheduler::FindRequest(std::string_view request_id) const {
  auto it = live_.find(AsAbsl(request_id));
  if (it != live_.end()) return it->second;
  auto h = held_.find(AsAbsl(request_id));
  return h != held_.end() ? h->second : nullptr;
}

}  // namespace tandem::sched
