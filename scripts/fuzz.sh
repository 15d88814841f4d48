#!/bin/bash
# fuzz.sh — runs every Go fuzz target of the module (func FuzzXxx in a
# _test.go file) for a bounded time each: `make test` runs them briefly,
# `make fuzz` longer. A failing input is written under the package's
# testdata/fuzz/, as go test does, and fails the run.
#
# Usage: scripts/fuzz.sh [DURATION]   (default 10s; a go test -fuzztime value:
# much shorter ones fail while go test still gathers the corpus baseline)
set -euo pipefail
cd "$(dirname "$0")/.."
time=${1:-10s}
GO=${GO:-go}
n=0
while IFS=: read -r file name; do
	pkg=./$(dirname "$file")
	echo "fuzz $pkg $name for $time"
	$GO test -run '^$' -fuzz "^${name}\$" -fuzztime "$time" "$pkg" >/tmp/hpcrun-fuzz.$$ 2>&1 || {
		cat /tmp/hpcrun-fuzz.$$
		rm -f /tmp/hpcrun-fuzz.$$
		echo "fuzz: $name in $pkg failed" >&2
		exit 1
	}
	n=$((n + 1))
done < <(git ls-files '*_test.go' | xargs grep -oE '^func Fuzz[A-Za-z0-9_]+' | sed 's/^\(.*\):func /\1:/' | sort)
rm -f /tmp/hpcrun-fuzz.$$
echo "fuzz: $n targets ran $time each, none failed"
