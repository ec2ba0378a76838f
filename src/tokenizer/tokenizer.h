// Tokenizer built from a GGUF's `tokenizer.*` metadata, matching llama.cpp
// (src/llama-vocab.cpp) and, where they differ on Qwen3, Hugging Face.
//
// Two vocabularies (`tokenizer.ggml.model`):
//   - "gpt2":  byte-level BPE (GPT-2 bytes<->unicode table, merges by rank
//              from `tokenizer.ggml.merges`). Pre-tokenizer chosen by
//              `tokenizer.ggml.pre`; "qwen2" (Qwen2/Qwen3) uses the regex
//              llama.cpp uses for qwen2 (Unicode categories via PCRE2) and
//              NFC-normalizes text first, as Qwen3's tokenizer.json declares
//              (llama.cpp skips NFC; we follow Hugging Face, which the model
//              was trained with). "qwen35" (Qwen3.5, the 27B Bonsai family)
//              uses llama.cpp's qwen35 regex (combining marks stay inside
//              words) without NFC, so decomposed text such as "e\u0301"
//              gives llama.cpp's ids (the qwen35 goldens pin this). Other
//              `pre` values (or none) fall back to the GPT-2 regex.
//   - "llama": SentencePiece-style BPE (merge the adjacent pair whose token
//              has the highest score), "▁" for spaces, a space prefix on
//              each text run (`tokenizer.ggml.add_space_prefix`, default
//              true), byte fallback to "<0xNN>" tokens.
//
// Special tokens: token types (`tokenizer.ggml.token_type`) control (3) and
// unknown (2) are recognised in text only with parse_special; user-defined
// (4: e.g. <think>, <tool_call>) are always recognised, as in llama.cpp and
// Hugging Face. Unused (5) tokens (Qwen's [PAD...]) are not special: their
// text is never matched as a token.
//
// Thread safety: a Tokenizer is immutable after from_gguf; all const methods
// may be called concurrently (the BPE word cache is internally locked).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "gguf/gguf.h"
#include "tokenizer/chat_template.h"

namespace bonsai::tokenizer {

using TokenId = int32_t;
// "No such token" (GGUF ids of -1 / 4294967295 also mean none).
inline constexpr TokenId kNoToken = -1;

// llama.cpp's llama_token_type values as stored in `tokenizer.ggml.token_type`.
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

enum class VocabType {
  kBpe,  // "gpt2": byte-level BPE
  kSpm,  // "llama": SentencePiece-style BPE with byte fallback
};

class Tokenizer {
 public:
  // Builds the tokenizer from a GGUF's metadata; the strings are copied, so
  // the result does not keep `file` alive. Errors (message names the file and
  // key): kNotFound for a missing required key (tokens, model; merges for
  // gpt2; scores are optional for llama), kFormat for arrays of mismatched
  // length, bad merges or out-of-range special ids, kUnsupported for another
  // `tokenizer.ggml.model`; ChatTemplate::load's kUnsupported for a chat
  // template (the GGUF's, or `chat`'s override) the Jinja interpreter cannot
  // parse. `chat` chooses the chat template (--jinja, --chat-template).
  static core::Expected<std::shared_ptr<const Tokenizer>> from_gguf(const gguf::File& file,
                                                                    const ChatTemplateOptions& chat = {});

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // ---- encoding ----------------------------------------------------------

  // Token ids of `text`. Never adds BOS/EOS. Any bytes are accepted: for
  // gpt2, each byte that is not valid UTF-8 becomes U+FFFD before
  // pre-tokenization (as llama.cpp does); for llama, characters without a
  // token fall back to <0xNN> byte tokens (or unk when there are none).
  // parse_special: recognise control tokens' text (e.g. "<|im_end|>") as
  // those tokens; otherwise such text is tokenized as plain characters.
  std::vector<TokenId> encode(std::string_view text, bool parse_special = false) const;

  // As encode, with BOS prepended when the GGUF says add_bos_token (llama:
  // default true; Qwen: false) — llama.cpp's `add_special = true`.
  std::vector<TokenId> encode_prompt(std::string_view text, bool parse_special = false) const;

  // Token ids of a rendered chat (BOS prepended when add_bos_token()).
  // Special tokens are recognised only inside template segments; runs of text
  // between two recognised special tokens are tokenized as one piece of text
  // even when they span template and user segments (so the ids equal
  // llama.cpp's tokenization of the whole prompt whenever no user text
  // contains special-token text).
  std::vector<TokenId> encode_chat(const RenderedChat& chat) const;

  // ---- decoding ----------------------------------------------------------

  // The token's text as stored in the vocabulary ("Ġthe", "▁the", "<0x0A>",
  // "<|im_end|>"). Empty for an out-of-range id. View into this Tokenizer.
  std::string_view token_text(TokenId id) const;

  // The raw bytes the token stands for when printed (llama.cpp
  // token_to_piece with special = false): gpt2 → byte-level decoded text;
  // llama → "▁" as space, "<0xNN>" as byte NN; user-defined tokens → their
  // text; control, unknown-range and unused tokens → "" (llama.cpp does not
  // print special tokens unless asked). May be a partial UTF-8 character.
  std::string token_to_bytes(TokenId id) const;

  // The text of a token sequence: the concatenation of token_to_bytes, except
  // that for llama vocabularies with a space prefix the leading space of the
  // FIRST token is removed (llama.cpp llama_detokenize with remove_special =
  // false). So decode(encode(x)) == x for both vocabularies, and
  // decode([BOS, ...]) keeps the space after BOS like llama.cpp's output.
  // Invalid UTF-8 is returned as is (use IncrementalDecoder for display).
  std::string decode(std::span<const TokenId> ids) const;

  // ---- vocabulary --------------------------------------------------------

  int32_t n_vocab() const;
  VocabType vocab_type() const;
  TokenType token_type(TokenId id) const;  // kUndefined for out-of-range ids
  // Id of the token whose text is exactly `text`, or kNoToken.
  TokenId find_token(std::string_view text) const;

  TokenId bos_id() const;  // kNoToken when the GGUF has none
  TokenId eos_id() const;
  // End of turn: `tokenizer.ggml.eot_token_id`, else the token named
  // "<|im_end|>" / "<|eot_id|>" / "<end_of_turn>" when present, else kNoToken.
  TokenId eot_id() const;
  TokenId unk_id() const;
  TokenId pad_id() const;
  bool add_bos_token() const;  // `tokenizer.ggml.add_bos_token` (llama default true)

  // End of generation (llama.cpp's EOG set): eos, eot, and control tokens
  // named <|im_end|>, <|endoftext|>, <|eot_id|>, <|eom_id|>, <|end|>,
  // <end_of_turn>, <|end_of_text|>, <EOT>, <|fim_pad|>, <|repo_name|>,
  // <|file_sep|>.
  bool is_eog(TokenId id) const;
  // Control token (type 3): renders as nothing in token_to_bytes.
  bool is_control(TokenId id) const;

  // The chat template chosen at from_gguf (by default the GGUF's
  // `tokenizer.chat_template` through Jinja; plain ChatML if absent).
  const ChatTemplate& chat_template() const;

  // What the loaded tokenizer does differently from the file's intent, for
  // the commands to print as a warning; empty when nothing. Today: a BPE
  // `tokenizer.ggml.pre` bonsai does not implement (anything but "qwen2",
  // "qwen35", "default", "gpt-2" or none), whose text is then split with
  // GPT-2's pattern, which may not be how the model was trained (llama.cpp
  // refuses such a file). One line naming the key and the value.
  const std::string& load_warning() const;

  struct Impl;  // defined in tokenizer.cpp

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Streams token ids to text without ever splitting a UTF-8 character.
// push() returns only complete characters, holding back the bytes of an
// unfinished one until the next token completes it; invalid bytes (a stray
// continuation byte, a lead byte followed by a non-continuation) are emitted
// as U+FFFD as soon as they are known to be invalid. Control tokens produce no
// text (as token_to_bytes). The output is the plain concatenation of
// token_to_bytes (no leading-space removal), which is what llama.cpp streams.
// Not thread-safe; one per stream. Keeps a reference to the Tokenizer, which
// must outlive it.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer);

  // Appends the token's bytes; returns the complete characters now available
  // (possibly empty).
  std::string push(TokenId token);
  // Returns what is held back (an unfinished character at end of stream) as
  // U+FFFD per invalid sequence, and resets the held bytes.
  std::string flush();
  // Bytes currently held back (0..3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tokenizer_;
  std::string pending_;
};

// Splits `bytes` into the longest prefix of complete, valid UTF-8 (with any
// invalid sequence replaced by U+FFFD, appended to `out`) and returns the
// number of trailing bytes that form a possibly-valid unfinished character.
// Used by IncrementalDecoder; exposed for tests and the server's stop-string
// matcher.
size_t append_valid_utf8(std::string_view bytes, std::string& out);

}  // namespace bonsai::tokenizer
