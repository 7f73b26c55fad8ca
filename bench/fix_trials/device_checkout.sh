#!/bin/bash
# The device tool sends the checkout the session started in, at most 64 MiB; this one's tracked captures are more.
#   device_checkout.sh prep [BRANCH...]   switch this checkout to an orphan branch holding only devrun/bench/fix_trials
#                                         (main's, with BRANCHes' fix_trials files laid over it); main must be clean
#   device_checkout.sh restore            remove devrun/ and switch back to main
# Between the two, run the device call from the repository root:  cd devrun/bench/fix_trials && bash device_run.sh PLAN
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
exclude=.git/info/exclude
case "${1:-}" in
  prep)
    shift
    [ -z "$(git status --porcelain)" ] || { echo "the checkout has changes: commit or stash them first" >&2; exit 2; }
    staged=$(mktemp -d)
    git archive main bench/fix_trials | tar -x -C "$staged"
    for branch in "$@"; do git archive "$branch" bench/fix_trials | tar -x -C "$staged"; done
    git switch -q --orphan devrun
    printf '/*\n!/devrun/\n' >> "$exclude"
    mkdir devrun && cp -r "$staged/bench" devrun/ && rm -rf "$staged"
    du -sh devrun ;;
  restore)
    rm -rf devrun
    sed -i '/^\/\*$/d;/^!\/devrun\/$/d' "$exclude"
    git switch -q -f main
    git log --oneline -1 ;;
  *) sed -n '2,6p' "$0"; exit 2 ;;
esac
