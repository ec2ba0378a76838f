// Whether a model load fits before anything is allocated (the server's
// POST /admin/models/load): the context against what the model supports,
// and the KV caches (or mapping + KV caches) against the memory there is.
// Reads the GGUF header only (engine::model_footprint).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "engine/model_pool.h"  // ModelSpec

namespace bonsai::engine {

// MemAvailable from /proc/meminfo in bytes (the kernel's estimate of memory
// available to new allocations without swapping); 0 if it cannot be read.
uint64_t available_memory_bytes();

// Why a load does not fit: a message naming the model, the sizes and the
// largest ctx_size that would fit; the request field at fault ("ctx_size",
// "pool_size" or empty); and the API error code ("invalid_value" for a
// context beyond the model, "insufficient_memory").
struct LoadFitError {
  std::string message;
  std::string param;
  std::string code;
};

// Checks loading model `id` from `spec` (path, ctx_size, pool_size,
// q2_layout):
//  - `ctx_given` (the request named ctx_size) and spec.ctx_size > the
//    model's max_ctx (the training context x the RoPE scaling factor):
//    refused (ctx_size 0 stays allowed: the model's default context);
//  - `budget_bytes` > 0 (ModelPool's --mem-budget): mapping + KV caches
//    (n_layer x n_head_kv x (head_dim_k + head_dim_v) x ctx x the bytes of
//    spec.kv_type_k / kv_type_v x replicas), plus for a hybrid model the
//    recurrent states of spec.parallel sequences and the state-snapshot
//    budget (ModelFootprint), must fit it (ModelPool would otherwise refuse the model only later, as
//    a 503 that retrying never cures);
//  - otherwise the KV caches (and states) must fit `mem_limit_bytes`, or when that is 0
//    available_memory_bytes() (the caches are committed lazily, so an
//    oversized one would not fail at load but kill the process later).
// nullopt: it fits, or the header cannot be read (left to the loader's own
// error), or there is nothing to compare with (/proc/meminfo unreadable).
std::optional<LoadFitError> check_load_fit(const std::string& id, const ModelSpec& spec, bool ctx_given,
                                           bool pool_given, uint64_t budget_bytes, uint64_t mem_limit_bytes);

}  // namespace bonsai::engine
