#include "model/kv_cache.h"

#include <cstdint>
#include <new>
#include <string>

namespace bonsai::model {

core::Expected<KvCache> KvCache::create(const ModelConfig& config, int64_t n_ctx, KvType type) {
  if (n_ctx < 1 || n_ctx > INT32_MAX) {
    return core::fail(core::Errc::kInvalidArgument,
                      "KV cache: context size " + std::to_string(n_ctx) + " must be in 1..2^31-1");
  }
  if (config.n_layer <= 0 || config.n_head_kv <= 0 || config.head_dim_k <= 0 ||
      config.head_dim_v <= 0) {
    return core::fail(core::Errc::kInvalidArgument, "KV cache: model config has no layers/heads");
  }
  KvCache c;
  c.type_ = type;
  c.n_ctx_ = n_ctx;
  c.n_layer_ = config.n_layer;
  c.n_head_kv_ = config.n_head_kv;
  c.head_dim_k_ = config.head_dim_k;
  c.head_dim_v_ = config.head_dim_v;
  c.layer_elems_ = config.n_head_kv * n_ctx * (config.head_dim_k + config.head_dim_v);
  const long double total = static_cast<long double>(c.layer_elems_) * config.n_layer * c.elem_size();
  if (total > static_cast<long double>(SIZE_MAX / 2)) {
    return core::fail(core::Errc::kResourceExhausted, "KV cache: size overflows");
  }
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
