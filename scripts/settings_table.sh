#!/usr/bin/env bash
# Writes `bonsai serve --help-markdown` (the settings table, generated from
# src/server/config.cpp's one table) into README.md between
#   <!-- serve-settings:begin --> and <!-- serve-settings:end -->
# server_unit_test's Settings.ReadmeTableIsTheGeneratedOne fails until this
# runs after a setting is added, removed or reworded.
#   scripts/settings_table.sh [path/to/bonsai]   (default: build/apps/bonsai/bonsai)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${1:-build/apps/bonsai/bonsai}"
[ -x "$BIN" ] || { echo "settings_table: $BIN not found (build the bonsai target first)" >&2; exit 1; }
table=$(mktemp)
trap 'rm -f "$table" README.md.tmp' EXIT
"$BIN" serve --help-markdown >"$table"
grep -q '^<!-- serve-settings:begin -->$' README.md && grep -q '^<!-- serve-settings:end -->$' README.md ||
  { echo "settings_table: README.md lacks the serve-settings markers" >&2; exit 1; }
awk -v table="$table" '
  /^<!-- serve-settings:begin -->$/ { print; while ((getline line < table) > 0) print line; skip = 1; next }
  /^<!-- serve-settings:end -->$/ { skip = 0 }
  !skip { print }
' README.md >README.md.tmp
mv README.md.tmp README.md
echo "settings_table: README.md has $(($(wc -l <"$table") - 2)) settings"
