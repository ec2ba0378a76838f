#!/usr/bin/env bash
# clang-format over the C++ sources with the repo's .clang-format.
#   scripts/format.sh          rewrite the files in place
#   scripts/format.sh --check  list the files that are not formatted; exit 1 if any
# Generated and vendored files are not ours to format (none are tracked today).
set -euo pipefail
cd "$(dirname "$0")/.."
CF="${CLANG_FORMAT:-clang-format}"
command -v "$CF" >/dev/null || { echo "format: $CF not found (apt-get install clang-format)" >&2; exit 1; }
mapfile -t files < <(git ls-files '*.cpp' '*.h' '*.inc' '*.cc' '*.hpp')
if [ "${1:-}" = "--check" ]; then
  bad=0
  for f in "${files[@]}"; do
    if ! "$CF" --dry-run -Werror "$f" >/dev/null 2>&1; then echo "format: not clean: $f"; bad=1; fi
  done
  [ $bad -eq 0 ] && echo "format: ${#files[@]} files clean"
  exit $bad
fi
"$CF" -i "${files[@]}"
echo "format: formatted ${#files[@]} files"
