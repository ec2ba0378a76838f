#include "model/kv_cache.h"

#include <cstdint>
#include <new>
#include <string>

namespace bonsai::model {

const char* kv_type_name(KvType t) {
  switch (t) {
    case KvType::kF16: return "f16";
    case KvType::kF32: return "f32";
    case KvType::kQ8_0: return "q8_0";
  }
  return "?";
}

core::Expected<KvType> parse_kv_type(std::string_view name) {
  for (KvType t : {KvType::kF16, KvType::kF32, KvType::kQ8_0}) {
    if (name == kv_type_name(t)) return t;
  }
  return core::fail(core::Errc::kInvalidArgument,
                    "cache type '" + std::string(name) + "' is not supported (f16, f32, q8_0)");
}

size_t kv_row_bytes(KvType t, int64_t n) {
  switch (t) {
    case KvType::kF16: return static_cast<size_t>(n) * 2;
    case KvType::kF32: return static_cast<size_t>(n) * 4;
    case KvType::kQ8_0: return static_cast<size_t>(n / 32) * 34;  // block_q8_0: fp16 d + 32 int8
  }
  return 0;
}

uint64_t KvCache::bytes_per_position(const ModelConfig& c, KvType type_k, KvType type_v) {
  return static_cast<uint64_t>(c.n_layer) * static_cast<uint64_t>(c.n_head_kv) *
         (kv_row_bytes(type_k, c.head_dim_k) + kv_row_bytes(type_v, c.head_dim_v));
}

core::Expected<KvCache> KvCache::create(const ModelConfig& config, int64_t n_ctx, KvType type_k,
                                        KvType type_v) {
  if (n_ctx < 1 || n_ctx > INT32_MAX) {
    return core::fail(core::Errc::kInvalidArgument,
                      "KV cache: context size " + std::to_string(n_ctx) + " must be in 1..2^31-1");
  }
  if (config.n_layer <= 0 || config.n_head_kv <= 0 || config.head_dim_k <= 0 ||
      config.head_dim_v <= 0) {
    return core::fail(core::Errc::kInvalidArgument, "KV cache: model config has no layers/heads");
  }
  if ((type_k == KvType::kQ8_0 && config.head_dim_k % 32 != 0) ||
      (type_v == KvType::kQ8_0 && config.head_dim_v % 32 != 0)) {
    return core::fail(core::Errc::kInvalidArgument,
                      "KV cache: cache type q8_0 needs head dims that are multiples of 32 (K " +
                          std::to_string(config.head_dim_k) + ", V " +
                          std::to_string(config.head_dim_v) + ")");
  }
  KvCache c;
  c.type_k_ = type_k;
  c.type_v_ = type_v;
  c.n_ctx_ = n_ctx;
  c.n_layer_ = config.n_layer;
  c.n_head_kv_ = config.n_head_kv;
  c.head_dim_k_ = config.head_dim_k;
  c.head_dim_v_ = config.head_dim_v;
  c.row_k_ = kv_row_bytes(type_k, config.head_dim_k);
  c.row_v_ = kv_row_bytes(type_v, config.head_dim_v);
  const long double layer = static_cast<long double>(config.n_head_kv) * n_ctx * (c.row_k_ + c.row_v_);
  const long double total = layer * config.n_layer;
  if (total > static_cast<long double>(SIZE_MAX / 2)) {
    return core::fail(core::Errc::kResourceExhausted, "KV cache: size overflows");
  }
  c.layer_bytes_ = static_cast<size_t>(layer);
  c.bytes_ = static_cast<size_t>(total);
  c.data_.reset(new (std::nothrow) uint8_t[c.bytes_]);  // default-initialised: no zero fill
  if (!c.data_) {
    return core::fail(core::Errc::kResourceExhausted,
                      "KV cache: cannot allocate " + std::to_string(c.bytes_) + " bytes for " +
                          std::to_string(n_ctx) + " positions");
  }
  return c;
}

}  // namespace bonsai::model
