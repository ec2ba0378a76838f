// The web chat page served at GET / (src/server/web/index.html, embedded in
// the binary at build time by src/server/embed_file.cmake). One
// self-contained HTML document: no external scripts, styles or fonts, so it
// works offline; it talks to the same server's /v1/models and
// /v1/chat/completions (streaming) and keeps conversations in the browser's
// localStorage.
#pragma once

#include <string_view>

namespace bonsai::server {

// The page's bytes (UTF-8 HTML); static storage, valid for the process lifetime.
std::string_view web_ui_html();

}  // namespace bonsai::server
