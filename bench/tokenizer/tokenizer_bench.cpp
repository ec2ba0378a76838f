// Tokenizer throughput: bytes/s of encode (plain text, and a long prompt made
// of distinct words so the BPE word cache cannot help), decode and streaming
// decode, and rendering + encoding a chat, on the Qwen3 vocabulary of
// ../shared/fixtures/qwen3-tiny-q1_0.gguf and the Llama-2 SentencePiece
// vocabulary of ../shared/models/llama-2-tiny-random. Run:
//   build/bench/tokenizer/bonsai_bench_tokenizer
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace {

using bonsai::tokenizer::IncrementalDecoder;
using bonsai::tokenizer::TokenId;
using bonsai::tokenizer::Tokenizer;

std::shared_ptr<const Tokenizer> load(const std::string& rel) {
  const char* env = std::getenv("BONSAI_SHARED");
  const std::string dir = (env != nullptr && *env != '\0') ? env : BONSAI_SHARED_DIR;
  auto file = bonsai::gguf::File::open(dir + "/" + rel);
  if (!file) return nullptr;
  auto tok = Tokenizer::from_gguf(**file);
  return tok ? *tok : nullptr;
}

const std::shared_ptr<const Tokenizer>& qwen() {
  static const auto t = load("fixtures/qwen3-tiny-q1_0.gguf");
  return t;
}
const std::shared_ptr<const Tokenizer>& llama() {
  static const auto t = load("models/llama-2-tiny-random/llama-2-tiny-random.gguf");
  return t;
}

// ~64 KiB of mixed prose, code, numbers, CJK and emoji (deterministic).
const std::string& mixed_text() {
  static const std::string text = [] {
    const std::vector<std::string> parts = {
        "The quick brown fox jumps over the lazy dog. ",
        "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
        "Order #1234567 costs $89.99; pi is 3.14159. ",
        "人工智能正在改变世界。",
        "I love 🦙 and 🚀! ",
        "Don't stop: we're here, they'll've gone. ",
        "Привет, мир! Καλημέρα κόσμε. "};
    std::string s;
    for (size_t i = 0; s.size() < 64 * 1024; ++i) s += parts[(i * 5) % parts.size()];
    return s;
  }();
  return text;
}

// Distinct "words" so that every pre-token is new to the BPE cache.
std::string unique_words(size_t n, uint64_t seed) {
  std::string s;
  uint64_t x = seed;
  for (size_t i = 0; i < n; ++i) {
    s += ' ';
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    for (int k = 0; k < 8; ++k) s.push_back(static_cast<char>('a' + ((x >> (k * 5)) % 26)));
  }
  return s;
}

void BM_Encode(benchmark::State& state, const std::shared_ptr<const Tokenizer>& (*which)()) {
  const auto& tok = which();
  if (!tok) {
    state.SkipWithError("fixture missing");
    return;
  }
  const std::string& text = mixed_text();
  size_t n_tokens = 0;
  for (auto _ : state) {
    auto ids = tok->encode(text);
    n_tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens"] = static_cast<double>(n_tokens);
}
BENCHMARK_CAPTURE(BM_Encode, qwen3, qwen);
BENCHMARK_CAPTURE(BM_Encode, llama2_spm, llama);

void BM_EncodeUncachedWords(benchmark::State& state) {
  const auto& tok = qwen();
  if (!tok) {
    state.SkipWithError("fixture missing");
    return;
  }
  uint64_t seed = 1;
  size_t bytes = 0;
  for (auto _ : state) {
    state.PauseTiming();
    const std::string text = unique_words(4096, seed++);
    state.ResumeTiming();
    auto ids = tok->encode(text);
    benchmark::DoNotOptimize(ids.data());
    bytes += text.size();
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
}
BENCHMARK(BM_EncodeUncachedWords);

void BM_Decode(benchmark::State& state) {
  const auto& tok = qwen();
  if (!tok) {
    state.SkipWithError("fixture missing");
    return;
  }
  const auto ids = tok->encode(mixed_text());
  for (auto _ : state) {
    auto text = tok->decode(ids);
    benchmark::DoNotOptimize(text.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * ids.size()));
}
BENCHMARK(BM_Decode);

void BM_IncrementalDecode(benchmark::State& state) {
  const auto& tok = qwen();
  if (!tok) {
    state.SkipWithError("fixture missing");
    return;
  }
  const auto ids = tok->encode(mixed_text());
  for (auto _ : state) {
    IncrementalDecoder dec(*tok);
    size_t n = 0;
    for (TokenId id : ids) n += dec.push(id).size();
    benchmark::DoNotOptimize(n);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * ids.size()));
}
BENCHMARK(BM_IncrementalDecode);

void BM_ChatRenderAndEncode(benchmark::State& state) {
  const auto& tok = qwen();
  if (!tok) {
    state.SkipWithError("fixture missing");
    return;
  }
  std::vector<bonsai::tokenizer::ChatMessage> msgs;
  msgs.push_back({.role = "system", .content = "You are a helpful assistant."});
  for (int i = 0; i < 8; ++i) {
    msgs.push_back({.role = "user", .content = "Question " + std::to_string(i) + ": what is 2+2?"});
    msgs.push_back({.role = "assistant", .content = "<think>\nadd\n</think>\n\nIt is 4."});
  }
  msgs.push_back({.role = "user", .content = mixed_text().substr(0, 4096)});
  for (auto _ : state) {
    auto r = tok->chat_template().render(msgs);
    auto ids = tok->encode_chat(*r);
    benchmark::DoNotOptimize(ids.data());
  }
}
BENCHMARK(BM_ChatRenderAndEncode);

}  // namespace

BENCHMARK_MAIN();
