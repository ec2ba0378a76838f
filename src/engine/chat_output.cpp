// Streaming split of Qwen3 output into reasoning, content and tool calls. See chat_output.h.
#include "engine/chat_output.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace bonsai::engine {
namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

// Length of the longest suffix of `s` that is a proper prefix of `tag`
// (text that may still turn into the tag once more arrives).
size_t partial_tag_suffix(std::string_view s, std::string_view tag) {
  const size_t max = std::min(s.size(), tag.size() - 1);
  for (size_t n = max; n > 0; --n) {
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace

ChatOutputParser::ChatOutputParser(Options options) : opt_(options) {
  if (opt_.starts_in_reasoning && opt_.parse_reasoning) {
    mode_ = Mode::kReasoning;
    skip_ws_ = true;
  }
}

ChatOutputDelta ChatOutputParser::feed(std::string_view text) {
  ChatOutputDelta out;
  buf_.append(text);
  drain(out, /*final=*/false);
  return out;
}

ChatOutputDelta ChatOutputParser::finish() {
  ChatOutputDelta out;
  drain(out, /*final=*/true);
  if (mode_ == Mode::kToolCall) {
    // Never closed: what the model wrote, as text.
    out.content += std::string(kCallOpen) + call_text_ + buf_;
    call_text_.clear();
    mode_ = Mode::kContent;
  }
  buf_.clear();
  return out;
}

void ChatOutputParser::emit_text(ChatOutputDelta& out, std::string_view text) {
  if (text.empty()) return;
  (mode_ == Mode::kReasoning ? out.reasoning : out.content).append(text);
}

void ChatOutputParser::close_tool_call(ChatOutputDelta& out) {
  const std::string_view body = trim(call_text_);
  const auto j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  bool ok = j.is_object() && j.contains("name") && j["name"].is_string() && !j["name"].get<std::string>().empty();
  ParsedToolCall call;
  if (ok) {
    call.name = j["name"].get<std::string>();
    auto it = j.find("arguments");
    if (it == j.end() || it->is_null()) {
      call.arguments = "{}";
    } else if (it->is_string()) {
      // Arguments given as a JSON string: its content must itself be JSON.
      const auto inner = nlohmann::json::parse(it->get<std::string>(), nullptr, false);
      if (inner.is_discarded())
        ok = false;
      else
        call.arguments = inner.dump();
    } else {
      call.arguments = it->dump();
    }
  }
  if (ok) {
    calls_.push_back(call);
    out.tool_calls.push_back(std::move(call));
  } else {
    out.content += std::string(kCallOpen) + call_text_ + std::string(kCallClose);
  }
  call_text_.clear();
}

void ChatOutputParser::drain(ChatOutputDelta& out, bool final) {
  while (true) {
    if (skip_ws_) {
      size_t n = 0;
      while (n < buf_.size() && is_ws(buf_[n])) ++n;
      buf_.erase(0, n);
      if (buf_.empty()) {
        if (final) skip_ws_ = false;
        return;
      }
      skip_ws_ = false;
    }
    const std::string_view b = buf_;
    if (mode_ == Mode::kContent) {
      size_t at = std::string_view::npos;
      std::string_view tag;
      if (opt_.parse_reasoning) {
        const size_t i = b.find(kThinkOpen);
        if (i < at) at = i, tag = kThinkOpen;
      }
      if (opt_.parse_tool_calls) {
        const size_t i = b.find(kCallOpen);
        if (i < at) at = i, tag = kCallOpen;
      }
      if (at != std::string_view::npos) {
        emit_text(out, b.substr(0, at));
        buf_.erase(0, at + tag.size());
        mode_ = tag == kThinkOpen ? Mode::kReasoning : Mode::kToolCall;
        skip_ws_ = mode_ == Mode::kReasoning;
        continue;
      }
      size_t hold = 0;
      if (!final) {
        if (opt_.parse_reasoning) hold = std::max(hold, partial_tag_suffix(b, kThinkOpen));
        if (opt_.parse_tool_calls) hold = std::max(hold, partial_tag_suffix(b, kCallOpen));
      }
      emit_text(out, b.substr(0, b.size() - hold));
      buf_.erase(0, b.size() - hold);
      return;
    }
    if (mode_ == Mode::kReasoning) {
      const size_t i = b.find(kThinkClose);
      if (i != std::string_view::npos) {
        // The whitespace before </think> is not reasoning. (Earlier chunks
        // held their trailing whitespace back, so all of it is still here.)
        std::string_view r = b.substr(0, i);
        while (!r.empty() && is_ws(r.back())) r.remove_suffix(1);
        emit_text(out, r);
        buf_.erase(0, i + kThinkClose.size());
        mode_ = Mode::kContent;
        skip_ws_ = true;
        continue;
      }
      size_t hold = 0;
      if (!final) {
        hold = partial_tag_suffix(b, kThinkClose);
        // Trailing whitespace may be the "\n" before </think>: hold it too.
        size_t end = b.size() - hold;
        while (end > 0 && is_ws(b[end - 1])) --end;
        hold = b.size() - end;
      }
      emit_text(out, b.substr(0, b.size() - hold));
      buf_.erase(0, b.size() - hold);
      return;
    }
    // Tool call body: collected until the closing tag.
    const size_t i = b.find(kCallClose);
    if (i != std::string_view::npos) {
      call_text_.append(b.substr(0, i));
      buf_.erase(0, i + kCallClose.size());
      mode_ = Mode::kContent;
      close_tool_call(out);
      skip_ws_ = true;
      continue;
    }
    const size_t hold = final ? 0 : partial_tag_suffix(b, kCallClose);
    call_text_.append(b.substr(0, b.size() - hold));
    buf_.erase(0, b.size() - hold);
    return;
  }
}

}  // namespace bonsai::engine
