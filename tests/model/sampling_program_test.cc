// kernels/sampling.h's program (the CPU's and the GPU's sampler) against
// its definition written out plainly here: thresholds found by sorting
// instead of bisection, sums and the draw over explicit lane arrays; and its
// draws' frequencies against the filtered softmax computed in double.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "tandem/kernels/sampling.h"
#include "tandem/model/sampler.h"

namespace tandem::model {
namespace {

using kernels::kSampleLanes;
using kernels::SampleExp;

TEST(SamplingProgramTest, SampleExpIsExpToAFewUlpsExactlyOneAtZeroAndZeroFarBelow) {
  EXPECT_EQ(SampleExp(0.0f), 1.0f);
  EXPECT_EQ(SampleExp(-0.0f), 1.0f);
  EXPECT_EQ(SampleExp(-86.5f), 0.0f);
  EXPECT_EQ(SampleExp(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(SampleExp(std::numeric_limits<float>::quiet_NaN()), 0.0f);
  double worst = 0.0;
  float prev = 0.0f;
  for (float x = -85.99f; x <= 0.0f; x += 0.00037f) {
    const float y = SampleExp(x);
    const double want = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::abs(y - want) / want);
    EXPECT_GE(y, prev) << x;  // never falls as x grows
    prev = y;
  }
  EXPECT_LT(worst, 1.5e-7) << worst;  // measured 8e-8: a float rounding or two
}

// Fixed-order sum of e_i >= v (kernels/sampling.h): lane t adds i = t mod
// kSampleLanes in increasing i; then neighbouring lanes pairwise, level by
// level. levels[0] are the lanes, levels.back() the total.
std::vector<std::vector<float>> MassTree(const std::vector<float>& e, float v) {
  std::vector<std::vector<float>> levels(1, std::vector<float>(kSampleLanes, 0.0f));
  for (size_t i = 0; i < e.size(); ++i) {
    if (e[i] >= v) levels[0][i % kSampleLanes] += e[i];
  }
  while (levels.back().size() > 1) {
    const std::vector<float>& below = levels.back();
    std::vector<float> up(below.size() / 2);
    for (size_t j = 0; j < up.size(); ++j) up[j] = below[2 * j] + below[2 * j + 1];
    levels.push_back(up);
  }
  return levels;
}

// The draw as sampling.h's comment defines it.
int32_t DefinitionDraw(const std::vector<float>& logits, const SamplingParams& p, int32_t position,
                       const std::vector<int32_t>& banned) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  std::vector<float> s(logits);
  if (p.temperature != 0.0f) {
    for (float& x : s) x = x / p.temperature;
  }
  for (int32_t id : banned) s[static_cast<size_t>(id)] = -std::numeric_limits<float>::infinity();
  const int32_t top = static_cast<int32_t>(std::max_element(s.begin(), s.end()) - s.begin());
  if (p.temperature == 0.0f) return top;
  const float m = s[static_cast<size_t>(top)];
  std::vector<float> e(s.size());
  for (size_t i = 0; i < s.size(); ++i) e[i] = SampleExp(s[i] - m);
  float v = p.min_p > 0.0f ? p.min_p : 0.0f;
  auto kept_desc = [&] {
    std::vector<float> k;
    for (float x : e) {
      if (x >= v) k.push_back(x);
    }
    std::sort(k.begin(), k.end(), std::greater<>());
    return k;
  };
  if (p.top_k > 0 && p.top_k < vocab) {
    const std::vector<float> k = kept_desc();
    if (static_cast<int32_t>(k.size()) > p.top_k) v = k[static_cast<size_t>(p.top_k - 1)];
  }
  if (p.top_p < 1.0f) {
    const float target = p.top_p * MassTree(e, v).back()[0];
    std::vector<float> k = kept_desc();
    k.erase(std::unique(k.begin(), k.end()), k.end());
    for (float x : k) {  // the largest threshold whose mass reaches the target
      if (MassTree(e, x).back()[0] >= target) {
        v = x;
        break;
      }
    }
  }
  const auto tree = MassTree(e, v);
  float r = kernels::CounterUniform(p.seed.value_or(0), position) * tree.back()[0];
  size_t node = 0;  // index within its level, from the root down
  for (size_t level = tree.size() - 1; level > 0; --level) {
    const float left = tree[level - 1][2 * node], right = tree[level - 1][2 * node + 1];
    if (r < left || !(right > 0.0f)) {
      node = 2 * node;
    } else {
      r -= left;
      node = 2 * node + 1;
    }
  }
  float cum = 0.0f;
  int32_t last = top;
  for (size_t i = node; i < e.size(); i += kSampleLanes) {
    if (!(e[i] >= v)) continue;
    cum += e[i];
    if (e[i] > 0.0f) last = static_cast<int32_t>(i);
    if (r < cum) return static_cast<int32_t>(i);
  }
  return last;
}

TEST(SamplingProgramTest, DrawsTheTokenItsDefinitionNames) {
  std::mt19937 rng(7);
  int32_t drawn_not_top = 0;
  for (int32_t trial = 0; trial < 300; ++trial) {
    const int32_t vocab = std::vector<int32_t>{5, 300, 1024, 1500, 5000}[trial % 5];
    std::normal_distribution<float> normal(0.0f, trial % 3 == 0 ? 0.5f : 4.0f);
    std::vector<float> logits(static_cast<size_t>(vocab));
    for (float& l : logits) l = normal(rng);
    if (trial % 7 == 0) logits[3 % vocab] = logits[1];  // a tie
    SamplingParams p{.temperature = std::vector<float>{0.0f, 0.3f, 0.7f, 1.0f,
                                                       1.6f}[trial % 5 == 0 ? 1 : rng() % 5],
                     .seed = rng()};
    switch (rng() % 6) {
      case 0:
        break;
      case 1:
        p.top_k = 1 + static_cast<int32_t>(rng() % 60);
        break;
      case 2:
        p.top_p = 0.05f + static_cast<float>(rng() % 95) / 100.0f;
        break;
      case 3:
        p.min_p = static_cast<float>(rng() % 30) / 100.0f;
        break;
      case 4:
        p.top_k = 1 + static_cast<int32_t>(rng() % 200);
        p.top_p = 0.5f + static_cast<float>(rng() % 50) / 100.0f;
        break;
      default:
        p.top_k = 1 + static_cast<int32_t>(rng() % 100);
        p.top_p = 0.3f + static_cast<float>(rng() % 70) / 100.0f;
        p.min_p = static_cast<float>(rng() % 10) / 100.0f;
    }
    std::vector<int32_t> banned;
    if (trial % 4 == 1 && vocab > 5) banned = {0, static_cast<int32_t>(rng() % vocab)};
    const int32_t position = static_cast<int32_t>(rng() % 1000);
    const int32_t want = DefinitionDraw(logits, p, position, banned);
    ASSERT_EQ(SampleToken(logits, p, position, banned), want)
        << "trial " << trial << " vocab " << vocab << " T " << p.temperature << " top_k " << p.top_k
        << " top_p " << p.top_p << " min_p " << p.min_p;
    drawn_not_top += want != static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) -
                                                  logits.begin());
  }
  EXPECT_GT(drawn_not_top, 100);  // the draws are not just argmaxes
}

// vLLM's filters in exact arithmetic: the probability of each token.
std::vector<double> FilteredSoftmax(const std::vector<float>& logits, const SamplingParams& p) {
  std::vector<double> q(logits.size());
  const double m = *std::max_element(logits.begin(), logits.end()) / double{p.temperature};
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::exp(logits[i] / double{p.temperature} - m);
  double v = p.min_p;
  std::vector<double> sorted(q);
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < sorted.size()) {
    v = std::max(v, sorted[static_cast<size_t>(p.top_k - 1)]);
  }
  double kept = 0;
  for (double x : q) kept += x >= v ? x : 0.0;
  double cum = 0;
  for (double x : sorted) {
    if (x < v) break;
    cum += x;
    if (cum >= p.top_p * kept) {
      v = x;
      break;
    }
  }
  double z = 0;
  for (double& x : q) z += (x = x >= v ? x : 0.0);
  for (double& x : q) x /= z;
  return q;
}

TEST(SamplingProgramTest, FrequenciesFollowTheFilteredSoftmax) {
  std::vector<float> logits(40);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(1.7f * i) * 2.5f;
  for (const SamplingParams& p :
       {SamplingParams{.temperature = 1.0f}, SamplingParams{.temperature = 0.7f, .top_k = 5},
        SamplingParams{.temperature = 1.3f, .top_p = 0.8f},
        SamplingParams{.temperature = 1.0f, .min_p = 0.2f},
        SamplingParams{.temperature = 2.0f, .top_k = 12, .top_p = 0.6f, .min_p = 0.05f}}) {
    const std::vector<double> want = FilteredSoftmax(logits, p);
    const int32_t n = 20000;
    std::vector<int32_t> count(logits.size());
    for (int32_t pos = 0; pos < n; ++pos) {
      SamplingParams seeded = p;
      seeded.seed = 11;
      count[static_cast<size_t>(SampleToken(logits, seeded, pos))]++;
    }
    for (size_t i = 0; i < logits.size(); ++i) {
      if (want[i] == 0.0) {
        EXPECT_EQ(count[i], 0) << "token " << i << " is filtered out; top_k " << p.top_k;
      } else {
        EXPECT_NEAR(count[i] / double{n}, want[i], 0.01) << "token " << i << " top_k " << p.top_k;
      }
    }
  }
}

// vLLM's apply_penalties written out over the whole vocabulary: every
// token's logit, repetition_penalty 1 and counts 0 for those not in the
// history (which leaves them as they are).
std::vector<float> VllmPenalized(std::vector<float> logits, const std::vector<int32_t>& prompt,
                                 const std::vector<int32_t>& output, const SamplingParams& p) {
  std::vector<int32_t> count(logits.size());
  std::vector<bool> seen(logits.size());
  for (int32_t id : prompt) seen[static_cast<size_t>(id)] = true;
  for (int32_t id : output) {
    seen[static_cast<size_t>(id)] = true;
    ++count[static_cast<size_t>(id)];
  }
  for (size_t i = 0; i < logits.size(); ++i) {
    const float rep = seen[i] ? p.repetition_penalty : 1.0f;
    float& l = logits[i];
    l = l > 0.0f ? l / rep : l * rep;
    l -= p.frequency_penalty * static_cast<float>(count[i]);
    l -= p.presence_penalty * (count[i] > 0 ? 1.0f : 0.0f);
  }
  return logits;
}

// A random row of logits with a history: a prompt, and an output with
// repeats (what the penalties count).
struct HistoryRow {
  int32_t vocab = 0;
  std::vector<float> logits;
  std::vector<int32_t> prompt, output;
};
HistoryRow RandomHistoryRow(std::mt19937& rng, int32_t trial) {
  HistoryRow r;
  r.vocab = std::vector<int32_t>{50, 700, 3000}[trial % 3];
  std::normal_distribution<float> normal(0.0f, 3.0f);
  r.logits.resize(static_cast<size_t>(r.vocab));
  for (float& l : r.logits) l = normal(rng);
  r.prompt.resize(1 + rng() % 40);
  r.output.resize(rng() % 30);
  for (int32_t& id : r.prompt) id = static_cast<int32_t>(rng() % r.vocab);
  for (int32_t& id : r.output) id = static_cast<int32_t>(rng() % (r.vocab / 5 + 1));
  return r;
}

// Greedy or not, with each filter in turn and now and then a penalty.
SamplingParams RandomFilters(std::mt19937& rng, int32_t trial) {
  SamplingParams p{.temperature = trial % 3 == 0 ? 0.0f : 0.9f,
                   .top_k = trial % 5 == 1 ? 3 : 0,
                   .top_p = trial % 5 == 2 ? 0.8f : 1.0f,
                   .min_p = trial % 5 == 3 ? 0.1f : 0.0f,
                   .seed = rng()};
  if (trial % 4 == 1) p.repetition_penalty = 1.4f;
  return p;
}

TEST(SamplingProgramTest, PenaltiesAreVllmsApplyPenaltiesBeforeEverythingElse) {
  std::mt19937 rng(3);
  for (int32_t trial = 0; trial < 200; ++trial) {
    const auto [vocab, logits, prompt, output] = RandomHistoryRow(rng, trial);
    SamplingParams p{.temperature = trial % 4 == 0 ? 0.0f : 0.8f,
                     .top_p = trial % 3 == 1 ? 0.9f : 1.0f,
                     .seed = rng()};
    p.repetition_penalty = std::vector<float>{1.0f, 1.3f, 0.7f}[rng() % 3];
    p.frequency_penalty = std::vector<float>{0.0f, 0.5f, -1.25f}[rng() % 3];
    p.presence_penalty = std::vector<float>{0.0f, 1.5f, -0.3f}[rng() % 3];
    std::vector<kernels::SamplePenalty> history;
    PenaltyHistory(prompt, output, &history);
    SamplingParams plain = p;
    plain.repetition_penalty = 1.0f;
    plain.frequency_penalty = plain.presence_penalty = 0.0f;
    const int32_t position = static_cast<int32_t>(output.size());
    ASSERT_EQ(SampleToken(logits, p, position, {}, history),
              SampleToken(VllmPenalized(logits, prompt, output, p), plain, position))
        << "trial " << trial;
  }
  // The effect: greedy never repeats the top token under a steep penalty.
  const std::vector<float> logits = {0.5f, 3.0f, 2.9f, -1.0f};
  std::vector<kernels::SamplePenalty> history;
  PenaltyHistory(std::vector<int32_t>{1}, {}, &history);
  EXPECT_EQ(SampleToken(logits, {.repetition_penalty = 2.0f}, 0, {}, history), 2);
  history.clear();
  PenaltyHistory(std::vector<int32_t>{0}, std::vector<int32_t>{1, 1}, &history);
  EXPECT_EQ(SampleToken(logits, {.frequency_penalty = 0.1f}, 2, {}, history), 2);  // 3 - 0.2
  EXPECT_EQ(SampleToken(logits, {.frequency_penalty = 0.01f}, 2, {}, history), 1);
}

// logit_bias (vLLM's LogitBiasLogitsProcessor, which runs before its
// apply_penalties): the bias is added to the logit, then the penalties
// apply, greedy or not; through SampleRows, whose params carry it.
TEST(SamplingProgramTest, LogitBiasIsAddedBeforeThePenalties) {
  std::mt19937 rng(7);
  for (int32_t trial = 0; trial < 200; ++trial) {
    const auto [vocab, logits, prompt, output] = RandomHistoryRow(rng, trial);
    SamplingParams p{.temperature = trial % 3 == 0 ? 0.0f : 0.8f, .seed = rng()};
    if (trial % 2 == 0) {
      p.repetition_penalty = 1.3f;
      p.frequency_penalty = 0.5f;
    }
    std::map<int32_t, float> bias;  // some ids of the history, some not
    for (int32_t j = 0; j < 1 + trial % 6; ++j) {
      const int32_t id = j % 2 == 0 && !prompt.empty() ? prompt[j % prompt.size()]
                                                       : static_cast<int32_t>(rng() % vocab);
      bias[id] = std::uniform_real_distribution<float>(-8.0f, 8.0f)(rng);
    }
    p.logit_bias.assign(bias.begin(), bias.end());
    std::vector<float> biased = logits;
    for (const auto& [id, b] : bias) biased[static_cast<size_t>(id)] += b;
    SamplingParams plain = p;
    plain.logit_bias.clear();
    plain.repetition_penalty = 1.0f;
    plain.frequency_penalty = 0.0f;
    const int32_t position = static_cast<int32_t>(output.size());
    const SampleRequest row{.params = &p,
                            .output_position = position,
                            .prompt_token_ids = prompt,
                            .output_token_ids = output};
    std::vector<int32_t> got;
    SampleRows(logits, vocab, {&row, 1}, &got);
    ASSERT_EQ(got[0], SampleToken(VllmPenalized(biased, prompt, output, p), plain, position))
        << "trial " << trial;
  }
  // The effect on a greedy draw: +100 makes a token the argmax, -100 bans
  // the top one.
  const std::vector<float> logits = {0.5f, 3.0f, 2.9f, -1.0f};
  auto greedy = [&](std::vector<std::pair<int32_t, float>> bias) {
    const SamplingParams p{.logit_bias = std::move(bias)};
    const SampleRequest row{.params = &p};
    std::vector<int32_t> got;
    SampleRows(logits, 4, {&row, 1}, &got);
    return got[0];
  };
  EXPECT_EQ(greedy({}), 1);
  EXPECT_EQ(greedy({{3, 100.0f}}), 3);
  EXPECT_EQ(greedy({{1, -100.0f}}), 2);
  EXPECT_EQ(greedy({{0, 2.45f}, {1, -0.1f}}), 0);
}

// vLLM's allowed_token_ids (its mask sets every other logit to -inf): a
// draw with the list is the draw from logits whose other ids are -inf,
// greedy or not, with every filter, banned ids and penalties; through
// SampleRows, whose params carry the list.
TEST(SamplingProgramTest, AllowedTokenIdsAreTheOnlyOnesDrawn) {
  std::mt19937 rng(11);
  constexpr float kInf = std::numeric_limits<float>::infinity();
  int32_t outside_without_the_list = 0;
  for (int32_t trial = 0; trial < 300; ++trial) {
    const auto [vocab, logits, prompt, output] = RandomHistoryRow(rng, trial);
    SamplingParams p = RandomFilters(rng, trial);
    for (int32_t j = 0; j < 1 + trial % 7; ++j) {  // ids may repeat
      p.allowed_token_ids.push_back(static_cast<int32_t>(rng() % vocab));
    }
    std::vector<int32_t> banned;
    if (trial % 6 == 5) banned.push_back(p.allowed_token_ids[0]);
    std::vector<float> masked(logits.size(), -kInf);
    for (int32_t id : p.allowed_token_ids) masked[static_cast<size_t>(id)] = logits[id];
    SamplingParams unlisted = p;
    unlisted.allowed_token_ids.clear();
    const int32_t position = static_cast<int32_t>(output.size());
    const SampleRequest row{.params = &p,
                            .output_position = position,
                            .banned_token_ids = banned,
                            .prompt_token_ids = prompt,
                            .output_token_ids = output};
    std::vector<int32_t> got;
    SampleRows(logits, vocab, {&row, 1}, &got);
    std::vector<kernels::SamplePenalty> history;
    SampleAdjustments(unlisted, prompt, output, &history);
    ASSERT_EQ(got[0], SampleToken(masked, unlisted, position, banned, history))
        << "trial " << trial;
    const auto& allowed = p.allowed_token_ids;
    if (std::any_of(allowed.begin(), allowed.end(), [&](int32_t id) {
          return std::find(banned.begin(), banned.end(), id) == banned.end();
        })) {
      EXPECT_NE(std::find(allowed.begin(), allowed.end(), got[0]), allowed.end())
          << "trial " << trial;
    }
    const int32_t free_draw = SampleToken(logits, unlisted, position, banned, history);
    outside_without_the_list +=
        std::find(allowed.begin(), allowed.end(), free_draw) == allowed.end() ? 1 : 0;
  }
  EXPECT_GT(outside_without_the_list, 200);  // the lists decide the draws
}

// A structured-outputs token mask (vLLM applies xgrammar's bitmask as -inf
// on every id whose bit is clear): a draw with the mask is the draw from
// logits whose masked ids are -inf, greedy or not, with every filter,
// banned ids, an allowed list and penalties; ids past the mask's words are
// masked too (a model vocabulary wider than the mask); through SampleRows.
TEST(SamplingProgramTest, ATokenMaskBansEveryIdItDoesNotAllow) {
  std::mt19937 rng(23);
  constexpr float kInf = std::numeric_limits<float>::infinity();
  int32_t masked_without_it = 0;
  for (int32_t trial = 0; trial < 300; ++trial) {
    const auto [vocab, logits, prompt, output] = RandomHistoryRow(rng, trial);
    SamplingParams p = RandomFilters(rng, trial);
    if (trial % 7 == 3) {
      for (int32_t j = 0; j < 12; ++j) {
        p.allowed_token_ids.push_back(static_cast<int32_t>(rng() % vocab));
      }
    }
    // Words for the whole vocabulary, or (every fourth trial) fewer.
    size_t words = (static_cast<size_t>(vocab) + 31) / 32;
    if (trial % 4 == 2 && words > 1) words -= 1;
    std::vector<uint32_t> mask(words, 0);
    const int32_t allowed_count = 1 + static_cast<int32_t>(rng() % 40);
    for (int32_t j = 0; j < allowed_count; ++j) {
      const uint32_t id = rng() % (static_cast<uint32_t>(words) * 32);
      mask[id / 32] |= 1u << (id % 32);
    }
    std::vector<int32_t> banned;
    if (trial % 6 == 5) banned.push_back(static_cast<int32_t>(rng() % vocab));
    const auto allows = [&](int32_t id) {
      return static_cast<size_t>(id) / 32 < words && (mask[id / 32] >> (id % 32) & 1u) != 0;
    };
    std::vector<float> masked(logits.size(), -kInf);
    for (int32_t id = 0; id < vocab; ++id) {
      if (allows(id)) masked[static_cast<size_t>(id)] = logits[static_cast<size_t>(id)];
    }
    const int32_t position = static_cast<int32_t>(output.size());
    const SampleRequest row{.params = &p,
                            .output_position = position,
                            .banned_token_ids = banned,
                            .allowed_mask = mask,
                            .prompt_token_ids = prompt,
                            .output_token_ids = output};
    std::vector<int32_t> got;
    SampleRows(logits, vocab, {&row, 1}, &got);
    std::vector<kernels::SamplePenalty> history;
    SampleAdjustments(p, prompt, output, &history);
    ASSERT_EQ(got[0], SampleToken(masked, p, position, banned, history)) << "trial " << trial;
    masked_without_it += allows(SampleToken(logits, p, position, banned, history)) ? 0 : 1;
  }
  EXPECT_GT(masked_without_it, 200);  // the masks decide the draws
}

// The program's list for one request: its history only with penalties,
// its logit_bias ids always, each id once.
TEST(SamplingProgramTest, SampleAdjustmentsListEachIdOnceWithItsBias) {
  const std::vector<int32_t> prompt = {5, 3}, output = {9, 9};
  auto entries = [&](const SamplingParams& p) {
    std::vector<kernels::SamplePenalty> h;
    SampleAdjustments(p, prompt, output, &h);
    std::vector<std::tuple<int32_t, int32_t, float>> got;
    for (const auto& e : h) got.emplace_back(e.id, e.output_count, e.bias);
    std::sort(got.begin(), got.end());
    return got;
  };
  using Entries = std::vector<std::tuple<int32_t, int32_t, float>>;
  EXPECT_EQ(entries({}), Entries{});
  EXPECT_EQ(entries({.logit_bias = {{3, 1.5f}, {7, -2.0f}}}),
            (Entries{{3, -1, 1.5f}, {7, -1, -2.0f}}));
  EXPECT_EQ(entries({.repetition_penalty = 1.2f, .logit_bias = {{3, 1.5f}, {7, -2.0f}}}),
            (Entries{{3, 0, 1.5f}, {5, 0, 0.0f}, {7, -1, -2.0f}, {9, 2, 0.0f}}));
}

TEST(SamplingProgramTest, PenaltyHistoryHasEveryTokenOnceWithItsOutputCount) {
  std::vector<kernels::SamplePenalty> h;
  PenaltyHistory(std::vector<int32_t>{5, 3, 5, 9}, std::vector<int32_t>{9, 2, 9, 9}, &h);
  std::vector<std::pair<int32_t, int32_t>> got;
  for (const auto& e : h) got.emplace_back(e.id, e.output_count);
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<std::pair<int32_t, int32_t>>{{2, 1}, {3, 0}, {5, 0}, {9, 3}}));
  // A second request's history appended to the same list (as a batch's
  // are) gets entries of its own, even for ids the first one had.
  PenaltyHistory(std::vector<int32_t>{9}, std::vector<int32_t>{5, 5}, &h);
  ASSERT_EQ(h.size(), 6u);
  got.clear();
  for (size_t i = 4; i < h.size(); ++i) got.emplace_back(h[i].id, h[i].output_count);
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<std::pair<int32_t, int32_t>>{{5, 2}, {9, 0}}));
}

}  // namespace
}  // namespace tandem::model
