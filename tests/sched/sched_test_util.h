// Test doubles for the scheduler core: a fake worker that models the KV cache
// slot by slot (so a wrong block table, a bad prefix hit or a bad load changes
// the sampled tokens), a fake KV-store, a scripted scheduler-role connector,
// an engine-loop harness for sync and async mode, and an independent
// reference of what each request must produce when run alone.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tandem/sched/kv_connector.h"
#include "tandem/sched/scheduler.h"

namespace tandem::sched::testing {

inline constexpr int32_t kEos = 1;
// Extra EOS ids (SchedulerConfig::extra_eos_token_ids) for the tests that set
// them; Tokens() never produces them.
inline constexpr int32_t kEos2 = 62;
inline constexpr int32_t kEos3 = 63;

// How often one request may be preempted by the same other request, which
// the randomized tests assert. The progress rules of scheduler.h guarantee
// that every workload drains; this bound is measured, not proven: a
// request preempted by X comes back when other requests free blocks, and X
// may preempt it again (vLLM's behaviour too). Over 200000 seeds per mode
// the randomized workloads (up to 12 requests) peak at 5, the warm-store
// ones (2-3 requests) at 3; the livelock the progress rules removed
// preempted the same pair thousands of times.
inline constexpr int32_t kMaxPreemptionsBySameRequest = 6;

inline SchedulerConfig TestConfig(int32_t num_blocks = 64, bool async = false) {
  SchedulerConfig c;
  c.max_num_batched_tokens = 64;
  c.max_num_seqs = 8;
  c.max_model_len = 256;
  c.block_size = 4;
  c.num_gpu_blocks = num_blocks;
  c.async_scheduling = async;
  c.eos_token_id = kEos;
  c.vocab_size = 64;
  c.hash_root = HashRootParams{
      .model_fingerprint = "test-model", .kv_layout = "test", .block_size = 4, .dtype = "f32"};
  return c;
}

inline std::vector<int32_t> Tokens(int32_t n, int32_t seed) {
  std::vector<int32_t> t;
  for (int32_t i = 0; i < n; ++i) t.push_back(2 + (seed * 7 + i * 13 + i * i) % 60);
  return t;
}

// One KV slot: the token id and position written there (-1: garbage).
inline int64_t SlotValue(int32_t token, int32_t pos) {
  return (static_cast<int64_t>(token) << 20) | pos;
}

// The "model": the next token is a hash of the KV values of every position.
inline int32_t NextToken(const std::vector<int64_t>& kv_values, int32_t vocab) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t v : kv_values) {
    h ^= static_cast<uint64_t>(v);
    h *= 1099511628211ull;
    h ^= h >> 29;
  }
  return static_cast<int32_t>(h % static_cast<uint64_t>(vocab));
}

struct Reference {
  std::vector<int32_t> output;
  RequestState reason = RequestState::kFinishedLength;
};

// What a request produces alone: the same stop rules, written out naively.
inline Reference RunAlone(const std::vector<int32_t>& prompt, const SamplingParams& sp,
                          const SchedulerConfig& c) {
  Reference ref;
  std::vector<int32_t> tokens = prompt;
  for (;;) {
    std::vector<int64_t> kv;
    for (size_t p = 0; p < tokens.size(); ++p)
      kv.push_back(SlotValue(tokens[p], static_cast<int32_t>(p)));
    const int32_t t = NextToken(kv, c.vocab_size);
    const bool may_stop = static_cast<int32_t>(ref.output.size()) >= sp.min_tokens;
    const bool eos = t == c.eos_token_id ||
                     std::count(c.extra_eos_token_ids.begin(), c.extra_eos_token_ids.end(), t) > 0;
    ref.output.push_back(t);  // EOS and a stop token too (vLLM's output)
    tokens.push_back(t);
    if (may_stop && ((!sp.ignore_eos && eos) ||
                     std::count(sp.stop_token_ids.begin(), sp.stop_token_ids.end(), t) > 0)) {
      ref.reason = RequestState::kFinishedStopped;
      return ref;
    }
    if (static_cast<int32_t>(ref.output.size()) >= sp.max_tokens ||
        static_cast<int32_t>(tokens.size()) >= c.max_model_len) {
      ref.reason = RequestState::kFinishedLength;
      return ref;
    }
  }
}

// The KV-store: block hash -> the slot values of a block.
using FakeStore = std::map<BlockHash, std::vector<int64_t>>;

// The worker: applies the diffs, writes KV slot values, samples NextToken()
// from what the block table really holds, performs loads and stores.
class FakeWorker {
 public:
  FakeWorker(const SchedulerConfig& c, FakeStore* store)
      : c_(c),
        store_(store),
        kv_(static_cast<size_t>(c.num_gpu_blocks), std::vector<int64_t>(c.block_size, -1)) {}

  // Loads of these hashes fail (garbage written, block reported invalid).
  std::set<BlockHash> fail_hashes;
  // A load reports finished_recving this many steps after it was issued.
  int32_t load_delay_steps = 0;
  // A store reports finished_sending this many steps after it was issued.
  int32_t store_delay_steps = 0;
  std::mt19937_64* rng = nullptr;  // if set: random extra delays and failures
  int32_t num_loaded_blocks = 0;
  int32_t num_failed_blocks = 0;
  // These steps fail: loads and the stores of ended requests still run (as
  // a real worker's do, before its forward pass), the batch diff is applied,
  // no KV is written, nothing is sampled, the step's stores are dropped.
  std::set<uint64_t> fail_steps;
  // One step in this many fails at random (needs rng; 0 = never).
  int32_t fail_one_step_in = 0;
  int32_t num_failed_steps = 0;
  // These steps are rejected unread, as a real worker answers a step it
  // cannot convert (StepExecutor::Reject): nothing of them is applied (no
  // finished ids dropped, no loads, no diff, no stores), and every step
  // built before the scheduler processed that answer fails.
  std::set<uint64_t> reject_steps;
  // One step in this many is rejected at random (needs rng; 0 = never).
  int32_t reject_one_step_in = 0;
  int32_t num_rejected_steps = 0;

  ModelRunnerOutput Execute(const SchedulerOutput& so) {
    ModelRunnerOutput out;
    out.step_id = so.step_id;
    if (reject_steps.count(so.step_id) > 0 ||
        (reject_one_step_in > 0 && rng && (*rng)() % reject_one_step_in == 0)) {
      last_failed_step_ = std::max(last_failed_step_, so.step_id);
      ++num_rejected_steps;
      out.error = "injected rejection of step " + std::to_string(so.step_id);
      out.rejected = true;
      return out;
    }
    for (const std::string& id : so.finished_req_ids) reqs_.erase(id);
    const KvConnectorMetadata& meta = so.kv_connector_metadata;
    // Stores of finished requests read their (freed) blocks first.
    Snapshot(meta, /*before_forward=*/true);
    for (const KvLoad& load : meta.loads) {
      int32_t delay = load_delay_steps + (rng ? static_cast<int32_t>((*rng)() % 3) : 0);
      for (size_t i = 0; i < load.block_hashes.size(); ++i) {
        auto it = store_->find(load.block_hashes[i]);
        const bool fail = it == store_->end() || fail_hashes.count(load.block_hashes[i]) > 0 ||
                          (rng && (*rng)() % 8 == 0);
        if (fail) {
          kv_[load.block_ids[i]].assign(c_.block_size, -1);
          invalid_.push_back(load.block_ids[i]);
          ++num_failed_blocks;
        } else {
          kv_[load.block_ids[i]] = it->second;
          ++num_loaded_blocks;
        }
      }
      recving_.push_back({delay, load.request_id});
    }
    // Apply the diffs.
    for (const NewRequestData& d : so.scheduled_new_reqs) {
      EXPECT_EQ(reqs_.count(d.request_id), 0u) << d.request_id << " sent as new twice";
      reqs_[d.request_id] = Req{d.prompt_token_ids, d.block_ids};
      reqs_[d.request_id].tokens.insert(reqs_[d.request_id].tokens.end(),
                                        d.output_token_ids.begin(), d.output_token_ids.end());
    }
    // A step built before the scheduler had processed a failed step's
    // output builds on it: it fails too (SchedulerOutput's contract), before
    // its cached requests' diffs are looked at.
    const bool built_on_failed = so.last_processed_step_id < last_failed_step_;
    if (!built_on_failed) {
      for (const CachedRequestData& d : so.scheduled_cached_reqs) {
        auto it = reqs_.find(d.request_id);
        EXPECT_NE(it, reqs_.end()) << d.request_id << " unknown to the worker";
        if (it == reqs_.end()) continue;
        if (d.resumed_from_preemption) {
          it->second.tokens = d.all_token_ids;
          it->second.table = d.new_block_ids;
        } else {
          it->second.table.insert(it->second.table.end(), d.new_block_ids.begin(),
                                  d.new_block_ids.end());
        }
      }
    }
    const bool fail = built_on_failed || fail_steps.count(so.step_id) > 0 ||
                      (fail_one_step_in > 0 && rng && (*rng)() % fail_one_step_in == 0);
    if (fail) {
      if (!built_on_failed) last_failed_step_ = so.step_id;
      ++num_failed_steps;
      out.error = "injected failure of step " + std::to_string(so.step_id);
      for (const KvStoreOp& st : meta.stores) {
        if (!st.before_forward) sending_.push_back({0, st.request_id});
      }
      ReportDue(&out);
      return out;
    }
    // Every KV write of the step before any read (DESIGN §6).
    struct Item {
      Req* req;
      const std::string* id;
      int32_t begin;
      int32_t n;
    };
    std::vector<Item> items;
    size_t idx = 0;
    for (const NewRequestData& d : so.scheduled_new_reqs) {
      items.push_back({&reqs_[d.request_id], &d.request_id, d.num_computed_tokens,
                       so.num_scheduled_tokens[idx++]});
    }
    for (const CachedRequestData& d : so.scheduled_cached_reqs) {
      items.push_back({&reqs_[d.request_id], &d.request_id, d.num_computed_tokens,
                       so.num_scheduled_tokens[idx++]});
    }
    for (const Item& it : items) {
      for (int32_t p = it.begin; p < it.begin + it.n; ++p) {
        if (p >= static_cast<int32_t>(it.req->tokens.size())) {
          ADD_FAILURE() << *it.id << ": position " << p << " scheduled but its token is unknown";
          break;
        }
        const size_t b = static_cast<size_t>(p / c_.block_size);
        if (b >= it.req->table.size()) {
          ADD_FAILURE() << *it.id << ": position " << p << " has no block";
          break;
        }
        kv_[it.req->table[b]][p % c_.block_size] = SlotValue(it.req->tokens[p], p);
      }
    }
    for (const Item& it : items) {
      const int32_t end = it.begin + it.n;
      if (end != static_cast<int32_t>(it.req->tokens.size())) continue;  // chunk: no sample
      std::vector<int64_t> values;
      for (int32_t p = 0; p < end; ++p) {
        const size_t b = static_cast<size_t>(p / c_.block_size);
        values.push_back(b < it.req->table.size() ? kv_[it.req->table[b]][p % c_.block_size] : -2);
      }
      const int32_t t = NextToken(values, c_.vocab_size);
      it.req->tokens.push_back(t);
      out.sampled.push_back(SampledTokens{*it.id, {t}});
    }
    // The other stores read the blocks after the step.
    Snapshot(meta, /*before_forward=*/false);
    ReportDue(&out);
    return out;
  }

  // Stores read (block hash -> slot values), for tests.
  std::vector<std::pair<BlockHash, std::vector<int64_t>>> stored;

  [[nodiscard]] size_t num_requests() const { return reqs_.size(); }
  [[nodiscard]] bool idle() const { return recving_.empty() && sending_.empty(); }
  [[nodiscard]] const std::vector<int64_t>& block(int32_t b) const { return kv_[b]; }

 private:
  struct Req {
    std::vector<int32_t> tokens;
    std::vector<int32_t> table;
  };
  // Reports that are due.
  void ReportDue(ModelRunnerOutput* out) {
    auto due = [](std::vector<std::pair<int32_t, std::string>>* q, std::vector<std::string>* dst) {
      std::vector<std::pair<int32_t, std::string>> keep;
      for (auto& [d, id] : *q) {
        if (d <= 0)
          dst->push_back(id);
        else
          keep.push_back({d - 1, id});
      }
      *q = std::move(keep);
    };
    out->kv_connector_report.invalid_block_ids = std::move(invalid_);
    invalid_.clear();
    due(&recving_, &out->kv_connector_report.finished_recving);
    due(&sending_, &out->kv_connector_report.finished_sending);
  }
  void Snapshot(const KvConnectorMetadata& meta, bool before_forward) {
    for (const KvStoreOp& s : meta.stores) {
      if (s.before_forward != before_forward) continue;
      for (size_t i = 0; i < s.block_ids.size(); ++i) {
        (*store_)[s.block_hashes[i]] = kv_[s.block_ids[i]];
        stored.emplace_back(s.block_hashes[i], kv_[s.block_ids[i]]);
      }
      sending_.push_back({store_delay_steps, s.request_id});
    }
  }
  SchedulerConfig c_;
  FakeStore* store_;
  std::vector<std::vector<int64_t>> kv_;
  std::map<std::string, Req> reqs_;
  std::vector<int32_t> invalid_;
  std::vector<std::pair<int32_t, std::string>> recving_;
  std::vector<std::pair<int32_t, std::string>> sending_;
  uint64_t last_failed_step_ = 0;
};

// Scheduler-role connector over a FakeStore, with scripted deferrals.
class ScriptedKvConnector : public KvConnectorScheduler {
 public:
  ScriptedKvConnector(int32_t block_size, FakeStore* store) : bs_(block_size), store_(store) {}

  // GetNumNewMatchedTokens answers nullopt this many times per request.
  std::map<std::string, int32_t> defer_count;
  std::mt19937_64* rng = nullptr;  // if set: random deferrals
  bool delay_free = false;         // RequestFinished returns true while stores run
  bool enable_stores = true;
  // RequestFinished stores what no step covered (KvStoreOp::before_forward).
  bool final_stores = true;

  // Observations.
  std::vector<std::string> answered;  // ids in the order lookups were answered
  std::vector<std::string> admitted;  // ids in UpdateStateAfterAlloc order
  std::vector<std::string> finished;
  std::vector<std::string> loads_finished;  // OnLoadFinished order
  int32_t num_store_violations = 0;         // store block beyond the known tokens
  // (request id, step id, tokens covered by stores) for every store emitted.
  struct StoreRecord {
    std::string id;
    uint64_t step;
    int32_t end_token;
  };
  std::vector<StoreRecord> stores;

  std::optional<ExternalMatch> GetNumNewMatchedTokens(const Request& r, int32_t local) override {
    int32_t& calls = calls_[r.request_id];
    ++calls;
    auto d = defer_count.find(r.request_id);
    if (d != defer_count.end() && calls <= d->second) return std::nullopt;
    if (rng && (*rng)() % 4 == 0) return std::nullopt;
    calls = 0;
    answered.push_back(r.request_id);
    int32_t n = 0;
    for (size_t i = static_cast<size_t>(local / bs_); i < r.block_hashes.size(); ++i) {
      if (store_->count(r.block_hashes[i]) == 0) break;
      ++n;
    }
    return ExternalMatch{.num_external_tokens = n * bs_, .load_async = true};
  }

  void UpdateStateAfterAlloc(const Request& r, std::span<const int32_t> blocks,
                             int32_t num_external) override {
    admitted.push_back(r.request_id);
    if (num_external == 0) return;
    KvLoad load{.request_id = r.request_id};
    const size_t first = static_cast<size_t>(r.num_computed_tokens / bs_);
    for (size_t i = 0; i < blocks.size(); ++i) {
      load.block_hashes.push_back(r.block_hashes[first + i]);
      load.block_ids.push_back(blocks[i]);
    }
    loads_.push_back(std::move(load));
  }

  KvConnectorMetadata BuildConnectorMeta(const SchedulerOutput& out,
                                         std::span<const ScheduledRequestView> views) override {
    KvConnectorMetadata meta;
    meta.loads = std::move(loads_);
    loads_.clear();
    meta.stores = std::move(final_stores_);  // before_forward entries come first
    final_stores_.clear();
    if (!enable_stores) return meta;
    for (const ScheduledRequestView& v : views) {
      const Request& r = *v.request;
      int32_t& done = stored_blocks_[r.request_id];
      const int32_t num_full = v.num_storable_tokens() / bs_;
      if (done > num_full) done = 0;  // preempted and recomputing
      KvStoreOp s = StoreFrom(r, r.block_ids, &done, num_full);
      if (!s.block_ids.empty()) {
        stores.push_back({r.request_id, out.step_id, num_full * bs_});
        meta.stores.push_back(std::move(s));
      }
    }
    return meta;
  }

  bool RequestFinished(const Request& r, std::span<const int32_t> block_ids,
                       int32_t num_storable_tokens) override {
    finished.push_back(r.request_id);
    calls_.erase(r.request_id);
    if (enable_stores && final_stores) {
      int32_t done = stored_blocks_[r.request_id];
      const int32_t num_full = num_storable_tokens / bs_;
      if (done > num_full) done = 0;
      KvStoreOp s = StoreFrom(r, block_ids, &done, num_full);
      if (!s.block_ids.empty()) {
        s.before_forward = true;
        final_stores_.push_back(std::move(s));
      }
    }
    stored_blocks_.erase(r.request_id);
    return delay_free && stores_in_flight_[r.request_id] > 0;
  }

  void OnLoadFinished(const Request& r, int32_t) override {
    loads_finished.push_back(r.request_id);
  }

  void OnConnectorReport(const KvConnectorReport& report) override {
    for (const std::string& id : report.finished_sending) {
      if (--stores_in_flight_[id] <= 0) stores_in_flight_.erase(id);
    }
  }

 private:
  int32_t bs_;
  FakeStore* store_;
  std::map<std::string, int32_t> calls_;
  std::map<std::string, int32_t> stored_blocks_;
  // The store entry for blocks [*done, num_full) the FakeStore lacks.
  KvStoreOp StoreFrom(const Request& r, std::span<const int32_t> block_ids, int32_t* done,
                      int32_t num_full) {
    KvStoreOp s{.request_id = r.request_id};
    for (int32_t b = *done; b < num_full; ++b) {
      if ((b + 1) * bs_ > r.num_tokens()) ++num_store_violations;
      if (static_cast<size_t>(b) >= r.block_hashes.size() ||
          static_cast<size_t>(b) >= block_ids.size()) {
        break;
      }
      if (store_->count(r.block_hashes[b]) > 0) continue;
      s.block_ids.push_back(block_ids[b]);
      s.block_hashes.push_back(r.block_hashes[b]);
    }
    *done = num_full;
    if (!s.block_ids.empty()) ++stores_in_flight_[r.request_id];
    return s;
  }

  std::map<std::string, int32_t> stores_in_flight_;
  std::vector<KvLoad> loads_;
  std::vector<KvStoreOp> final_stores_;
};

// The engine loop of the scheduler service, sync or async, with checks after
// every step.
class Harness {
 public:
  Harness(SchedulerConfig c, KvConnectorScheduler* connector, FakeStore* store)
      : config(c), sched(c, connector), worker(c, store) {}

  SchedulerConfig config;
  Scheduler sched;
  FakeWorker worker;
  std::map<std::string, std::vector<int32_t>> outputs;
  std::map<std::string, RequestState> reasons;
  std::map<std::string, RequestOutput> usage;       // the final output of each request
  std::map<std::string, int32_t> scheduled_tokens;  // total per request
  // Preemptions of one request by another (self-preemptions left out):
  // (victim, preemptor) -> count.
  std::map<std::pair<std::string, std::string>, int32_t> preempted_by;
  std::vector<PreemptionEvent> preemptions;  // every one, in order
  std::vector<SchedulerOutput> history;
  bool keep_history = false;
  bool check_invariants = true;
  // Called right after each Schedule(), before the worker runs the step.
  std::function<void(const SchedulerOutput&)> after_schedule;

  void Add(const std::string& id, std::vector<int32_t> prompt, SamplingParams sp,
           int32_t priority = 0, std::string salt = "", int64_t t = 0) {
    absl::Status s = sched.AddRequest(RequestSpec{.request_id = id,
                                                  .prompt_token_ids = std::move(prompt),
                                                  .sampling = std::move(sp),
                                                  .priority = priority,
                                                  .cache_salt = std::move(salt)},
                                      t);
    ASSERT_TRUE(s.ok()) << s;
  }

  // Schedules (and executes) one step; in async mode processes the oldest
  // output once two steps are in flight. Returns the step's output.
  const SchedulerOutput& Step() {
    pending_.push_back({sched.Schedule(), {}});
    SchedulerOutput& so = pending_.back().first;
    for (const PreemptionEvent& e : sched.last_preemptions()) {
      preemptions.push_back(e);
      if (e.reason == PreemptionReason::kKvCacheFull && e.victim_id != e.preemptor_id) {
        ++preempted_by[{e.victim_id, e.preemptor_id}];
      }
    }
    if (after_schedule) after_schedule(so);
    for (size_t i = 0; i < so.num_scheduled_tokens.size(); ++i) {
      const std::string& id =
          i < so.scheduled_new_reqs.size()
              ? so.scheduled_new_reqs[i].request_id
              : so.scheduled_cached_reqs[i - so.scheduled_new_reqs.size()].request_id;
      scheduled_tokens[id] += so.num_scheduled_tokens[i];
    }
    pending_.back().second = worker.Execute(so);
    if (check_invariants) Check("after Schedule");
    if (keep_history) history.push_back(so);
    last_ = so;
    if (!config.async_scheduling || pending_.size() == 2) Update();
    return last_;
  }

  // Processes the oldest step in flight.
  void Update() {
    auto [so, mro] = std::move(pending_.front());
    pending_.pop_front();
    for (const RequestOutput& o : sched.UpdateFromOutput(so, mro)) Record(o);
    for (const PreemptionEvent& e : sched.last_preemptions()) preemptions.push_back(e);
    if (check_invariants) Check("after UpdateFromOutput");
  }

  void Record(const RequestOutput& o) {
    auto& v = outputs[o.request_id];
    v.insert(v.end(), o.new_token_ids.begin(), o.new_token_ids.end());
    if (o.finished) {
      reasons[o.request_id] = *o.finished;
      usage[o.request_id] = o;
    }
  }

  void Abort(const std::string& id) {
    std::optional<RequestOutput> o = sched.AbortRequest(id);
    if (o) Record(*o);
  }

  // Runs until every request is done and the worker has reported everything.
  void RunToCompletion(int max_steps = 100000) {
    int steps = 0;
    while ((sched.HasUnfinishedRequests() || !pending_.empty() || !worker.idle()) &&
           steps++ < max_steps) {
      if (sched.HasUnfinishedRequests() || !worker.idle()) {
        Step();
      } else {
        Update();
      }
    }
    ASSERT_LT(steps, max_steps) << "did not finish";
    Check("at the end");
    EXPECT_EQ(sched.num_free_blocks(), sched.num_total_blocks()) << "blocks leaked";
    EXPECT_EQ(worker.num_requests(), 0u) << "worker still holds requests";
  }

  void Check(const char* where) {
    absl::Status s = sched.CheckInvariants();
    ASSERT_TRUE(s.ok()) << where << " of step " << last_.step_id << ": " << s;
  }

  [[nodiscard]] size_t in_flight() const { return pending_.size(); }
  // The most times one request was preempted by the same other one.
  [[nodiscard]] int32_t max_preemptions_by_same_request() const {
    int32_t most = 0;
    for (const auto& [pair, n] : preempted_by) most = std::max(most, n);
    return most;
  }

 private:
  std::deque<std::pair<SchedulerOutput, ModelRunnerOutput>> pending_;
  SchedulerOutput last_;
};

inline SamplingParams Greedy(int32_t max_tokens, bool ignore_eos = true) {
  SamplingParams sp;
  sp.max_tokens = max_tokens;
  sp.ignore_eos = ignore_eos;
  return sp;
}

}  // namespace tandem::sched::testing
