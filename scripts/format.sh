#!/usr/bin/env bash
# clang-format over the C++ sources with the repo's .clang-format.
#   scripts/format.sh          rewrite the files in place
#   scripts/format.sh --check  list the files that are not formatted; exit 1 if any
# The files: every tracked *.cpp, *.cc, *.h, *.hpp, *.inc (git ls-files, so
# build folders and untracked files are never touched). Generated and
# vendored files are not ours to format (none are tracked today).
# One clang-format process for all files: the check takes a few seconds.
# Needs Debian's clang-format (14 on Debian 12; env CLANG_FORMAT overrides).
set -euo pipefail
cd "$(dirname "$0")/.."
CF="${CLANG_FORMAT:-clang-format}"
command -v "$CF" >/dev/null || { echo "format: $CF not found (apt-get install clang-format)" >&2; exit 1; }
mapfile -t files < <(git ls-files -- '*.cpp' '*.cc' '*.h' '*.hpp' '*.inc')
[ ${#files[@]} -gt 0 ] || { echo "format: no C++ files tracked" >&2; exit 1; }
if [ "${1:-}" = "--check" ]; then
  # --dry-run -Werror reports each unformatted spot as "FILE:LINE:COL: error: ..."
  # and exits non-zero; a file clang-format cannot parse fails the same way.
  if out=$("$CF" --dry-run -Werror "${files[@]}" 2>&1); then
    echo "format: ${#files[@]} files clean"
    exit 0
  fi
  bad=$(printf '%s\n' "$out" | sed -n 's/^\([^:]*\):[0-9]*:[0-9]*: error: .*/\1/p' | sort -u)
  if [ -z "$bad" ]; then
    printf '%s\n' "$out" >&2  # not a formatting report: show what clang-format said
    exit 1
  fi
  printf 'format: not clean: %s\n' $bad
  echo "format: $(printf '%s\n' "$bad" | wc -l) of ${#files[@]} files not clean (scripts/format.sh fixes them)"
  exit 1
fi
"$CF" -i "${files[@]}"
echo "format: formatted ${#files[@]} files"
