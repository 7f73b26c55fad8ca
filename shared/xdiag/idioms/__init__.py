"""The idiom catalogue: what a program does that an expert would write differently, recognised from its profile.

Each idiom is one entry (`catalogue.idiom`) in one module of this package, grouped by pattern: work the result does
not need (work_not_needed), how the host's Python drives the device (host_structure), what an op really is and the
type it runs in (op_identity), memory, precision and layout (memory_numerics: arguments copied instead of donated,
recomputation the memory does not need, outputs returned in other layouts). An entry holds its recogniser, the change
in the framework's own API at the user's line (its lever: the lever catalogue has none for a finding an entry
recognises), and the share of its measured stake that change recovered on the chip. get_program_anatomy reports the matches (`idioms`); the rule engine turns each into a finding whose fix
leads with that change, ranked by what it is predicted to save, and Gemini's opening data carries the same matches.
"""

from __future__ import annotations

from typing import Any

from xdiag.idioms import (  # noqa: F401  (registers)
    host_structure, memory_numerics, op_identity, work_not_needed)
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
    return sorted(found, key=lambda m: -IDIOMS[m.idiom].predicted_percent(m)[1])


def candidates(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The matches as an investigator weighs them (Gemini's candidate_idioms): what the program does, where, the
    change and the gain it is predicted to realise."""
    out = []
    for match in filter(None, map(Match.from_record, records)):
        idiom = IDIOMS[match.idiom]
        out.append({"idiom": idiom.key, "title": idiom.title, "what": match.what, "line": match.line or None,
                    "change": idiom.change_text(match), "why": idiom.why,
                    "stake_percent_of_step": round(match.stake_percent, 2),
                    "predicted_percent_of_step": list(idiom.predicted_percent(match))})
    return out
