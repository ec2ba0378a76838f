// POST /apply-template (llama-server's route): renders a chat request's
// conversation with the model's chat template and returns the prompt text,
// without generating.
//   body: a /v1/chat/completions body ("messages", "tools", "model"?,
//         "chat_template_kwargs": {"enable_thinking"}) plus
//         "add_generation_prompt"?: bool (true, as llama-server)
//   200:  {"prompt": str}, the text the model would be prompted with
//   400:  a malformed request, or the template refused the conversation
//         (raise_exception's message) or exceeded its bounds.
#pragma once

#include "server/routes_common.h"  // ServerContext
#include "server/transport.h"      // HttpTransport

namespace bonsai::server {

// Registers POST /apply-template on `http`. `ctx` must outlive `http`'s handlers.
void add_template_routes(HttpTransport& http, ServerContext& ctx);

}  // namespace bonsai::server
