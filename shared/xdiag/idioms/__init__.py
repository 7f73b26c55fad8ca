"""The idiom catalogue: what a program does that an expert would write differently, recognised from its profile.

Each idiom is one entry (`catalogue.idiom`) in one module of this package, grouped by pattern: work the result does
not need (work_not_needed), how the host's Python drives the device (host_structure), what an op really is and the
type it runs in (op_identity), memory, precision and layout (memory_numerics: arguments copied instead of donated,
layout-only copies, recomputation the memory does not need, outputs returned in other layouts). An entry holds its
recogniser, the change in the framework's own API at the user's line (per platform, vendor or framework where it
differs: its variants; its lever: the lever catalogue has none for a finding an entry recognises), and the share of
its measured stake that change recovered on the chip. get_program_anatomy reports the matches (`idioms`); the rule
engine turns each into a finding whose fix leads with that change, ranked by what it is predicted to save, and
Gemini's opening data carries the same matches.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from xdiag.idioms import (  # noqa: F401  (registers)
    differentiation, host_structure, memory_numerics, op_identity, work_not_needed)
from xdiag.idioms.catalogue import IDIOMS, PATTERNS, Idiom, Match
from xdiag.idioms.program import Program
from xdiag.profile.space import Session

__all__ = ["IDIOMS", "PATTERNS", "Idiom", "Match", "candidates", "recognise"]


def recognise(session: Session) -> list[Match]:
    """Every idiom's matches in the session, the largest predicted gain first."""
    program = Program(session)
    found: list[Match] = []
    for idiom in IDIOMS.values():
        if program.platform not in idiom.platforms:
            continue
        found.extend(idiom.recognise(program))
    return sorted(found, key=lambda m: -(IDIOMS[m.idiom].predicted_percent(m) or (0.0, m.stake_percent))[1])


def candidates(records: list[dict[str, Any]], setting: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """The matches as an investigator weighs them (Gemini's candidate_idioms): what the program does, where, the
    change for the program's setting (its platform, vendor and framework, as get_device_information says them) and
    the gain it is predicted to realise, or the premise that withholds the change."""
    out = []
    for match in filter(None, map(Match.from_record, records)):
        idiom = IDIOMS[match.idiom]
        withheld = idiom.withheld(match, setting)
        predicted = idiom.predicted_percent(match)
        out.append({"idiom": idiom.key, "title": idiom.title, "what": match.what, "line": match.line or None,
                    **({"not_offered": withheld} if withheld else {"change": idiom.change_text(match, setting)}),
                    "why": idiom.why, "stake_percent_of_step": round(match.stake_percent, 2),
                    "predicted_percent_of_step": list(predicted) if predicted and not withheld else None})
    return out
