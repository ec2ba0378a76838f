// libFuzzer target for the HTTP request path (scripts/fuzz.sh builds and runs
// it beside the GGUF one): the OpenAI request parser and validator
// (server/openai.cpp) and the chat-template renderer (tokenizer/chat_template.cpp)
// on whatever bytes a client may send as a body.
//
// Input: byte 0 picks the endpoint (bit 0: chat or completions) and the
// template family (bit 1: Qwen3 or plain ChatML); the rest is the body.
// Whatever the bytes, parsing must return a request or an ApiError and never
// crash, leak, recurse without bound or read outside the buffer (ASan/UBSan).
// Invariants checked on accepted requests (std::abort = a finding):
//   - an error always names a message and has a 4xx status;
//   - a parsed chat request renders, or fails with an error (no throw);
//     its rendered text is the concatenation of its segments;
//   - a request the parser accepted holds values inside the documented
//     ranges (n in [1, kMaxChoices], at most kMaxStop stop strings,
//     temperature in [0, 2], top_p in [0, 1]).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "server/openai.h"
#include "tokenizer/chat_template.h"

namespace {

// Enough of the Qwen3 template's text for ChatTemplate::from_text to pick
// the Qwen3 renderer (it recognises the family; the text is not run).
constexpr std::string_view kQwen3Marker = "<|im_start|> <think> reasoning_content";

void check_accepted(const bonsai::server::CompletionRequest& req, bool qwen3) {
  using namespace bonsai;
  if (req.n < 1 || req.n > server::kMaxChoices) std::abort();
  if (req.sampling.stop->size() > server::kMaxStop) std::abort();
  if (req.sampling.temperature && !(*req.sampling.temperature >= 0.0f && *req.sampling.temperature <= 2.0f))
    std::abort();
  if (req.sampling.top_p && !(*req.sampling.top_p >= 0.0f && *req.sampling.top_p <= 1.0f)) std::abort();
  if (req.endpoint != server::Endpoint::kChat) return;
  const auto tmpl = tokenizer::ChatTemplate::from_text(qwen3 ? kQwen3Marker : std::string_view{});
  tokenizer::ChatOptions opt;
  opt.tools = req.tools;
  opt.enable_thinking = req.enable_thinking;
  auto rendered = tmpl.render(req.messages, opt);
  if (!rendered) return;  // a clean error is fine
  std::string joined;
  for (const auto& s : rendered->segments) joined += s.text;
  if (joined != rendered->text()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace bonsai;
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  const auto endpoint = (mode & 1) != 0 ? server::Endpoint::kCompletion : server::Endpoint::kChat;
  (void)server::json_nesting_exceeds(body, server::kMaxJsonDepth);
  server::CompletionRequest req;
  try {
    auto err = server::parse_completion_request(body, endpoint, req);
    if (err) {
      if (err->message.empty() || err->status < 400 || err->status >= 500) std::abort();
      return 0;
    }
    check_accepted(req, (mode & 2) != 0);
  } catch (...) {
    std::abort();  // the parser's contract: errors are values, never exceptions
  }
  return 0;
}
