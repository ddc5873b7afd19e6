#!/usr/bin/env bash
# One working session of the study on a machine lent until a set time.
#
#   bash scripts/study_session.sh UNTIL "CELL ..." ["CELL ..." ...]
#
# Starts one `python -m recipes.study run --main-only --jobs JOBS --finish-by UNTIL --cells CELL ...` per quoted
# list of cells, each training on one thread (OMP_NUM_THREADS=1): on a 2-core machine give two lists, one per
# core. Two lists must not share a cell (the study refuses a cell whose records another process holds). Each process
# starts no run that would end after UNTIL and pauses the resumable ones there (docs/study.md, Resuming).
#
# Environment:
#   PY            the interpreter (default .venv/bin/python)
#   COMMIT_EVERY  minutes (or seconds, as 30s) between commits of the records that changed (default 0: never
#                 commit), and once more after the processes end. Every commit that adds runs also regenerates
#                 the table, plots, results page and README summary (`python -m recipes.study report ...`), so
#                 each commit passes the page tests even if the session is cut off before its end. A commit
#                 holds only the study's records folder and those report files, never other work in the tree.
#   LOGS          folder for the logs and pids (default outputs/study/session-<start time>)
#   JOBS          trainings at once in each list's process (default 1: one list per core). With one list on a
#                 2-core machine, JOBS=2 puts both cores on its cells, e.g. when one cell is all that is left.
#
# SIGTERM or Ctrl-C to this script is passed on to the study processes, which pause their runs at a
# checkpoint and exit; the records they hold are committed as above.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 2 ]; then
    awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"  # this header
    exit 2
fi
UNTIL=$1
shift
PY=${PY:-.venv/bin/python}
COMMIT_EVERY=${COMMIT_EVERY:-0}
case $COMMIT_EVERY in
    *s) PERIOD=${COMMIT_EVERY%s} ;;
    *) PERIOD=$COMMIT_EVERY ;;
esac
if ! [[ $PERIOD =~ ^[0-9]+$ ]]; then
    echo "study_session: COMMIT_EVERY must be whole minutes or seconds with an s (30s), not '$COMMIT_EVERY'" >&2
    exit 2
fi
[ "$PERIOD" = "$COMMIT_EVERY" ] && PERIOD=$((PERIOD * 60))
JOBS=${JOBS:-1}
if ! [[ $JOBS =~ ^[1-9][0-9]*$ ]]; then
    echo "study_session: JOBS must be a whole number of trainings at once (1 or more), not '$JOBS'" >&2
    exit 2
fi
RECORDS=docs/results/study/v0.3
LOGS=${LOGS:-outputs/study/session-$(date +%Y%m%d-%H%M)}
mkdir -p "$LOGS"

# the cells named twice would make the second process exit at once: say so before starting anything
dupes=$(printf '%s\n' "$@" | tr ' ' '\n' | sed '/^$/d' | sort | uniq -d)
if [ -n "$dupes" ]; then
    echo "study_session: cells given to more than one process: $dupes" >&2
    exit 2
fi

# Commits are made from a private index: HEAD plus the study's files as they were when the report was checked,
# so a run that lands between that check and the commit stays in the working tree for the next commit instead
# of being committed beside a report that does not have it.
INDEX=$LOGS/git-index
staged() { GIT_INDEX_FILE=$INDEX git "$@"; }
snapshot() { staged read-tree HEAD && staged add -- "$@"; }

# one line per records file in the private index that differs from HEAD: "<cell> N runs"
changed_cells() {
    staged diff --cached --name-only -- ":(glob)$RECORDS/*.json" | while read -r f; do
        staged show ":$f" | "$PY" -c 'import json, sys
d = json.load(sys.stdin)
print(sys.argv[1], len(d["runs"]), "runs") if "runs" in d else print(sys.argv[1] + ".json updated")' \
            "$(basename "$f" .json)"
    done
}

# the cells' records, as "<path> <blob id>" lines: in the working tree, or with "index" in the private index
records_state() {
    local f
    if [ "${1:-}" = index ]; then
        staged ls-files -s -- ":(glob)$RECORDS/*.json" | awk '{print $4, $2}'
    else
        for f in "$RECORDS"/*.json; do echo "$f $(git hash-object "$f")"; done
    fi | grep -v '/table\.json ' | LC_ALL=C sort
}

commit_records() {  # $1: "final" regenerates the report even if no run was added
    local what paths msg state tries
    paths=("$RECORDS")
    snapshot "${paths[@]}"
    what=$(changed_cells | grep ' runs$' || true)
    if [ "${1:-}" = final ] || [ -n "$what" ]; then
        paths+=(docs/results.md README.md)
        for tries in 1 2 3; do
            state=$(records_state)
            "$PY" -m recipes.study report --page docs/results.md --summary README.md > "$LOGS/report.log" 2>&1 \
                || echo "study_session: report failed, see $LOGS/report.log" >&2
            snapshot "${paths[@]}"
            [ "$state" = "$(records_state index)" ] && break
            echo "study_session: records changed while the report was made ($tries), making it again" >&2
        done
    fi
    if staged diff --cached --quiet; then
        return 0
    fi
    what=$(changed_cells | paste -sd ';' | sed 's/;/; /g')
    msg=${what:+"study records: $what"}
    if ! staged diff --cached --quiet -- docs/results.md README.md ":(glob)$RECORDS/*.png" \
            ":(glob)$RECORDS/table.*"; then
        msg="${msg:+$msg; }table, plots and results page regenerated"
    fi
    msg=${msg:-"study records rewritten (no run added)"}
    for _ in 1 2 3 4 5; do  # another git command may hold the repository's lock for a moment
        if staged commit -q -m "$msg"; then
            for _ in 1 2 3 4 5; do  # the shared index takes what was committed
                git reset -q -- "${paths[@]}" && break
                sleep 5
            done
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
    OMP_NUM_THREADS=1 "$PY" -m recipes.study run --main-only --jobs "$JOBS" --finish-by "$UNTIL" --cells $cells \
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
    if [ "$PERIOD" -gt 0 ] && [ $(( $(date +%s) - last )) -ge "$PERIOD" ]; then
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
if [ "$PERIOD" -gt 0 ]; then
    commit_records final
fi
exit "$status"
