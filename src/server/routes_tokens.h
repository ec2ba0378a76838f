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

#include <string>
#include <string_view>

#include "server/routes_common.h"  // ServerContext
#include "server/transport.h"      // HttpTransport

namespace bonsai::server {

// Registers the routes above on `http`. `ctx` must outlive `http`'s handlers.
void add_token_routes(HttpTransport& http, ServerContext& ctx);

// RFC 4648 base64 (with '=' padding) of `bytes`: OpenAI's
// encoding_format "base64" (the little-endian float32 array).
std::string base64_encode(std::string_view bytes);

}  // namespace bonsai::server
