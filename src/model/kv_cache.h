// KvCache: the keys and values of one sequence, for every layer, by position.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "core/error.h"
#include "model/config.h"  // ModelConfig

namespace bonsai::model {

// Element type of the K or V half of the cache. F16 is the default, as
// llama.cpp's (-ctk/-ctv f16). kQ8_0 is ggml's block_q8_0 (fp16 d + 32 int8,
// 34 bytes per 32 values; needs a head dim that is a multiple of 32).
enum class KvType : uint8_t { kF16, kF32, kQ8_0 };

// llama.cpp's names for the -ctk/-ctv values: "f16", "f32", "q8_0".
const char* kv_type_name(KvType t);
// Parses a -ctk/-ctv value (case-sensitive, llama.cpp's spelling).
// Errors: kInvalidArgument "cache type 'q4_0' is not supported (f16, f32, q8_0)".
core::Expected<KvType> parse_kv_type(std::string_view name);
// Bytes of one cached row of n values (n a multiple of 32 for kQ8_0).
size_t kv_row_bytes(KvType t, int64_t n);

// Per-sequence KV cache. Layout per layer: K [n_head_kv][n_ctx][row_k] and
// V [n_head_kv][n_ctx][row_v], a row being one position of one head in the
// half's type (kv_row_bytes(type, head_dim) bytes; one head's positions
// contiguous, so attention streams through memory). Slot = position.
//
// size() is the number of positions held (0..size()-1 are valid). forward()
// writes a sequence's tokens at positions p0..p0+m-1 with p0 <= size()
// (p0 < size() overwrites, i.e. drops positions >= p0 first), and then
// size() == p0 + m. Not thread-safe: one forward() at a time per cache.
// Movable, not copyable (the buffer may be gigabytes).
class KvCache {
 public:
  // Allocates n_ctx positions for `config`'s layers and KV heads, K in
  // type_k and V in type_v.
  // Errors: kInvalidArgument if n_ctx < 1 or n_ctx > 2^31-1, or kQ8_0 for a
  // head dim that is not a multiple of 32; kResourceExhausted if the
  // allocation fails.
  static core::Expected<KvCache> create(const ModelConfig& config, int64_t n_ctx, KvType type_k,
                                        KvType type_v);
  // Both halves in `type`.
  static core::Expected<KvCache> create(const ModelConfig& config, int64_t n_ctx,
                                        KvType type = KvType::kF16) {
    return create(config, n_ctx, type, type);
  }
  // Bytes one position takes in every layer (K and V of all KV heads): what
  // create() allocates per unit of n_ctx. Used by memory budgets.
  static uint64_t bytes_per_position(const ModelConfig& config, KvType type_k, KvType type_v);

  KvCache() = default;
  KvCache(KvCache&&) noexcept = default;
  KvCache& operator=(KvCache&&) noexcept = default;
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  int64_t n_ctx() const { return n_ctx_; }   // capacity in positions
  int64_t size() const { return size_; }     // positions currently held
  KvType type() const { return type_k_; }  // K's type (== V's unless created with two)
  KvType type_k() const { return type_k_; }
  KvType type_v() const { return type_v_; }
  size_t bytes() const { return bytes_; }  // allocated bytes (K and V, all layers)

  void clear() { size_ = 0; }                     // forget every position (no free)
  void truncate(int64_t n) { if (n < size_) size_ = n < 0 ? 0 : n; }  // keep 0..n-1

  // Raw access for the forward pass. K of layer l, KV head h, position p
  // starts at k_row(l, h, p) and takes k_row_bytes() bytes (type_k()); the
  // rows of positions p, p+1, ... of one head follow each other.
  size_t k_row_bytes() const { return row_k_; }
  size_t v_row_bytes() const { return row_v_; }
  uint8_t* k_row(int64_t layer, int64_t head, int64_t pos) {
    return data_.get() + static_cast<size_t>(layer) * layer_bytes_ +
           static_cast<size_t>(head * n_ctx_ + pos) * row_k_;
  }
  uint8_t* v_row(int64_t layer, int64_t head, int64_t pos) {
    return data_.get() + static_cast<size_t>(layer) * layer_bytes_ +
           static_cast<size_t>(n_head_kv_ * n_ctx_) * row_k_ +
           static_cast<size_t>(head * n_ctx_ + pos) * row_v_;
  }
  const uint8_t* k_row(int64_t layer, int64_t head, int64_t pos) const {
    return const_cast<KvCache*>(this)->k_row(layer, head, pos);
  }
  const uint8_t* v_row(int64_t layer, int64_t head, int64_t pos) const {
    return const_cast<KvCache*>(this)->v_row(layer, head, pos);
  }
  void set_size(int64_t n) { size_ = n; }  // forward() only

  // Whether this cache was made for a model with these dimensions.
  bool matches(const ModelConfig& c) const {
    return n_layer_ == c.n_layer && n_head_kv_ == c.n_head_kv && head_dim_k_ == c.head_dim_k &&
           head_dim_v_ == c.head_dim_v;
  }

 private:
  // [n_layer][K: n_head_kv*n_ctx rows of row_k_, V: n_head_kv*n_ctx rows of row_v_].
  // Not zero-filled: a slot is written before it is read, and the OS commits
  // the pages of a large allocation only as the context fills.
  std::unique_ptr<uint8_t[]> data_;
  size_t bytes_ = 0;
  KvType type_k_ = KvType::kF16;
  KvType type_v_ = KvType::kF16;
  int64_t n_ctx_ = 0;
  int64_t size_ = 0;
  int64_t n_layer_ = 0;
  int64_t n_head_kv_ = 0;
  int64_t head_dim_k_ = 0;
  int64_t head_dim_v_ = 0;
  size_t row_k_ = 0;        // bytes of one K row (one head, one position)
  size_t row_v_ = 0;
  size_t layer_bytes_ = 0;  // K + V bytes of one layer
};

}  // namespace bonsai::model
