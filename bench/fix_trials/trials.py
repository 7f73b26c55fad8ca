"""Read the fix trials back: each capture's report (xdiag's rules), the lever it leads with, the gain it predicts,
and the gain the program measured (its own step times). `python bench/fix_trials/trials.py` prints the tables of
bench/fix_trials.md; tests/test_fix_trials.py checks every pair with the same functions.

Realized gain: 1 - after/before of the program's mean step time over 10 steps run as its own loop runs them
(steps.json 'pipelined': one block at the end, so a sync the program makes is counted and none is added), per unit
of work (tokens, samples) where the change alters the work per step.
"""
from __future__ import annotations

import json
import lzma
import re
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CAPTURES = REPO / "tests" / "profiles" / "fix_trials"
MANIFEST = Path(__file__).resolve().parent / "trials.json"
_RANGE = re.compile(r"(\d+(?:\.\d+)?)\s*[–-]\s*(\d+(?:\.\d+)?)% shorter steps")


def trials() -> list[dict]:
    return json.loads(MANIFEST.read_text())["trials"]


def steps(program: str, label: str) -> dict:
    return json.loads((CAPTURES / f"{program}.{label}.steps.json").read_text())


def diagnosis(program: str, label: str, work: Path) -> dict:
    """The rules' diagnosis of one committed capture (decompressed under work)."""
    from xdiag.cloud.embedded import analyze_session
    from xdiag.profile.locate import locate_session

    folder = work / f"{program}.{label}"
    folder.mkdir(parents=True, exist_ok=True)
    pb = folder / f"{program}.xplane.pb"
    pb.write_bytes(lzma.decompress((CAPTURES / f"{program}.{label}.xplane.pb.xz").read_bytes()))
    analyze_session(locate_session(pb), folder / "out")
    return json.loads((folder / "out" / "analysis.json").read_text())["diagnosis"]


def lever(finding: dict) -> str | None:
    return next((e["value"] for e in finding.get("evidence", []) if e.get("metric") == "lever"), None)


def levers(diag: dict) -> list[str | None]:
    return [lever(f) for f in diag.get("findings", [])]


_LEAD = re.compile(r"Leading with [^:]+: " + _RANGE.pattern)


def predicted(finding: dict) -> tuple[float, float] | None:
    """The (low, high) % shorter steps the finding predicts for its lever (the range its lead lever gives, else the
    first range its impact or fix states), else None."""
    m = _LEAD.search(finding.get("expected_impact", ""))
    if m:
        return float(m.group(1)), float(m.group(2))
    for text in (finding.get("expected_impact", ""), finding.get("fix", "")):
        m = _RANGE.search(text)
        if m:
            return float(m.group(1)), float(m.group(2))
    return None


def per_unit_ms(rec: dict) -> float:
    return rec["pipelined"]["mean_ms"] / (rec.get("units") or 1)


def realized(before: dict, after: dict) -> float:
    """% shorter step (per unit of work) after the change."""
    return 100.0 * (1.0 - per_unit_ms(after) / per_unit_ms(before))


def row(trial: dict, work: Path) -> dict:
    p = trial["program"]
    before = steps(p, "before-a")
    d = diagnosis(p, "before-a", work)
    top = d["findings"][0] if d.get("findings") else {}
    mine = next((f for f in d.get("findings", []) if (lever(f) == trial["lever"] if trial["lever"]
                                                        else f.get("key") == trial.get("finding"))), None)
    out = {"program": p, "framework": before["framework"], "phase": before["phase"], "status": d["status"],
           "top_key": top.get("key"), "top_lever": lever(top) if top else None, "top_title": top.get("title"),
           "top_text": top.get("whats_happening", ""),
           "top_fix": top.get("fix", ""), "lever": trial["lever"], "named": mine is not None,
           "texts": {f.get("key"): f"{f.get('whats_happening', '')} {f.get('fix', '')}" for f in d.get("findings", [])},
           "lever_fix": mine.get("fix", "") if mine else "",
           "lever_text": " ".join(mine.get(k, "") for k in ("whats_happening", "expected_impact", "fix"))
           if mine else "",
           "not_advised": next((f.get("fix", "") for f in d.get("findings", [])
                                if f"the {(trial['lever'] or '').replace('_', ' ')} lever (" in f.get("fix", "")), ""),
           "predicted": predicted(mine) if mine else None, "top_predicted": predicted(top) if top else None,
           "before_ms": before["pipelined"]["mean_ms"],
           "same_ms": steps(p, "before-b")["pipelined"]["mean_ms"],
           "fixes": [f.get("fix", "") for f in d.get("findings", [])]}
    if trial.get("after"):
        after = steps(p, trial["after"])
        da = diagnosis(p, trial["after"], work)
        out.update(after=trial["after"], after_ms=after["pipelined"]["mean_ms"],
                   realized=round(realized(before, after), 1), after_status=da["status"],
                   after_top_lever=(levers(da) or [None])[0],
                   after_top_title=(da.get("findings") or [{}])[0].get("title"),
                   after_top_key=(da.get("findings") or [{}])[0].get("key"))
        out["fixes"] += [f.get("fix", "") for f in da.get("findings", [])]
        follow = (trial.get("next") or {}).get("after")
        if follow:
            # The closed loop: the after report's fix for the next lever, against the capture that applies it.
            nxt = next((f for f in da.get("findings", []) if lever(f) == trial["next"]["lever"]), None)
            out.update(next_lever=trial["next"]["lever"], next_named=nxt is not None,
                       next_fix=nxt.get("fix", "") if nxt else "", next_predicted=predicted(nxt) if nxt else None,
                       next_realized=round(realized(after, steps(p, follow)), 1))
    if trial.get("best"):
        out.update(best=trial["best"], best_realized=round(realized(before, steps(p, trial["best"])), 1))
    return out


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        rows = [row(t, Path(tmp)) for t in trials()]
    json.dump(rows, sys.stdout, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
