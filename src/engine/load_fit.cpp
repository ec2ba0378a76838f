// Whether a model load fits. See load_fit.h.
#include "engine/load_fit.h"

#include <cstdio>

#include "engine/engine_pool.h"  // model_footprint
#include "gguf/gguf.h"           // OpenOptions

namespace bonsai::engine {

namespace {

// "1.5 GiB", "160.0 KiB": sizes in error messages, with enough precision for small models.
std::string size_text(uint64_t bytes) {
  const char* unit = "KiB";
  double v = static_cast<double>(bytes) / 1024.0;
  if (bytes >= (1ull << 30)) {
    unit = "GiB";
    v = static_cast<double>(bytes) / static_cast<double>(1ull << 30);
  } else if (bytes >= (1ull << 20)) {
    unit = "MiB";
    v = static_cast<double>(bytes) / static_cast<double>(1ull << 20);
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.1f %s", v, unit);
  return buf;
}

}  // namespace

uint64_t available_memory_bytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return 0;
  char line[256];
  uint64_t bytes = 0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long long kib = 0;
    if (std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
      bytes = static_cast<uint64_t>(kib) * 1024u;
      break;
    }
  }
  std::fclose(f);
  return bytes;
}

std::optional<LoadFitError> check_load_fit(const std::string& id, const ModelSpec& spec, bool ctx_given,
                                           bool pool_given, uint64_t budget_bytes, uint64_t mem_limit_bytes) {
  model::LoadOptions open;
  open.file.q2_layout = spec.q2_layout;
  open.repack = spec.repack;
  auto fp = model_footprint(spec.path, spec.ctx_size, spec.pool_size, open, spec.kv_type_k, spec.kv_type_v,
                            spec.kv_budget_tokens, spec.parallel);
  if (!fp) return std::nullopt;
  if (ctx_given && spec.ctx_size > 0 && fp->max_ctx > 0 && spec.ctx_size > fp->max_ctx) {
    char factor[32];
    std::snprintf(factor, sizeof factor, "%g", static_cast<double>(fp->rope_scaling_factor));
    return LoadFitError{"Invalid 'ctx_size': " + std::to_string(spec.ctx_size) + " tokens is more than model '" + id +
                            "' supports: at most " + std::to_string(fp->max_ctx) + " (training context " +
                            std::to_string(fp->n_ctx_train) + " x RoPE scaling factor " + factor + ").",
                        "ctx_size", "invalid_value"};
  }
  const uint64_t budget = budget_bytes;
  const uint64_t limit = budget > 0 ? budget : mem_limit_bytes > 0 ? mem_limit_bytes : available_memory_bytes();
  if (limit == 0) return std::nullopt;  // /proc/meminfo unreadable: nothing to compare with
  const uint64_t need = budget > 0 ? fp->total_bytes() : fp->cache_bytes();
  if (need <= limit) return std::nullopt;
  // The context per replica that would fit (0 if not even the mapping and
  // the recurrent states do).
  const uint64_t fixed = (budget > 0 ? fp->mapped_bytes : 0) + fp->states_bytes + fp->snapshot_bytes;
  const uint64_t room = limit > fixed ? limit - fixed : 0;
  const uint64_t per_ctx = fp->kv_bytes_per_position * static_cast<uint64_t>(fp->replicas);
  const uint64_t fit_ctx = per_ctx > 0 ? room / per_ctx : 0;
  std::string msg = "Model '" + id + "' with ctx_size " + std::to_string(fp->n_ctx) + " and " +
                    std::to_string(fp->replicas) + " replica(s) needs " + size_text(fp->kv_bytes) + " of KV cache (" +
                    std::to_string(fp->kv_bytes_per_position) + " bytes per position x " + std::to_string(fp->n_ctx) +
                    " positions x " + std::to_string(fp->replicas) + " replicas" +
                    (fp->kv_budget_tokens != fp->n_ctx * fp->replicas
                         ? ", as a budget of " + std::to_string(fp->kv_budget_tokens) + " positions"
                         : std::string()) +
                    ")";
  if (fp->recurrent_state_bytes > 0) {
    msg += " plus " + size_text(fp->states_bytes) + " of recurrent state (" +
           std::to_string(fp->recurrent_state_bytes) + " bytes per sequence x " + std::to_string(fp->sequences) +
           " parallel sequences) and " + size_text(fp->snapshot_bytes) + " of state snapshots for the prompt cache";
  }
  if (budget > 0) {
    msg += " plus " + size_text(fp->mapped_bytes) + " of mapped weights = " + size_text(need) +
           ", more than the memory budget (--mem-budget) of " + size_text(limit) + ".";
  } else {
    msg += ", more than the " + size_text(limit) +
           (mem_limit_bytes > 0 ? " allowed for one load." : " of memory available (MemAvailable).");
  }
  if (spec.kv_budget_tokens > 0) {  // an explicit KV budget: it, not ctx_size, sets the KV bytes
    const uint64_t fit = fp->kv_bytes_per_position > 0 ? room / fp->kv_bytes_per_position : 0;
    msg += " At most a KV budget of " + std::to_string(fit) + " tokens fits.";
  } else {
    msg += fit_ctx > 0 ? " At most ctx_size " + std::to_string(fit_ctx) + " fits with " + std::to_string(fp->replicas) +
                             " replica(s)."
                       : " It does not fit at any ctx_size.";
  }
  return LoadFitError{std::move(msg), ctx_given ? "ctx_size" : pool_given ? "pool_size" : "", "insufficient_memory"};
}

}  // namespace bonsai::engine
