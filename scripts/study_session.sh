#!/usr/bin/env bash
# One working session of the study on a machine lent until a set time.
#
#   bash scripts/study_session.sh UNTIL "CELL ..." ["CELL ..." ...]
#
# Starts one `python -m recipes.study run --main-only --jobs 1 --finish-by UNTIL --cells CELL ...` per quoted
# list of cells, each on one thread (OMP_NUM_THREADS=1): on a 2-core machine give two lists, one per core. Two
# lists must not share a cell (the study refuses a cell whose records another process holds). Each process
# starts no run that would end after UNTIL and pauses the resumable ones there (docs/study.md, Resuming).
#
# Environment:
#   PY            the interpreter (default .venv/bin/python)
#   COMMIT_EVERY  minutes between commits of the records that changed (default 0: never commit). With it set,
#                 the script also commits once after the processes end, with the table, plots, results page
#                 and README summary regenerated (`python -m recipes.study report ...`). A commit holds only the
#                 study's records folder and those report files, never other work in the tree.
#   LOGS          folder for the logs and pids (default outputs/study/session-<start time>)
#
# SIGTERM or Ctrl-C to this script is passed on to the study processes, which pause their runs at a
# checkpoint and exit; the records they hold are committed as above.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 2 ]; then
    sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
UNTIL=$1
shift
PY=${PY:-.venv/bin/python}
COMMIT_EVERY=${COMMIT_EVERY:-0}
RECORDS=docs/results/study/v0.3
LOGS=${LOGS:-outputs/study/session-$(date +%Y%m%d-%H%M)}
mkdir -p "$LOGS"

# the cells named twice would make the second process exit at once: say so before starting anything
dupes=$(printf '%s\n' "$@" | tr ' ' '\n' | sed '/^$/d' | sort | uniq -d)
if [ -n "$dupes" ]; then
    echo "study_session: cells given to more than one process: $dupes" >&2
    exit 2
fi

# one line per records file that differs from HEAD: "<cell> N runs"
changed_cells() {
    git status --porcelain -- "$RECORDS"/*.json | awk '{print $2}' | while read -r f; do
        "$PY" -c 'import json, sys
d = json.load(open(sys.argv[1]))
print(sys.argv[2], len(d["runs"]), "runs") if "runs" in d else print(sys.argv[2] + ".json updated")' \
            "$f" "$(basename "$f" .json)"
    done
}

commit_records() {  # $1: "final" also regenerates the report
    local what paths msg
    paths=("$RECORDS")
    if [ "${1:-}" = final ]; then
        "$PY" -m recipes.study report --page docs/results.md --summary README.md > "$LOGS/report.log" 2>&1 \
            || echo "study_session: report failed, see $LOGS/report.log" >&2
        paths+=(docs/results.md README.md)
    fi
    what=$(changed_cells | paste -sd ';' | sed 's/;/; /g')
    git add -- "${paths[@]}"
    if git diff --cached --quiet -- "${paths[@]}"; then
        return 0
    fi
    msg=${what:+"study records: $what"}
    if ! git diff --cached --quiet -- docs/results.md README.md "$RECORDS"/*.png "$RECORDS"/table.* 2>/dev/null; then
        msg="${msg:+$msg; }table, plots and results page regenerated"
    fi
    msg=${msg:-"study records rewritten (no run added)"}
    for _ in 1 2 3 4 5; do  # another git command may hold the index for a moment
        if git commit -q -m "$msg" -- "${paths[@]}"; then
            echo "study_session: committed: $msg"
            return 0
        fi
        sleep 5
    done
    echo "study_session: commit failed, the records stay in the working tree" >&2
}

pids=()
stop() {
    echo "study_session: stopping the study processes (they pause their runs at a checkpoint)" >&2
    kill -TERM "${pids[@]}" 2>/dev/null || true
}
trap stop TERM INT

i=0
for cells in "$@"; do
    i=$((i + 1))
    # shellcheck disable=SC2086  # the cell list is split on purpose
    OMP_NUM_THREADS=1 "$PY" -m recipes.study run --main-only --jobs 1 --finish-by "$UNTIL" --cells $cells \
        > "$LOGS/core$i.log" 2>&1 < /dev/null &
    pids+=($!)
    echo "$!" > "$LOGS/core$i.pid"
    echo "study_session: core $i: pid $! cells $cells, log $LOGS/core$i.log"
done

alive() {
    local p
    for p in "${pids[@]}"; do
        kill -0 "$p" 2>/dev/null && return 0
    done
    return 1
}

last=$(date +%s)
while alive; do
    sleep 2 &
    wait $! || true  # a signal interrupts the wait; the trap has passed it on
    if [ "$COMMIT_EVERY" -gt 0 ] && [ $(( $(date +%s) - last )) -ge $((COMMIT_EVERY * 60)) ]; then
        commit_records
        last=$(date +%s)
    fi
done
status=0
for p in "${pids[@]}"; do
    wait "$p" || status=$?
done
for ((j = 1; j <= i; j++)); do
    echo "study_session: core $j: $(tail -n 1 "$LOGS/core$j.log")"
done
if [ "$COMMIT_EVERY" -gt 0 ]; then
    commit_records final
fi
exit "$status"
