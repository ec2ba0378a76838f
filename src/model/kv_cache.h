// KvCache: the keys and values of one sequence, for every layer, by position.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/error.h"
#include "model/config.h"  // ModelConfig

namespace bonsai::model {

// Element type of the cache. F16 is the default, as llama.cpp's (-ctk/-ctv f16).
enum class KvType : uint8_t { kF16, kF32 };

// Per-sequence KV cache. Layout per layer: K [n_head_kv][n_ctx][head_dim_k]
// and V [n_head_kv][n_ctx][head_dim_v] (one head's positions contiguous, so
// attention streams through memory). Slot = position.
//
// size() is the number of positions held (0..size()-1 are valid). forward()
// writes a sequence's tokens at positions p0..p0+m-1 with p0 <= size()
// (p0 < size() overwrites, i.e. drops positions >= p0 first), and then
// size() == p0 + m. Not thread-safe: one forward() at a time per cache.
// Movable, not copyable (the buffer may be gigabytes).
class KvCache {
 public:
  // Allocates n_ctx positions for `config`'s layers and KV heads.
  // Errors: kInvalidArgument if n_ctx < 1 or n_ctx > 2^31-1,
  // kResourceExhausted if the allocation fails.
  static core::Expected<KvCache> create(const ModelConfig& config, int64_t n_ctx,
                                        KvType type = KvType::kF16);

  KvCache() = default;
  KvCache(KvCache&&) noexcept = default;
  KvCache& operator=(KvCache&&) noexcept = default;
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  int64_t n_ctx() const { return n_ctx_; }   // capacity in positions
  int64_t size() const { return size_; }     // positions currently held
  KvType type() const { return type_; }
  size_t bytes() const { return bytes_; }  // allocated bytes (K and V, all layers)

  void clear() { size_ = 0; }                     // forget every position (no free)
  void truncate(int64_t n) { if (n < size_) size_ = n < 0 ? 0 : n; }  // keep 0..n-1

  // Raw access for the forward pass. Element size 2 (F16 bits) or 4 (F32).
  // K of layer l, KV head h, position p starts at k_row(l, h, p).
  size_t elem_size() const { return type_ == KvType::kF16 ? 2 : 4; }
  uint8_t* k_row(int64_t layer, int64_t head, int64_t pos) {
    return data_.get() + elem_size() * static_cast<size_t>(
        layer * layer_elems_ + (head * n_ctx_ + pos) * head_dim_k_);
  }
  uint8_t* v_row(int64_t layer, int64_t head, int64_t pos) {
    return data_.get() + elem_size() * static_cast<size_t>(
        layer * layer_elems_ + n_head_kv_ * n_ctx_ * head_dim_k_ + (head * n_ctx_ + pos) * head_dim_v_);
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
  // [n_layer][K: n_head_kv*n_ctx*head_dim_k, V: n_head_kv*n_ctx*head_dim_v].
  // Not zero-filled: a slot is written before it is read, and the OS commits
  // the pages of a large allocation only as the context fills.
  std::unique_ptr<uint8_t[]> data_;
  size_t bytes_ = 0;
  KvType type_ = KvType::kF16;
  int64_t n_ctx_ = 0;
  int64_t size_ = 0;
  int64_t n_layer_ = 0;
  int64_t n_head_kv_ = 0;
  int64_t head_dim_k_ = 0;
  int64_t head_dim_v_ = 0;
  int64_t layer_elems_ = 0;  // K + V elements of one layer
};

}  // namespace bonsai::model
