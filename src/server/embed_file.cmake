# Writes a C++ source defining `std::string_view NAME()` (namespace
# bonsai::server) that returns the bytes of INPUT, for files served from the
# binary (the web chat page). Run as a build step:
#   cmake -DINPUT=in.html -DOUTPUT=out.cpp -DNAME=web_ui_html -P embed_file.cmake
file(READ "${INPUT}" hex HEX)
string(LENGTH "${hex}" hex_len)
math(EXPR n_bytes "${hex_len} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "'\\\\x\\1'," bytes "${hex}")
# One line per 32 bytes keeps the generated file readable by compilers and people.
string(REGEX REPLACE "(('\\\\x[0-9a-f][0-9a-f]',){32})" "\\1\n" bytes "${bytes}")
file(WRITE "${OUTPUT}.tmp"
"// Generated from ${INPUT} by src/server/embed_file.cmake; do not edit.
#include <string_view>
namespace bonsai::server {
namespace {
constexpr char kData[] = {
${bytes}'\\0'};
}  // namespace
std::string_view ${NAME}() { return std::string_view(kData, ${n_bytes}); }
}  // namespace bonsai::server
")
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")
