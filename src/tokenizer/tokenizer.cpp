// Tokenizer: vocabulary loading, special-token partitioning, byte-level BPE
// (gpt2) and SentencePiece-style BPE (llama), decoding. The algorithms follow
// llama.cpp's src/llama-vocab.cpp (llm_tokenizer_bpe_session,
// llm_tokenizer_spm_session, tokenizer_st_partition, token_to_piece,
// detokenize); NFC for Qwen follows Hugging Face tokenizers.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <mutex>
#include <optional>
#include <queue>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "tokenizer/pretokenizer.h"
#include "tokenizer/unicode.h"

namespace bonsai::tokenizer {

namespace {

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // U+2581 "▁"

// A piece of input after special-token partitioning: either a recognised
// special token or a run of raw text (a view into the caller's string).
struct Fragment {
  TokenId id = kNoToken;  // != kNoToken: a special token
  std::string_view text;  // raw text when id == kNoToken
};

// Hash for the BPE merge table key (left id, right id).
inline uint64_t pair_key(TokenId a, TokenId b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

struct MergeInfo {
  int32_t rank = 0;    // line index in tokenizer.ggml.merges (lower merges first)
  TokenId result = 0;  // token id of the merged text
};

}  // namespace

struct Tokenizer::Impl {
  std::string path;
  VocabType type = VocabType::kBpe;
  std::string pre;
  std::string load_warning;                                  // Tokenizer::load_warning
  std::vector<std::string> tokens;                           // [n_vocab] token text as stored
  std::vector<TokenType> types;                              // [n_vocab]
  std::vector<float> scores;                                 // [n_vocab] (llama; zeros if absent)
  std::vector<std::string> pieces;                           // [n_vocab] token_to_bytes, precomputed
  std::unordered_map<std::string_view, TokenId> text_to_id;  // views into `tokens`

  // gpt2
  std::unordered_map<uint64_t, MergeInfo> merges;
  std::array<TokenId, 256> byte_token{};  // token of the GPT-2 char for each byte
  std::optional<RegexSplitter> splitter;
  bool nfc = false;

  // llama
  bool add_space_prefix = true;

  // special tokens
  std::vector<TokenId> special_tokens;  // control/user-defined/unknown, longest text first
  TokenId bos = kNoToken, eos = kNoToken, eot = kNoToken, unk = kNoToken, pad = kNoToken;
  bool add_bos = false;
  std::unordered_set<TokenId> eog;
  ChatTemplate chat_template;

  // BPE word cache (gpt2): word bytes -> ids. Guarded by cache_mutex.
  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<TokenId>> cache;
  static constexpr size_t kCacheMaxEntries = 1 << 16;
  static constexpr size_t kCacheMaxWordBytes = 64;

  TokenId find(std::string_view text) const {
    auto it = text_to_id.find(text);
    return it == text_to_id.end() ? kNoToken : it->second;
  }
  bool valid(TokenId id) const { return id >= 0 && static_cast<size_t>(id) < tokens.size(); }

  void partition(std::string_view text, bool parse_special, std::vector<Fragment>& out) const;
  void bpe_word(std::string_view word, std::vector<TokenId>& out) const;
  void bpe_word_uncached(std::string_view word, std::vector<TokenId>& out) const;
  void bpe_text(std::string_view text, std::vector<TokenId>& out) const;
  void spm_text(std::string_view text, std::vector<TokenId>& out) const;
  TokenId spm_byte_token(uint8_t byte) const;
  void encode_fragments(const std::vector<Fragment>& frags, std::vector<TokenId>& out) const;
  std::string make_piece(TokenId id) const;

  // Loading steps of from_gguf, in order (each reads one group of keys).
  core::Expected<void> read_model_type(const gguf::File& file);
  core::Expected<void> read_vocab(const gguf::File& file);
  core::Expected<void> read_merges(const gguf::File& file);
  core::Expected<void> read_pretokenizer(const gguf::File& file);
  core::Expected<void> read_special_ids(const gguf::File& file);
  void collect_eog();
  void collect_special_tokens();
  core::Expected<void> read_chat_template(const gguf::File& file, const ChatTemplateOptions& options);
};

// ---- loading ----------------------------------------------------------------

namespace {

// Reads an optional token id key. Missing → `fallback`; -1 / 0xFFFFFFFF →
// kNoToken (converters write -1 for "none"); other out-of-range ids → error.
core::Expected<TokenId> read_id(const gguf::File& file, std::string_view key, TokenId fallback, size_t n_vocab) {
  const gguf::Value* v = file.find(key);
  if (v == nullptr) return fallback;
  int64_t id = 0;
  if (const auto* u = std::get_if<uint64_t>(&v->v)) {
    if (*u == 0xFFFFFFFFull || *u == 0xFFFFFFFFFFFFFFFFull) return kNoToken;
    if (*u > static_cast<uint64_t>(INT32_MAX))
      id = INT64_MAX;
    else
      id = static_cast<int64_t>(*u);
  } else if (const auto* s = std::get_if<int64_t>(&v->v)) {
    if (*s < 0) return kNoToken;
    id = *s;
  } else {
    return core::fail(core::Errc::kFormat, file.path() + ": key '" + std::string(key) + "' has type " +
                                               std::string(gguf::value_type_name(v->type)) +
                                               ", expected an integer token id");
  }
  if (static_cast<uint64_t>(id) >= n_vocab) {
    return core::fail(core::Errc::kFormat, file.path() + ": key '" + std::string(key) + "' = " + std::to_string(id) +
                                               " is not a token id (vocabulary has " + std::to_string(n_vocab) +
                                               " tokens)");
  }
  return static_cast<TokenId>(id);
}

core::Expected<bool> read_bool(const gguf::File& file, std::string_view key, bool fallback) {
  if (!file.has(key)) return fallback;
  return file.get<bool>(key);
}

}  // namespace

std::string Tokenizer::Impl::make_piece(TokenId id) const {
  const TokenType t = types[id];
  const std::string& text = tokens[id];
  switch (t) {
    case TokenType::kUserDefined:
      return text;
    case TokenType::kNormal:
      if (type == VocabType::kBpe) {
        std::string out;
        for (size_t pos = 0; pos < text.size();) {
          size_t len = unicode::valid_utf8_length(text, pos);
          if (len == 0) {  // not valid UTF-8 in the vocabulary: copy the byte
            out.push_back(text[pos]);
            pos += 1;
            continue;
          }
          const uint32_t cp = unicode::decode_utf8(text, pos, len);
          const int b = unicode::unicode_to_byte(cp);
          if (b >= 0)
            out.push_back(static_cast<char>(b));
          else
            out.append(text, pos, len);  // not a byte-level char: keep its text
          pos += len;
        }
        return out;
      } else {
        std::string out;
        for (size_t pos = 0; pos < text.size();) {
          if (text.compare(pos, kSpmSpace.size(), kSpmSpace) == 0) {
            out.push_back(' ');
            pos += kSpmSpace.size();
          } else {
            out.push_back(text[pos++]);
          }
        }
        return out;
      }
    case TokenType::kByte:
      if (type == VocabType::kSpm) {
        unsigned value = 0;
        if (text.size() == 6 && text.starts_with("<0x") && text.back() == '>' &&
            std::sscanf(text.c_str() + 3, "%2x", &value) == 1) {
          return std::string(1, static_cast<char>(value));
        }
      }
      return {};
    default:  // control, unknown, unused, undefined: not printed (llama.cpp special = false)
      return {};
  }
}

// tokenizer.ggml.model: "gpt2" (byte-level BPE) or "llama" (SentencePiece BPE).
core::Expected<void> Tokenizer::Impl::read_model_type(const gguf::File& file) {
  auto model = file.get<std::string>("tokenizer.ggml.model");
  if (!model) return std::unexpected(model.error());
  if (*model == "gpt2") {
    type = VocabType::kBpe;
  } else if (*model == "llama") {
    type = VocabType::kSpm;
  } else {
    return core::fail(core::Errc::kUnsupported,
                      path + ": tokenizer.ggml.model '" + *model + "' is not supported (expected 'gpt2' or 'llama')");
  }
  return {};
}

// The token texts, their types and scores (one per token; types default to
// normal, scores to 0), and the text → id index.
core::Expected<void> Tokenizer::Impl::read_vocab(const gguf::File& file) {
  auto texts = file.get_string_array("tokenizer.ggml.tokens");
  if (!texts) return std::unexpected(texts.error());
  const size_t n = texts->size();
  if (n == 0 || n > static_cast<size_t>(INT32_MAX)) {
    return core::fail(core::Errc::kFormat,
                      path + ": tokenizer.ggml.tokens has " + std::to_string(n) + " entries, expected 1..2^31-1");
  }
  tokens.reserve(n);
  for (auto sv : *texts) tokens.emplace_back(sv);

  types.assign(n, TokenType::kNormal);
  if (file.has("tokenizer.ggml.token_type")) {
    auto tt = file.get_i32_array("tokenizer.ggml.token_type");
    if (!tt) return std::unexpected(tt.error());
    if (tt->size() != n) {
      return core::fail(core::Errc::kFormat, path + ": tokenizer.ggml.token_type has " + std::to_string(tt->size()) +
                                                 " entries, expected " + std::to_string(n) + " (one per token)");
    }
    for (size_t i = 0; i < n; ++i) {
      const int32_t t = (*tt)[i];
      types[i] = (t >= 0 && t <= 6) ? static_cast<TokenType>(t) : TokenType::kUndefined;
    }
  }
  scores.assign(n, 0.0f);
  if (file.has("tokenizer.ggml.scores")) {
    auto sc = file.get_f32_array("tokenizer.ggml.scores");
    if (!sc) return std::unexpected(sc.error());
    if (sc->size() != n) {
      return core::fail(core::Errc::kFormat, path + ": tokenizer.ggml.scores has " + std::to_string(sc->size()) +
                                                 " entries, expected " + std::to_string(n) + " (one per token)");
    }
    scores = std::move(*sc);
  }

  text_to_id.reserve(n * 2);
  for (size_t i = 0; i < n; ++i) {
    // First occurrence wins for duplicated texts (llama.cpp keeps the last;
    // duplicates do not occur in real vocabularies).
    text_to_id.emplace(std::string_view(tokens[i]), static_cast<TokenId>(i));
  }
  return {};
}

// gpt2: the merge table (rank by line) and the token of each byte's GPT-2 char.
core::Expected<void> Tokenizer::Impl::read_merges(const gguf::File& file) {
  auto lines = file.get_string_array("tokenizer.ggml.merges");
  if (!lines) return std::unexpected(lines.error());
  merges.reserve(lines->size() * 2);
  for (size_t r = 0; r < lines->size(); ++r) {
    const std::string_view m = (*lines)[r];
    const size_t sp = m.find(' ', 1);
    if (sp == std::string_view::npos) {
      return core::fail(core::Errc::kFormat, path + ": tokenizer.ggml.merges[" + std::to_string(r) + "] = '" +
                                                 std::string(m) + "' is not two tokens separated by a space");
    }
    const std::string_view left = m.substr(0, sp), right = m.substr(sp + 1);
    const TokenId a = find(left), b = find(right);
    std::string joined;
    joined.reserve(left.size() + right.size());
    joined.append(left).append(right);
    const TokenId c = find(joined);
    // A merge whose parts or result are not tokens can never yield a token
    // (llama.cpp would fall back to bytes for it); skip it.
    if (a == kNoToken || b == kNoToken || c == kNoToken) continue;
    merges.emplace(pair_key(a, b), MergeInfo{static_cast<int32_t>(r), c});
  }
  const auto& b2u = unicode::byte_to_unicode();
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    unicode::append_utf8(b2u[b], ch);
    byte_token[b] = find(ch);
  }
  return {};
}

// gpt2: tokenizer.ggml.pre (default "default") picks the pre-tokenizer regex
// ("qwen2", "qwen35", else GPT-2's) and whether text is NFC-normalised first.
core::Expected<void> Tokenizer::Impl::read_pretokenizer(const gguf::File& file) {
  auto name = file.has("tokenizer.ggml.pre") ? file.get<std::string>("tokenizer.ggml.pre")
                                             : core::Expected<std::string>(std::string("default"));
  if (!name) return std::unexpected(name.error());
  pre = *name;
  auto regex = (pre == "qwen2")    ? RegexSplitter::qwen2()
               : (pre == "qwen35") ? RegexSplitter::qwen35()
                                   : RegexSplitter::gpt2();
  if (!regex) return std::unexpected(regex.error());
  splitter = std::move(*regex);
  // Qwen2/Qwen3 tokenizer.json: normalizer NFC (Hugging Face, see tokenizer.h).
  // qwen35 follows llama.cpp (no NFC): its goldens tokenize NFD text as is.
  nfc = (pre == "qwen2");
  if (pre != "qwen2" && pre != "qwen35" && pre != "default" && pre != "gpt-2") {
    load_warning = "tokenizer.ggml.pre = '" + pre +
                   "' is not a pre-tokenizer bonsai implements (qwen2, qwen35; default and gpt-2 split as GPT-2): "
                   "text is split with GPT-2's pattern, which may not match the model's training";
  }
  return {};
}

// The bos/eos/unk/pad/eot ids (llama defaults as llama.cpp: unk 0, bos 1,
// eos 2; eot found by name when absent) and whether bos is prepended.
core::Expected<void> Tokenizer::Impl::read_special_ids(const gguf::File& file) {
  const size_t n = tokens.size();
  const bool spm = type == VocabType::kSpm;
  auto bos_id = read_id(file, "tokenizer.ggml.bos_token_id", spm ? 1 : kNoToken, n);
  auto eos_id = read_id(file, "tokenizer.ggml.eos_token_id", spm ? 2 : kNoToken, n);
  auto unk_id = read_id(file, "tokenizer.ggml.unknown_token_id", spm ? 0 : kNoToken, n);
  auto pad_id = read_id(file, "tokenizer.ggml.padding_token_id", kNoToken, n);
  auto eot_id = read_id(file, "tokenizer.ggml.eot_token_id", kNoToken, n);
  for (auto* e : {&bos_id, &eos_id, &unk_id, &pad_id, &eot_id}) {
    if (!*e) return std::unexpected(e->error());
  }
  bos = *bos_id;
  eos = *eos_id;
  unk = *unk_id;
  pad = *pad_id;
  eot = *eot_id;
  if (eot == kNoToken) {
    for (std::string_view name : {"<|im_end|>", "<|eot_id|>", "<end_of_turn>"}) {
      if (TokenId id = find(name); id != kNoToken) {
        eot = id;
        break;
      }
    }
  }
  auto add = read_bool(file, "tokenizer.ggml.add_bos_token", spm);
  if (!add) return std::unexpected(add.error());
  add_bos = *add && bos != kNoToken;
  return {};
}

// End-of-generation set: eos, eot and the control tokens with a known
// end-of-turn text (llama.cpp llama_vocab::impl::load, special_eog_ids).
void Tokenizer::Impl::collect_eog() {
  if (eos != kNoToken) eog.insert(eos);
  if (eot != kNoToken) eog.insert(eot);
  for (std::string_view name :
       {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
        "<EOT>", "_<EOT>", "<|end_of_text|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"}) {
    if (TokenId id = find(name); id != kNoToken && types[id] == TokenType::kControl) {
      eog.insert(id);
    }
  }
}

// Special tokens for partitioning, longest text first (llama.cpp
// cache_special_tokens), ties by id for determinism.
void Tokenizer::Impl::collect_special_tokens() {
  for (size_t i = 0; i < tokens.size(); ++i) {
    const TokenType t = types[i];
    if ((t == TokenType::kControl || t == TokenType::kUserDefined || t == TokenType::kUnknown) && !tokens[i].empty()) {
      special_tokens.push_back(static_cast<TokenId>(i));
    }
  }
  std::sort(special_tokens.begin(), special_tokens.end(), [&](TokenId a, TokenId b) {
    const size_t la = tokens[a].size(), lb = tokens[b].size();
    return la != lb ? la > lb : a < b;
  });
}

// tokenizer.chat_template (or options' override) through ChatTemplate::load;
// bos_token / eos_token are the texts of the BOS / EOS tokens ("" without
// one), as llama.cpp passes them to the template.
core::Expected<void> Tokenizer::Impl::read_chat_template(const gguf::File& file, const ChatTemplateOptions& options) {
  std::string source;
  if (file.has("tokenizer.chat_template")) {
    auto tmpl = file.get<std::string>("tokenizer.chat_template");
    if (!tmpl) return std::unexpected(tmpl.error());
    source = std::move(*tmpl);
  }
  const auto text = [&](TokenId id) {
    return id == kNoToken || id < 0 || static_cast<size_t>(id) >= tokens.size() ? std::string()
                                                                                : std::string(tokens[id]);
  };
  auto t = ChatTemplate::load(source, options, text(bos), text(eos));
  if (!t) return core::fail(t.error().code, path + ": " + t.error().message);
  chat_template = std::move(*t);
  return {};
}

core::Expected<std::shared_ptr<const Tokenizer>> Tokenizer::from_gguf(const gguf::File& file,
                                                                      const ChatTemplateOptions& chat) {
  auto impl = std::make_unique<Impl>();
  impl->path = file.path();
  if (auto r = impl->read_model_type(file); !r) return std::unexpected(r.error());
  if (auto r = impl->read_vocab(file); !r) return std::unexpected(r.error());
  if (impl->type == VocabType::kBpe) {
    if (auto r = impl->read_merges(file); !r) return std::unexpected(r.error());
    if (auto r = impl->read_pretokenizer(file); !r) return std::unexpected(r.error());
  } else {
    auto asp = read_bool(file, "tokenizer.ggml.add_space_prefix", true);
    if (!asp) return std::unexpected(asp.error());
    impl->add_space_prefix = *asp;
  }
  if (auto r = impl->read_special_ids(file); !r) return std::unexpected(r.error());
  impl->collect_eog();
  impl->collect_special_tokens();
  impl->pieces.reserve(impl->tokens.size());
  for (size_t i = 0; i < impl->tokens.size(); ++i) impl->pieces.push_back(impl->make_piece(static_cast<TokenId>(i)));
  if (auto r = impl->read_chat_template(file, chat); !r) return std::unexpected(r.error());
  return std::shared_ptr<const Tokenizer>(new Tokenizer(std::move(impl)));
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

// ---- special-token partitioning --------------------------------------------

// llama.cpp tokenizer_st_partition: for each special token (longest first),
// split every raw fragment at each occurrence of its text. Control and
// unknown tokens take part only with parse_special; user-defined always.
void Tokenizer::Impl::partition(std::string_view text, bool parse_special, std::vector<Fragment>& out) const {
  std::vector<Fragment> frags{Fragment{kNoToken, text}};
  std::vector<Fragment> next;
  for (TokenId sid : special_tokens) {
    const TokenType t = types[sid];
    if (!parse_special && (t == TokenType::kControl || t == TokenType::kUnknown)) continue;
    const std::string& st = tokens[sid];
    bool any = false;
    for (const Fragment& f : frags) {
      if (f.id == kNoToken && f.text.find(st) != std::string_view::npos) {
        any = true;
        break;
      }
    }
    if (!any) continue;
    next.clear();
    for (const Fragment& f : frags) {
      if (f.id != kNoToken) {
        next.push_back(f);
        continue;
      }
      std::string_view rest = f.text;
      for (size_t pos; (pos = rest.find(st)) != std::string_view::npos;) {
        if (pos > 0) next.push_back(Fragment{kNoToken, rest.substr(0, pos)});
        next.push_back(Fragment{sid, {}});
        rest = rest.substr(pos + st.size());
      }
      if (!rest.empty()) next.push_back(Fragment{kNoToken, rest});
    }
    frags.swap(next);
  }
  for (const Fragment& f : frags) {
    if (f.id != kNoToken || !f.text.empty()) out.push_back(f);
  }
}

// ---- byte-level BPE (gpt2) ---------------------------------------------------

void Tokenizer::Impl::bpe_word(std::string_view word, std::vector<TokenId>& out) const {
  if (word.size() > kCacheMaxWordBytes) {
    bpe_word_uncached(word, out);
    return;
  }
  const std::string key(word);
  {
    std::lock_guard<std::mutex> lock(cache_mutex);
    if (auto it = cache.find(key); it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t start = out.size();
  bpe_word_uncached(word, out);
  std::lock_guard<std::mutex> lock(cache_mutex);
  if (cache.size() >= kCacheMaxEntries) cache.clear();
  cache.emplace(key, std::vector<TokenId>(out.begin() + static_cast<ptrdiff_t>(start), out.end()));
}

// Merges the word's byte tokens by rank: always the lowest-rank adjacent pair,
// leftmost on ties (llama.cpp llm_bigram_bpe ordering), using a heap of
// candidate pairs and a linked list of symbols: O(n log n) per word.
void Tokenizer::Impl::bpe_word_uncached(std::string_view word, std::vector<TokenId>& out) const {
  struct Symbol {
    TokenId id;
    int prev, next;
  };
  std::vector<Symbol> sym;
  sym.reserve(word.size());
  for (size_t i = 0; i < word.size(); ++i) {
    sym.push_back(Symbol{byte_token[static_cast<uint8_t>(word[i])], static_cast<int>(i) - 1,
                         i + 1 < word.size() ? static_cast<int>(i) + 1 : -1});
  }
  struct Cand {
    int32_t rank;
    int left, right;
    TokenId left_id, right_id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto consider = [&](int l, int r) {
    if (l < 0 || r < 0) return;
    const TokenId a = sym[l].id, b = sym[r].id;
    if (a == kNoToken || b == kNoToken) return;
    auto it = merges.find(pair_key(a, b));
    if (it == merges.end()) return;
    heap.push(Cand{it->second.rank, l, r, a, b});
  };
  for (int i = 0; i + 1 < static_cast<int>(sym.size()); ++i) consider(i, i + 1);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    Symbol& l = sym[c.left];
    if (l.id != c.left_id || l.next != c.right || sym[c.right].id != c.right_id) continue;  // stale
    Symbol& r = sym[c.right];
    l.id = merges.at(pair_key(c.left_id, c.right_id)).result;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = c.left;
    r.id = kNoToken;  // dead
    r.prev = r.next = -1;
    consider(l.prev, c.left);
    consider(c.left, l.next);
  }
  for (int i = sym.empty() ? -1 : 0; i >= 0; i = sym[i].next) {
    if (sym[i].id != kNoToken) out.push_back(sym[i].id);
  }
}

void Tokenizer::Impl::bpe_text(std::string_view raw, std::vector<TokenId>& out) const {
  std::string text = unicode::sanitize_utf8(raw);
  if (nfc) text = unicode::nfc(text);
  for (std::string_view word : splitter->split(text)) bpe_word(word, out);
}

// ---- SentencePiece-style BPE (llama) ------------------------------------------

TokenId Tokenizer::Impl::spm_byte_token(uint8_t byte) const {
  char buf[8];
  std::snprintf(buf, sizeof buf, "<0x%02X>", byte);
  if (TokenId id = find(buf); id != kNoToken) return id;
  if (TokenId id = find(std::string_view(reinterpret_cast<const char*>(&byte), 1)); id != kNoToken) {
    return id;
  }
  return unk;
}

// llama.cpp llm_tokenizer_spm_session::tokenize: start from UTF-8 characters,
// repeatedly merge the adjacent pair whose concatenation is the token with the
// highest score (leftmost on ties), then resegment symbols that are not
// tokens through the recorded merges, else emit byte tokens.
void Tokenizer::Impl::spm_text(std::string_view text, std::vector<TokenId>& out) const {
  struct Symbol {
    int prev, next;
    size_t off, n;  // bytes of `text`
  };
  std::vector<Symbol> sym;
  for (size_t off = 0; off < text.size();) {
    const uint8_t c = static_cast<uint8_t>(text[off]);
    // llama.cpp unicode_len_utf8: length from the high nibble of the lead byte.
    static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    size_t len = kLen[c >> 4];
    len = std::min(len, text.size() - off);
    const int idx = static_cast<int>(sym.size());
    sym.push_back(Symbol{idx - 1, off + len == text.size() ? -1 : idx + 1, off, len});
    off += len;
  }
  struct Bigram {
    int left, right;
    float score;
    size_t size;
  };
  auto less = [](const Bigram& l, const Bigram& r) {
    return l.score < r.score || (l.score == r.score && l.left > r.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(less)> queue(less);
  std::unordered_map<std::string_view, std::pair<int, int>> rev_merge;
  auto try_add = [&](int l, int r) {
    if (l < 0 || r < 0) return;
    const std::string_view s = text.substr(sym[l].off, sym[l].n + sym[r].n);
    const TokenId id = find(s);
    if (id == kNoToken) return;
    queue.push(Bigram{l, r, scores[id], s.size()});
    rev_merge[s] = {l, r};
  };
  for (int i = 1; i < static_cast<int>(sym.size()); ++i) try_add(i - 1, i);
  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& l = sym[b.left];
    Symbol& r = sym[b.right];
    if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }
  // Resegment (recursive through rev_merge; depth bounded by the symbol count).
  auto resegment = [&](auto&& self, int i) -> void {
    const std::string_view s = text.substr(sym[i].off, sym[i].n);
    if (TokenId id = find(s); id != kNoToken) {
      out.push_back(id);
      return;
    }
    auto it = rev_merge.find(s);
    if (it == rev_merge.end()) {
      for (char ch : s) {
        const TokenId id = spm_byte_token(static_cast<uint8_t>(ch));
        if (id != kNoToken) out.push_back(id);
      }
      return;
    }
    self(self, it->second.first);
    self(self, it->second.second);
  };
  for (int i = sym.empty() ? -1 : 0; i >= 0; i = sym[i].next) resegment(resegment, i);
}

// ---- encode -----------------------------------------------------------------

void Tokenizer::Impl::encode_fragments(const std::vector<Fragment>& frags, std::vector<TokenId>& out) const {
  if (type == VocabType::kBpe) {
    for (const Fragment& f : frags) {
      if (f.id != kNoToken)
        out.push_back(f.id);
      else
        bpe_text(f.text, out);
    }
    return;
  }
  // llama.cpp SPM: a space prefix on every text run that follows a special
  // token or starts the input; spaces become "▁".
  bool prev_special = true;
  std::string escaped;
  for (const Fragment& f : frags) {
    if (f.id != kNoToken) {
      out.push_back(f.id);
      prev_special = true;
      continue;
    }
    escaped.clear();
    if (add_space_prefix && prev_special) escaped.append(kSpmSpace);
    for (char ch : f.text) {
      if (ch == ' ')
        escaped.append(kSpmSpace);
      else
        escaped.push_back(ch);
    }
    spm_text(escaped, out);
    prev_special = false;
  }
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool parse_special) const {
  std::vector<Fragment> frags;
  impl_->partition(text, parse_special, frags);
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 4);
  impl_->encode_fragments(frags, out);
  return out;
}

std::vector<TokenId> Tokenizer::encode_prompt(std::string_view text, bool parse_special) const {
  std::vector<TokenId> out;
  if (impl_->add_bos) out.push_back(impl_->bos);
  std::vector<TokenId> ids = encode(text, parse_special);
  out.insert(out.end(), ids.begin(), ids.end());
  return out;
}

std::vector<TokenId> Tokenizer::encode_chat(const RenderedChat& chat) const {
  // Partition each segment on its own (template: parse_special; supplied
  // text: plain), then join neighbouring raw runs so the text between two
  // special tokens is tokenized as one piece, as for the whole prompt.
  std::vector<Fragment> frags;
  for (const ChatSegment& seg : chat.segments) impl_->partition(seg.text, seg.from_template, frags);
  std::vector<std::string> joined_store;  // owns joined raw runs
  std::vector<Fragment> merged;
  joined_store.reserve(frags.size());
  for (size_t i = 0; i < frags.size();) {
    if (frags[i].id != kNoToken) {
      merged.push_back(frags[i++]);
      continue;
    }
    size_t j = i + 1;
    while (j < frags.size() && frags[j].id == kNoToken) ++j;
    if (j == i + 1) {
      merged.push_back(frags[i]);
    } else {
      std::string s;
      for (size_t k = i; k < j; ++k) s.append(frags[k].text);
      joined_store.push_back(std::move(s));
      merged.push_back(Fragment{kNoToken, joined_store.back()});
    }
    i = j;
  }
  std::vector<TokenId> out;
  if (impl_->add_bos) out.push_back(impl_->bos);
  impl_->encode_fragments(merged, out);
  return out;
}

// ---- decode -----------------------------------------------------------------

std::string_view Tokenizer::token_text(TokenId id) const {
  return impl_->valid(id) ? std::string_view(impl_->tokens[id]) : std::string_view();
}

std::string Tokenizer::token_to_bytes(TokenId id) const { return impl_->valid(id) ? impl_->pieces[id] : std::string(); }

std::string Tokenizer::decode(std::span<const TokenId> ids) const {
  std::string out;
  bool remove_space = impl_->type == VocabType::kSpm && impl_->add_space_prefix;
  for (TokenId id : ids) {
    if (!impl_->valid(id)) {
      remove_space = false;
      continue;
    }
    std::string_view piece = impl_->pieces[id];
    if (remove_space && !piece.empty() && piece.front() == ' ') piece.remove_prefix(1);
    remove_space = false;
    out.append(piece);
  }
  return out;
}

// ---- vocabulary -----------------------------------------------------------------

int32_t Tokenizer::n_vocab() const { return static_cast<int32_t>(impl_->tokens.size()); }
VocabType Tokenizer::vocab_type() const { return impl_->type; }
TokenType Tokenizer::token_type(TokenId id) const {
  return impl_->valid(id) ? impl_->types[id] : TokenType::kUndefined;
}
TokenId Tokenizer::find_token(std::string_view text) const { return impl_->find(text); }
TokenId Tokenizer::bos_id() const { return impl_->bos; }
TokenId Tokenizer::eos_id() const { return impl_->eos; }
TokenId Tokenizer::eot_id() const { return impl_->eot; }
TokenId Tokenizer::unk_id() const { return impl_->unk; }
TokenId Tokenizer::pad_id() const { return impl_->pad; }
bool Tokenizer::add_bos_token() const { return impl_->add_bos; }
bool Tokenizer::is_eog(TokenId id) const { return impl_->eog.contains(id); }
bool Tokenizer::is_control(TokenId id) const { return impl_->valid(id) && impl_->types[id] == TokenType::kControl; }
const ChatTemplate& Tokenizer::chat_template() const { return impl_->chat_template; }

const std::string& Tokenizer::load_warning() const { return impl_->load_warning; }

// ---- incremental decoding ------------------------------------------------------

size_t append_valid_utf8(std::string_view bytes, std::string& out) {
  for (size_t pos = 0; pos < bytes.size();) {
    const size_t len = unicode::valid_utf8_length(bytes, pos);
    if (len > 0) {
      out.append(bytes.substr(pos, len));
      pos += len;
      continue;
    }
    const size_t k = unicode::valid_utf8_prefix(bytes, pos);
    if (k > 0 && pos + k == bytes.size()) return k;    // unfinished character: hold back
    unicode::append_utf8(unicode::kReplacement, out);  // one U+FFFD per maximal subpart
    pos += std::max<size_t>(k, 1);
  }
  return 0;
}

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer) : tokenizer_(&tokenizer) {}

std::string IncrementalDecoder::push(TokenId token) {
  pending_ += tokenizer_->token_to_bytes(token);
  std::string out;
  const size_t keep = append_valid_utf8(pending_, out);
  pending_.erase(0, pending_.size() - keep);
  return out;
}

std::string IncrementalDecoder::flush() {
  std::string out;
  if (!pending_.empty()) unicode::append_utf8(unicode::kReplacement, out);
  pending_.clear();
  return out;
}

}  // namespace bonsai::tokenizer
