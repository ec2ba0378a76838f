#include "model/kv_cache.h"

#include <cstdint>
#include <new>
#include <stdexcept>
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
  try {
    c.data_.resize(static_cast<size_t>(total));
  } catch (const std::bad_alloc&) {
    return core::fail(core::Errc::kResourceExhausted,
                      "KV cache: cannot allocate " + std::to_string(static_cast<uint64_t>(total)) +
                          " bytes for " + std::to_string(n_ctx) + " positions");
  } catch (const std::length_error&) {
    return core::fail(core::Errc::kResourceExhausted, "KV cache: size too large");
  }
  return c;
}

}  // namespace bonsai::model
