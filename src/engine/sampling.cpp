// Sampler chain; see sampling.h for the order and the formulas.
#include "engine/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "engine/logprobs.h"  // kMaxTopLogprobs
#include "kernels/kernels.h"  // argmax_f32

namespace bonsai::engine {

namespace {

// splitmix64 (Vigna): advances x and returns the next output.
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// "%g" text of a number, for error messages.
std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

// The sorted order of sampling.h: logit descending, then id ascending.
inline bool before(const Candidate& a, const Candidate& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

}  // namespace

// ---- SamplingParams ------------------------------------------------------------

core::Expected<void> SamplingParams::validate() const {
  auto bad = [](std::string msg) { return core::fail(core::Errc::kInvalidArgument, std::move(msg)); };
  if (std::isnan(temperature) || std::isinf(temperature)) return bad("sampling: temperature must be a finite number");
  if (!(top_p > 0.0f && top_p <= 1.0f)) return bad("sampling: top_p must be in (0, 1], got " + num(top_p));
  if (!(min_p >= 0.0f && min_p <= 1.0f)) return bad("sampling: min_p must be in [0, 1], got " + num(min_p));
  if (!(repeat_penalty > 0.0f) || std::isinf(repeat_penalty)) {
    return bad("sampling: repeat_penalty must be a finite number > 0, got " + num(repeat_penalty));
  }
  if (repeat_last_n < -1) return bad("sampling: repeat_last_n must be >= -1, got " + std::to_string(repeat_last_n));
  if (!std::isfinite(presence_penalty)) return bad("sampling: presence_penalty must be a finite number");
  if (!std::isfinite(frequency_penalty)) return bad("sampling: frequency_penalty must be a finite number");
  for (size_t i = 0; i < logit_bias.size(); ++i) {
    if (!(logit_bias[i].second >= -100.0f && logit_bias[i].second <= 100.0f)) {
      return bad("sampling: logit_bias for token " + std::to_string(logit_bias[i].first) +
                 " must be a number in [-100, 100], got " + num(logit_bias[i].second));
    }
  }
  if (logprobs > kMaxTopLogprobs)
    return bad("sampling: logprobs must be <= " + std::to_string(kMaxTopLogprobs) + " (top alternatives), got " +
               std::to_string(logprobs));
  if (prompt_logprobs > kMaxTopLogprobs)
    return bad("sampling: prompt_logprobs must be <= " + std::to_string(kMaxTopLogprobs) + ", got " +
               std::to_string(prompt_logprobs));
  for (size_t i = 0; i < stop.size(); ++i) {
    if (stop[i].empty()) return bad("sampling: stop[" + std::to_string(i) + "] is an empty string");
  }
  return {};
}

SamplingParams apply_overrides(SamplingParams p, const SamplingOverrides& over) {
  if (over.temperature) p.temperature = *over.temperature;
  if (over.top_p) p.top_p = *over.top_p;
  if (over.top_k) p.top_k = *over.top_k;
  if (over.min_p) p.min_p = *over.min_p;
  if (over.repeat_penalty) p.repeat_penalty = *over.repeat_penalty;
  if (over.presence_penalty) p.presence_penalty = *over.presence_penalty;
  if (over.frequency_penalty) p.frequency_penalty = *over.frequency_penalty;
  if (over.seed) p.seed = *over.seed;
  if (over.max_tokens) p.max_tokens = *over.max_tokens;
  if (over.stop) p.stop = *over.stop;
  if (over.ignore_eos) p.ignore_eos = *over.ignore_eos;
  if (over.logit_bias) p.logit_bias = *over.logit_bias;
  if (over.grammar) p.grammar = *over.grammar;
  if (over.logprobs) p.logprobs = *over.logprobs;
  if (over.prompt_logprobs) p.prompt_logprobs = *over.prompt_logprobs;
  return p;
}

// ---- Rng -------------------------------------------------------------------------

void Rng::reseed(uint64_t seed) {
  uint64_t x = seed;
  for (auto& w : state_.s) w = splitmix64(x);
}

uint64_t Rng::next_u64() {
  uint64_t* s = state_.s;
  const uint64_t result = rotl(s[1] * 5, 7) * 9;
  const uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

double Rng::next_double() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

// ---- Chain stages ------------------------------------------------------------------

void apply_logit_bias(std::span<float> logits, const SamplingParams& params) {
  const auto n_vocab = static_cast<int64_t>(logits.size());
  for (const auto& [id, bias] : params.logit_bias) {
    if (id >= 0 && id < n_vocab) logits[static_cast<size_t>(id)] += bias;
  }
}

void apply_penalties(std::span<float> logits, std::span<const int32_t> history, const SamplingParams& params) {
  if (params.repeat_last_n == 0) return;
  if (params.repeat_penalty == 1.0f && params.presence_penalty == 0.0f && params.frequency_penalty == 0.0f) {
    return;
  }
  size_t window = history.size();
  if (params.repeat_last_n > 0) window = std::min(window, static_cast<size_t>(params.repeat_last_n));
  std::vector<int32_t> ids(history.end() - static_cast<std::ptrdiff_t>(window), history.end());
  std::sort(ids.begin(), ids.end());
  const auto n_vocab = static_cast<int64_t>(logits.size());
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j < ids.size() && ids[j] == ids[i]) ++j;
    const int32_t id = ids[i];
    const auto count = static_cast<float>(j - i);
    i = j;
    if (id < 0 || id >= n_vocab) continue;
    float& l = logits[static_cast<size_t>(id)];
    // llama.cpp (llama_sampler_penalties_apply): the CTRL-style repetition
    // penalty, then OpenAI's frequency and presence penalties.
    if (l <= 0.0f) {
      l *= params.repeat_penalty;
    } else {
      l /= params.repeat_penalty;
    }
    l -= count * params.frequency_penalty + params.presence_penalty;
  }
}

int32_t argmax(std::span<const float> logits) {
  return static_cast<int32_t>(kernels::argmax_f32(logits.data(), static_cast<int64_t>(logits.size())));
}

std::vector<Candidate> filter_candidates(std::span<const float> logits, const SamplingParams& params) {
  const auto n = static_cast<int64_t>(logits.size());
  std::vector<Candidate> c;
  bool sorted = false;
  if (params.top_k > 0 && params.top_k < n) {
    // 3. top_k: keep the k first in sorted order. Heap selection straight
    // from the logits (what std::partial_sort does, without first writing
    // all n candidates: 1.8 MB per row at 151,936 tokens, ~60% of this
    // stage's time). The heap's front is its last entry in sorted order;
    // logit i (i larger than every id in the heap) enters only when it is
    // strictly greater than that entry's logit (a tie loses on the id, a
    // NaN never enters). The order is a strict total order, so the k kept
    // and their order are those of a full sort.
    const auto k = static_cast<size_t>(params.top_k);
    c.resize(k);
    for (size_t i = 0; i < k; ++i) c[i] = {static_cast<int32_t>(i), logits[i], 0.0f};
    std::make_heap(c.begin(), c.end(), before);
    float worst = c.front().logit;
    for (size_t i = k; i < logits.size(); ++i) {
      if (!(logits[i] > worst)) continue;
      std::pop_heap(c.begin(), c.end(), before);
      c.back() = {static_cast<int32_t>(i), logits[i], 0.0f};
      std::push_heap(c.begin(), c.end(), before);
      worst = c.front().logit;
    }
    std::sort_heap(c.begin(), c.end(), before);
    sorted = true;
  } else {
    c.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      c[static_cast<size_t>(i)] = {static_cast<int32_t>(i), logits[static_cast<size_t>(i)], 0.0f};
  }
  if (c.empty()) return c;

  float max_l = c[0].logit;
  for (const auto& x : c) max_l = std::max(max_l, x.logit);
  // Softmax normaliser of the top_k survivors at temperature 1, read only by
  // top_p (without top_k: 151,936 exps per row, so skipped when top_p is off).
  double z = 0.0;
  if (params.top_p < 1.0f) {
    for (const auto& x : c) z += std::exp(static_cast<double>(x.logit) - max_l);
  }

  // 5. min_p (applied before sorting to sort less; the result equals running
  // it after top_p, because both keep a prefix of the sorted order and the
  // ratio p_i / p_max does not change when top_p renormalises):
  // p_i >= min_p * p_max  <=>  logit_i >= max_logit + log(min_p)  (llama.cpp's form).
  if (params.min_p > 0.0f) {
    const float threshold = max_l + std::log(params.min_p);
    std::erase_if(c, [&](const Candidate& x) { return x.logit < threshold; });
    if (c.empty()) c.push_back({argmax(logits), max_l, 0.0f});  // unreachable: max survives
  }
  if (!sorted && params.top_p < 1.0f) {
    // top_p needs only the sorted prefix that reaches top_p: sort the first k
    // (k = 256, 1024, ...) until that prefix reaches it. Same prefix as a full
    // sort (strict total order), at O(n log k) instead of O(n log n).
    for (size_t k = 256; k < c.size(); k *= 4) {
      std::partial_sort(c.begin(), c.begin() + static_cast<std::ptrdiff_t>(k), c.end(), before);
      double cum = 0.0;
      for (size_t i = 0; i < k && cum < params.top_p; ++i) cum += std::exp(static_cast<double>(c[i].logit) - max_l) / z;
      if (cum >= params.top_p) {
        c.resize(k);
        sorted = true;
        break;
      }
    }
  }
  if (!sorted) std::sort(c.begin(), c.end(), before);

  // 4. top_p over the top_k survivors' probabilities.
  if (params.top_p < 1.0f) {
    double cum = 0.0;
    for (size_t i = 0; i < c.size(); ++i) {
      cum += std::exp(static_cast<double>(c[i].logit) - max_l) / z;
      if (cum >= params.top_p) {
        c.resize(i + 1);
        break;
      }
    }
  }

  // 6. temperature, then the final softmax.
  const float temp = params.temperature > 0.0f ? params.temperature : 1.0f;
  const float top = c[0].logit;  // the largest (sorted)
  double sum = 0.0;
  std::vector<double> e(c.size());
  bool overflow = false;
  for (size_t i = 0; i < c.size(); ++i) {
    const float raw = c[i].logit;
    c[i].logit /= temp;
    overflow = overflow || !std::isfinite(c[i].logit);
    e[i] = raw;  // kept for the overflow path below
  }
  if (!overflow) {
    for (size_t i = 0; i < c.size(); ++i) {
      e[i] = std::exp(static_cast<double>(c[i].logit) - c[0].logit);
      sum += e[i];
    }
  } else {
    // A tiny temperature (e.g. 1e-40) overflowed logit / T to +-inf in
    // float: inf - inf = NaN probabilities, and the walk in sample() then
    // returned the LEAST likely candidate. exp((l_i - l_top) / T) in double
    // never overflows (the exponent is <= 0) and tends to greedy as T -> 0.
    for (size_t i = 0; i < c.size(); ++i) {
      e[i] = std::exp((e[i] - static_cast<double>(top)) / static_cast<double>(temp));
      sum += e[i];
    }
  }
  for (size_t i = 0; i < c.size(); ++i) c[i].p = static_cast<float>(e[i] / sum);
  return c;
}

// ---- Temperature-only sampling without the full sort ------------------------------------
//
// With temperature only, filter_candidates keeps every token, sorts all n by
// `before` (~17 ms per row at n = 151,936) and computes, in that order,
//   e_i = exp(double(float(l_i / T)) - double(float(top / T)))      (or, when some
//   e_i = exp((double(l_i) - double(top)) / double(T))                l_i / T is not
//   sum = e_0 + e_1 + ... (double, left to right)                      finite, this)
//   p_i = float(e_i / sum)
// and sample() walks cum += p_i until u < cum. sample_tempered returns the
// same token without the sort, because:
// 1. e_i depends only on l_i (and top, T, the branch, decided by the same
//    test over all n), so tied logits have equal e_i, p_i: the sum and the
//    walk depend only on the sequence of logit VALUES in descending order,
//    not on the ids' order within ties.
// 2. The exponent x_i is monotone in l_i (correctly rounded division by
//    T > 0, subtraction of a constant), so S = {i : x_i >= -38} is a prefix
//    of the sorted order, {i : l_i >= v_cut} for the v_cut found by
//    bisecting the floats with the reference's own exponent formula. c_0 has x = 0, e = 1, so the running sum is >= 1
//    after it; an element outside S has e_i <= exp(-38) (1 + 2^-52) < 2^-54,
//    less than half an ulp of any double >= 1, so s + e_i rounds to s: it
//    leaves the sum unchanged wherever it comes. Hence sum = the left-to-
//    right sum over S's values in descending order, which we get by
//    radix-sorting S's values alone (no comparator, no ids).
// 3. The walk over S's positions is the reference's walk over its first |S|
//    positions (same p's, same order). If it stops at position j, the
//    reference's c_j has the value v_j, and among the tokens with logit
//    == v_j (all in S, contiguous from position a) it is the (j - a)-th by
//    id: one scan finds it. If it does not stop within S (u above the float
//    mass of S: probability ~1e-8), return -1 and the caller runs the
//    reference with the same u.
// NaN logits (no strict order) and a non-finite maximum also return -1.
int32_t sample_tempered(std::span<const float> logits, float temp, double u, TemperedScratch& scratch) {
  const size_t n = logits.size();
  if (n == 0 || !(temp > 0.0f)) return -1;
  const float* l = logits.data();
  float top = l[0], low = l[0];
  bool nan = false;
  for (size_t i = 0; i < n; ++i) {
    const float v = l[i];
    nan |= v != v;
    top = v > top ? v : top;
    low = v < low ? v : low;
  }
  if (nan || !std::isfinite(top)) return -1;
  // The reference's branch: some l_i / T not finite. Float division by T > 0
  // is monotone, so that happens iff it does for the smallest or the largest.
  const bool overflow = !std::isfinite(low / temp) || !std::isfinite(top / temp);
  const float ctop = top / temp;  // c_0's tempered logit
  auto exponent = [&](float v) -> double {
    if (!overflow) return static_cast<double>(v / temp) - static_cast<double>(ctop);
    return (static_cast<double>(v) - static_cast<double>(top)) / static_cast<double>(temp);
  };
  constexpr double kCut = -38.0;  // exp(-38) = 3.1e-17 < 2^-54
  // Floats as unsigned keys in float order (negatives flipped; -0 < +0).
  auto key_of = [](float v) {
    uint32_t b;
    std::memcpy(&b, &v, sizeof b);
    return (b & 0x80000000u) != 0 ? ~b : (b | 0x80000000u);
  };
  auto value = [](uint32_t key) {
    const uint32_t b = (key & 0x80000000u) != 0 ? (key & 0x7fffffffu) : ~key;
    float v;
    std::memcpy(&v, &b, sizeof v);
    return v;
  };
  // S = {l_i >= v_cut}: the exponent is monotone in the logit, so the
  // smallest float whose exponent is >= kCut is found by bisection over the
  // keys of [-inf, top] (top itself has exponent 0).
  uint32_t lo = key_of(-INFINITY), hi = key_of(top);  // exponent(value(hi)) >= kCut
  while (hi - lo > 1) {
    const uint32_t mid = lo + (hi - lo) / 2;
    const float v = value(mid);
    if (v != v) {  // not reachable between -inf and a finite top; keep the bisection sound anyway
      lo = mid;
      continue;
    }
    if (exponent(v) >= kCut) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  const float v_cut = value(hi);
  // S's values as descending-order keys (complemented float-order keys).
  std::vector<uint32_t>& keys = scratch.keys;
  keys.resize(n);
  size_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    keys[m] = ~key_of(l[i]);
    m += l[i] >= v_cut ? 1 : 0;
  }
  // LSD radix sort, 11 + 11 + 10 bits; a pass whose digit is the same for
  // every key (common for the top bits: S spans a narrow range) is skipped.
  std::vector<uint32_t>& tmp = scratch.tmp;
  tmp.resize(m);
  uint32_t* src = keys.data();
  uint32_t* dst = tmp.data();
  for (const int shift : {0, 11, 22}) {
    uint32_t count[2048] = {};
    for (size_t i = 0; i < m; ++i) ++count[(src[i] >> shift) & 2047u];
    if (count[(src[0] >> shift) & 2047u] == m) continue;
    uint32_t sum = 0;
    for (uint32_t& c : count) {
      const uint32_t k = c;
      c = sum;
      sum += k;
    }
    for (size_t i = 0; i < m; ++i) dst[count[(src[i] >> shift) & 2047u]++] = src[i];
    std::swap(src, dst);
  }
  // The reference's sum and walk over S, in descending order of value.
  std::vector<double>& e = scratch.e;
  e.resize(m);
  double sum = 0.0;
  for (size_t j = 0; j < m; ++j) {
    e[j] = std::exp(exponent(value(~src[j])));
    sum += e[j];
  }
  double cum = 0.0;
  for (size_t j = 0; j < m; ++j) {
    cum += static_cast<float>(e[j] / sum);
    if (!(u < cum)) continue;
    const float v = value(~src[j]);
    size_t a = j;  // the first position of v's tie run (float ==: -0 and +0 tie, as in `before`)
    while (a > 0 && value(~src[a - 1]) == v) --a;
    size_t r = j - a;
    for (size_t i = 0; i < n; ++i)
      if (l[i] == v && r-- == 0) return static_cast<int32_t>(i);
    return -1;  // unreachable: v's run in S holds every token with logit v
  }
  return -1;
}

// ---- Sampler -------------------------------------------------------------------------

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  // Stages 0-1 work on a copy; when both are no-ops (no logit_bias, neutral
  // or windowless penalties: the usual request) the chain reads `logits`
  // itself (the copy was 0.6 MB per sampled row at a 151,936-token vocabulary).
  const bool penalised =
      params_.repeat_last_n != 0 && !history.empty() &&
      (params_.repeat_penalty != 1.0f || params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f);
  std::span<const float> in = logits;
  if (!params_.logit_bias.empty() || penalised) {
    scratch_.assign(logits.begin(), logits.end());
    apply_logit_bias(scratch_, params_);
    apply_penalties(scratch_, history, params_);
    in = scratch_;
  }
  if (params_.temperature <= 0.0f) return argmax(in);

  // Temperature only (no top_k cut, top_p 1, min_p 0): the same token
  // without sorting the vocabulary (sample_tempered), when it can tell.
  const bool tempered_only =
      (params_.top_k <= 0 || static_cast<int64_t>(params_.top_k) >= static_cast<int64_t>(in.size())) &&
      !(params_.top_p < 1.0f) && !(params_.min_p > 0.0f);
  if (tempered_only) {
    const double u = rng_.next_double();
    if (const int32_t t = sample_tempered(in, params_.temperature, u, tempered_); t >= 0) return t;
    return walk(filter_candidates(in, params_), u);
  }
  // 7. One uniform draw; walk the cumulative distribution in sorted order.
  return walk(filter_candidates(in, params_), rng_.next_double());
}

int32_t Sampler::verify(std::span<const float> logits, std::span<const int32_t> history, int32_t proposal) {
  if (params_.temperature <= 0.0f) return sample(logits, history);  // greedy: the arg-max, no draw
  std::span<const float> in = logits;
  if (!params_.logit_bias.empty() || (params_.repeat_last_n != 0 && !history.empty())) {
    scratch_.assign(logits.begin(), logits.end());
    apply_logit_bias(scratch_, params_);
    apply_penalties(scratch_, history, params_);
    in = scratch_;
  }
  const std::vector<Candidate> c = filter_candidates(in, params_);
  const double u_accept = rng_.next_double();
  double p = 0.0;
  for (const auto& x : c)
    if (x.id == proposal) p = x.p;
  if (u_accept < p) return proposal;
  return verify_point_proposal(c, proposal, u_accept, rng_.next_double());
}

int32_t verify_point_proposal(std::span<const Candidate> c, int32_t proposal, double u_accept, double u_resample) {
  double p = 0.0;
  for (const auto& x : c)
    if (x.id == proposal) p = x.p;
  if (u_accept < p) return proposal;
  // p - q clipped at 0 is p everywhere but at the proposal (q = 1 there,
  // p(x) - 1 <= 0): the survivors without it, their mass 1 - p(x).
  const double rest = 1.0 - p;
  if (!(rest > 0.0)) return proposal;  // (p(x) = 1 is always accepted; rounding)
  const double target = u_resample * rest;
  double cum = 0.0;
  int32_t last = proposal;
  for (const auto& x : c) {
    if (x.id == proposal) continue;
    cum += x.p;
    last = x.id;
    if (target < cum) return x.id;
  }
  return last;
}

int32_t walk(std::span<const Candidate> c, double u) {
  // The cumulative sum is recomputed in double from the float p's so the
  // walk is exactly reproducible from filter_candidates' output.
  double cum = 0.0;
  for (const auto& x : c) {
    cum += x.p;
    if (u < cum) return x.id;
  }
  return c.back().id;
}

}  // namespace bonsai::engine
