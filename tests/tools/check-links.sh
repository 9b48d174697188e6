#!/usr/bin/env bash
# Relative links of the Markdown docs (run by `make unit`): every
# [text](target) and [ref]: target that is not a URL or a bare #anchor
# must name an existing file or directory, resolved against the
# directory of the page; #anchors are ignored.  Inline code spans and
# fenced code blocks are skipped.  Prints each broken link and exits 1 if
# there is any.  Usage: check-links.sh [FILE.md…] (default: README.md,
# docs/api.md, docs/guide/*.md, docs/internals/*.md, tests/fuzz/README.md,
# tests/bench/README.md).
cd "$(dirname "$0")/../.." || exit 1
shopt -s nullglob
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(README.md docs/api.md docs/guide/*.md docs/internals/*.md tests/fuzz/README.md tests/bench/README.md)
fail=0 n=0
for f in "${files[@]}"; do
  if [ ! -f "$f" ]; then echo "check-links: no such page: $f"; fail=1; continue; fi
  dir=$(dirname "$f")
  # line numbers and targets, outside ``` blocks and `code` spans
  while IFS=: read -r line target; do
    [ -n "$target" ] || continue
    case "$target" in
      \#*|*://*|mailto:*) continue ;;
    esac
    path=${target%%#*}
    n=$((n + 1))
    if [ ! -e "$dir/$path" ]; then
      echo "check-links: $f:$line: broken link: $target"
      fail=1
    fi
  done < <(sed -e '/^[[:space:]]*```/,/^[[:space:]]*```/s/.*//' -e 's/`[^`]*`//g' "$f" |
           grep -n -o -e '\]([^)[:space:]]*' -e '^\[[^]]*\]:[[:space:]]*[^[:space:]]*' |
           sed -e 's/^\([0-9]*\):\](/\1:/' -e 's/^\([0-9]*\):\[[^]]*\]:[[:space:]]*/\1:/')
done
echo "check-links: ${#files[@]} pages, $n relative links checked"
exit $fail
