#!/usr/bin/env bash
# Instructions per event on the relay's per-event hot paths, counted by valgrind's callgrind:
#
#   scripts/bench/instructions.sh
#
# Builds `crates/outbox-core/benches/instructions.rs` (release), then runs it once per path
# under `valgrind --tool=callgrind --toggle-collect=<the path's function>`, so only that
# function and what it calls are counted, over 500 fixed events. A count does not move with
# the machine's load (unlike a time): compare it before and after a change to the hot paths.
# Prints a Markdown table.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
command -v valgrind >/dev/null || { echo "valgrind not found (Debian package valgrind)" >&2; exit 1; }
bin=$(cargo bench -p outbox-core --bench instructions --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "instructions" and m.get("executable"):
        print(m["executable"])' | tail -n 1)
[ -x "$bin" ] || { echo "could not build the instructions bench" >&2; exit 1; }
events=500
out=$(mktemp)
trap 'rm -f "$out"' EXIT
printf '| path | instructions per event |\n| --- | ---: |\n'
for path in headers_borrowed:ic_headers_borrowed headers_owned:ic_headers_owned \
    destination_render:ic_destination_render format_plain:ic_format_encode \
    format_cloudevents_binary:ic_format_encode format_cloudevents_structured:ic_format_encode \
    split_into_waves:ic_split_into_waves stream_numbering:ic_stream_numbering; do
    name=${path%%:*}
    fn=${path#*:}
    valgrind --tool=callgrind --callgrind-out-file="$out" --toggle-collect="*${fn}*" \
        "$bin" "$name" >/dev/null 2>&1
    total=$(awk '/^(summary|totals):/ { print $2; exit }' "$out")
    printf '| %s | %s |\n' "$name" "$(awk -v t="$total" -v n="$events" 'BEGIN { printf "%.0f", t / n }')"
done
