// The server's small utility routes (internal to src/server), in
// llama-server's and OpenAI's shapes:
//   POST /tokenize     {"content": str, "add_special"?: bool (false),
//                       "parse_special"?: bool (true), "with_pieces"?: bool
//                       (false), "model"?: str} -> {"tokens": [id, ..]}, or
//                      with_pieces {"tokens": [{"id", "piece"}, ..]} (piece: a
//                      string, or the byte values when not valid UTF-8)
//   POST /detokenize   {"tokens": [id, ..], "model"?} -> {"content": str}
//   POST /v1/embeddings  OpenAI: {"input": str | [str] | [id] | [[id]],
//                      "model"?, "encoding_format"?: "float" | "base64"} ->
//                      {"object": "list", "data": [{"object": "embedding",
//                      "index", "embedding"}], "model", "usage":
//                      {"prompt_tokens", "total_tokens"}}
// "model" picks the model (default: the server's default model). An
// embedding is the mean over the input's tokens of the model's final hidden
// state after the output norm, L2-normalised (InferenceEngine::embed's
// definition); it runs as a job of the model's scheduler (one sequence per
// input, sharing forward steps with the running streams; the same queue
// bound, deadline and disconnect cancellation as completions), never on
// the HTTP thread.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/job_pump.h"       // SubmittedJob
#include "server/routes_common.h"  // ServerContext
#include "server/transport.h"      // HttpTransport

namespace bonsai::server {

// Registers the routes above on `http`. `ctx` must outlive `http`'s handlers.
void add_token_routes(HttpTransport& http, ServerContext& ctx);

// How an embeddings job answers, for a route of another dialect that
// submits through POST /v1/embeddings' path (Ollama's /api/embed): the body
// of a finished job and the writer of an error answer (submit-time errors
// included). Both run on the job's pump thread (errors found at submit: on
// the route's thread).
struct EmbeddingsDialect {
  // The 200 body: one embedding per input (in order, each [n_embd], L2-normalised),
  // the id of the model that computed them and the input tokens in all.
  std::function<nlohmann::json(std::vector<std::vector<float>> embeddings, const std::string& model_id,
                               int64_t prompt_tokens)>
      body;
  ErrorWriter error = send_error;
  // Ollama's truncate: an input longer than the model's context is cut to
  // its first n_ctx tokens (and counted so) instead of a 400.
  bool truncate = false;
};

// Parses `body` (the OpenAI /v1/embeddings request above: "input",
// "model", "encoding_format"), tokenizes and submits it to the model's
// scheduler, admitted at `admitted`: the job for its JobPump, or nullopt
// with the error answer written in `res` (by dialect.error). With
// dialect.body unset, the answer is OpenAI's list object.
std::optional<SubmittedJob> submit_embeddings(ServerContext& ctx, const std::string& body, HttpResponse& res,
                                              engine::Clock::time_point admitted, EmbeddingsDialect dialect = {});

// RFC 4648 base64 (with '=' padding) of `bytes`: OpenAI's
// encoding_format "base64" (the little-endian float32 array).
std::string base64_encode(std::string_view bytes);

}  // namespace bonsai::server
