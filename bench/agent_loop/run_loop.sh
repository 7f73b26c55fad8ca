#!/usr/bin/env bash
# Replays, for one program, the loop an agent ran with the skill and `xdiag mcp` (README.md here): capture the
# program as written, analyze, explain the top finding, apply the change made from that finding's fix
# (changes/PROG.diff), capture again the same way, diff_sessions, then keep the change if the verdict is faster and
# revert it otherwise. Each MCP call is logged with its answer's bytes in WORK/PROG/calls.jsonl.
#   bench/agent_loop/run_loop.sh PROG [WORK]      (WORK defaults to /tmp/agent-loop; PROG's folder there is remade)
set -euo pipefail
prog=$1
work=${2:-/tmp/agent-loop}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
py=${PYTHON:-$root/.venv/bin/python}
dir=$work/$prog
rm -rf "$dir" && mkdir -p "$dir" && cp "$here/programs/$prog.py" "$dir/"
export PYTHONPATH=$root/shared XDIAG_LOCAL_CACHE_DIR=$work/.cache
call() { "$py" "$here/mcp_call.py" --allow "$dir" --log "$dir/calls.jsonl" "$@"; }
field() { "$py" -c "import json, sys; print(json.load(open(sys.argv[1]))$1)" "$2"; }

(cd "$dir" && "$py" "$prog.py" "$dir/profiles/before")
call analyze "{\"path\": \"$dir/profiles/before\", \"source_root\": \"$dir\"}" > "$dir/analyze.json"
if [ "$(field '["status"]' "$dir/analyze.json")" = OPTIMAL ]; then echo "$prog: OPTIMAL, nothing to change"; exit 0; fi
call explain_finding "{\"analysis\": \"$(field '["analysis"]' "$dir/analyze.json")\", \"finding\": 1}" \
  > "$dir/explain.json"
(cd "$dir" && patch -s -p1 < "$here/changes/$prog.diff")
(cd "$dir" && "$py" "$prog.py" "$dir/profiles/after-1")
call diff_sessions "{\"before\": \"$(field '["analysis"]' "$dir/analyze.json")\", \"after\": \"$dir/profiles/after-1\"}" \
  > "$dir/diff.json" || true   # an error result (a refusal) is a revert, like any verdict but faster
verdict=$(field '.get("verdict", "error")' "$dir/diff.json" 2>/dev/null || echo error)
if [ "$verdict" = faster ]; then decision=kept; else (cd "$dir" && patch -s -R -p1 < "$here/changes/$prog.diff"); decision=reverted; fi
"$py" - "$dir" "$prog" "$decision" <<'PY'
import json, sys
from pathlib import Path
folder, prog, decision = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
calls = [json.loads(line) for line in (folder / "calls.jsonl").read_text().splitlines()]
diff = json.loads((folder / "diff.json").read_text())
top = json.loads((folder / "analyze.json").read_text())["findings"][0]
outcome = next((o for o in diff.get("outcomes", []) if o["key"] == top["key"]), {})
test = diff.get("step_test", {})
print(json.dumps({"program": prog, "calls": len(calls), "bytes": sum(c["bytes"] for c in calls),
                  "finding": top["key"], "predicted": outcome.get("predicted_text", top["expected_impact"]),
                  "verdict": diff.get("verdict"), "change_percent": test.get("change_percent"),
                  "interval": [test.get("ci_low_percent"), test.get("ci_high_percent")],
                  "min_detectable_gain_percent": test.get("min_detectable_gain_percent"),
                  "outcome": outcome.get("outcome"), "decision": decision}, ensure_ascii=False))
PY
