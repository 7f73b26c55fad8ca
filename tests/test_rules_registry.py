"""The rule registry and the typed health snapshot (issue 46): every finding's rule is registered once and runs in
the one explicit order, and the snapshot's JSON form (analysis.json, the Gemini prompt) is its fields in order,
read back to the same record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from xdiag.cloud.embedded import analyze_session
from xdiag.investigators import HealthSnapshot, health_snapshot
from xdiag.investigators.rules.registry import RULE_ORDER, RULES, ordered_rules, rule
from xdiag.model import ToolResult
from xdiag.profile.locate import locate_session

TPU = Path(__file__).resolve().parent / "profiles" / "tpu_v5e"


def test_the_engine_runs_every_registered_rule_once_in_rule_order(monkeypatch, tmp_path):
    """Each registered rule is wrapped in a recorder and the engine's `hypotheses` run on a real profile: every rule
    is called exactly once, in RULE_ORDER, each seeing the hypotheses the rules before it formed."""
    from xdiag.investigators.rules import hypotheses

    assert len(set(RULE_ORDER)) == len(RULE_ORDER)
    assert set(RULES) == set(RULE_ORDER)
    analyze_session(locate_session(TPU / "host_sync.xplane.pb"), tmp_path / "out")
    results = {p.stem: ToolResult.model_validate_json(p.read_text()) for p in (tmp_path / "out" / "tools").glob("*.json")
               if not p.stem.startswith("followup")}
    called: list[tuple[str, int, int]] = []  # (rule, hypotheses it was given, how many it formed)

    def recorded(key, func):
        def run(facts, found):
            formed = func(facts, found)
            called.append((key, len(found), len(formed) if isinstance(formed, list) else int(formed is not None)))
            return formed
        return run

    for key, func in list(RULES.items()):
        monkeypatch.setitem(RULES, key, recorded(key, func))
    hypotheses(health_snapshot(results), results)
    assert [key for key, _, _ in called] == list(RULE_ORDER)
    assert any(k == "host_sync" and made for k, _, made in called)
    for (_, seen, made), (_, seen_next, _) in zip(called, called[1:]):
        assert seen_next == seen + made  # each rule is given what the rules before it formed


def test_a_rule_registered_twice_or_outside_the_order_is_refused():
    with pytest.raises(ValueError, match="twice"):
        rule("host_sync")(lambda facts, found: None)
    with pytest.raises(ValueError, match="RULE_ORDER"):
        rule("not_a_finding")(lambda facts, found: None)
    assert "not_a_finding" not in RULES


@pytest.mark.parametrize("profile", ["healthy", "host_sync"])
def test_the_snapshot_json_is_the_analysis_health_and_reads_back_to_the_same_record(profile, tmp_path):
    analysis = analyze_session(locate_session(TPU / f"{profile}.xplane.pb"), tmp_path / "out")
    results = {p.stem: ToolResult.model_validate_json(p.read_text()) for p in (tmp_path / "out" / "tools").glob("*.json")
               if not p.stem.startswith("followup")}
    snapshot = health_snapshot(results)
    assert json.dumps(snapshot.as_dict()) == json.dumps(analysis.health)  # the same keys in the same order
    assert HealthSnapshot.from_dict(analysis.health) == snapshot
