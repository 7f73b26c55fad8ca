"""The idiom catalogue's types: an idiom (what a program does that an expert writes differently), and a match of it in
one profile with the facts it was recognised from and what it stakes.

An idiom names what the program does, not the bottleneck class its ops fall in: "a dense matmul with a one-hot
matrix stands in for a row lookup", not "memory-bound ops". Each entry holds its recogniser (over the profile's HLO,
op times and step facts), the change an expert makes (in the framework's own API, at the user's line), and the
fraction of the measured stake that change recovered on the chip (`gain`, with where that was measured). Adding one
is one entry in one module of this package and its trial: docs/howto/add-an-idiom.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

PATTERNS = {
    "work_not_needed": "work the result does not need",
    "host_structure": "how the host's Python drives the device",
    "op_identity": "what an op really is",
    "memory_numerics": "memory, precision and layout",
}


@dataclass
class Match:
    """One place in the program where an idiom holds, with the measured facts behind it."""

    idiom: str
    stake_percent: float  # the share of the step the idiom's time holds, measured
    what: str  # what the program does there, in the profile's own facts: opcodes, shapes, dtypes, counts
    module: str = ""
    ops: list[str] = field(default_factory=list)  # the timed ops whose time it stakes
    line: str = ""  # the user's line ("file:line"), where the HLO's stacks name one
    function: str = ""
    needed_percent: float | None = None  # the share of the step the result needs (its work at the device's roof)
    work_ratio: float | None = None  # work done over work the result needs (FLOPs or bytes), where countable
    params: dict[str, Any] = field(default_factory=dict)  # values the change's text names (k, axis, program, …)
    facts: dict[str, Any] = field(default_factory=dict)  # measured facts quoted as evidence
    cites: list[str] = field(default_factory=list)  # ops `what` describes without staking their time (the loop that
    # runs the staked ops, the op that makes a value they read), by name for the evidence: their lines are the finding's

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Match | None:
        """A match back from its record (get_program_anatomy's `idioms`); None for an idiom this catalogue lacks."""
        if not isinstance(record, dict) or record.get("idiom") not in IDIOMS:
            return None
        fields = ("module", "ops", "line", "function", "needed_percent", "work_ratio", "params", "cites")
        return cls(record["idiom"], float(record.get("stake_percent") or 0.0), str(record.get("what") or ""),
                   **{k: record[k] for k in fields if k in record},
                   facts={k: v for k, v in record.items() if k not in RECORD_KEYS})

    def record(self) -> dict[str, Any]:
        """The match as a tool answers it: its fields, and its measured facts beside them (each fact where a
        finding's evidence names it: "<idiom> <fact>" is the row of that idiom, that key)."""
        out = {"idiom": self.idiom, "stake_percent": round(self.stake_percent, 2), "what": self.what,
               "module": self.module, "ops": self.ops[:8], "line": self.line, "function": self.function,
               "needed_percent": None if self.needed_percent is None else round(self.needed_percent, 2),
               "work_ratio": None if self.work_ratio is None else round(self.work_ratio, 1),
               "params": self.params, "cites": self.cites}
        out = {k: v for k, v in out.items() if v not in ("", [], {}, None) or k in ("stake_percent", "what")}
        out.update({k: v for k, v in self.facts.items() if k not in RECORD_KEYS})
        return out


RECORD_KEYS = frozenset({"idiom", "stake_percent", "what", "module", "ops", "line", "function", "needed_percent",
                         "work_ratio", "params", "cites"})
"""A match record's own fields; every other key of it is one of its measured facts."""


@dataclass(frozen=True)
class Variant:
    """The change where it differs by the program's platform, vendor or framework (the setting its caller knows) or
    by one of the match's params: each (name, values) of `when` must hold. `change` replaces the idiom's; `withheld`
    instead states the premise that withholds any change there."""

    when: tuple[tuple[str, tuple[Any, ...]], ...]
    change: str = ""
    withheld: str = ""  # {line}, {function} and the match's params fill it, as they fill `change`
    gain: tuple[float, float] | None = None  # where the chip measured this variant's change on its own: the share of
    # the stake it recovered, and where (a variant that holds on the match's params alone; the idiom's otherwise)
    measured: str = ""

    def holds(self, on: Mapping[str, Any]) -> bool:
        return all(on.get(name) in values for name, values in self.when)


@dataclass(frozen=True)
class Idiom:
    key: str
    pattern: str  # a key of PATTERNS
    title: str  # the finding's title
    recognise: Callable[[Any], list[Match]]  # (xdiag.idioms.program.Program) -> matches
    change: str  # the change, in the framework's own API; {line}, {function} and the match's params fill it
    why: str  # why the change removes the time, in one sentence (the premise it rests on)
    gain: tuple[float, float] | None  # fraction of the match's recoverable stake the change recovered on the chip;
    # None where no trial has timed the change: no gain is predicted (the user captures before and after)
    measured: str = ""  # where that was measured: a section of docs/reference/measurements.md ("" until captured)
    alternatives: tuple[str, ...] = ()  # other changes, each with its premise
    platforms: tuple[str, ...] = ("TPU", "GPU", "CPU")
    lever: str = ""  # the lever (xdiag.investigators.levers) whose change this is, where one is: its finding names it
    variants: tuple[Variant, ...] = ()  # the change where the platform, framework or a param asks another, first first

    def recoverable(self, match: Match) -> float:
        """The share of the step the change can give back: the stake less what the result needs."""
        return max(match.stake_percent - (match.needed_percent or 0.0), 0.0)

    def measured_gain(self, match: Match) -> tuple[tuple[float, float] | None, str]:
        """The share of the stake the change recovered on the chip, and where that was measured: the first variant
        holding on the match's params that was measured on its own, else the idiom's."""
        chosen = next((v for v in self.variants if v.gain is not None and v.holds(match.params)), None)
        return (chosen.gain, chosen.measured) if chosen is not None else (self.gain, self.measured)

    def predicted_percent(self, match: Match) -> tuple[float, float] | None:
        """The step-time gain the change is predicted to realise (low, high), in percent of the step; None where it
        was not measured."""
        gain, _ = self.measured_gain(match)
        if gain is None:
            return None
        gap = self.recoverable(match)
        return round(gap * gain[0], 1), round(min(gap * gain[1], match.stake_percent), 1)

    def variant(self, match: Match, setting: Mapping[str, Any] | None = None) -> Variant | None:
        """The first variant that holds for the match on the program's setting (platform, vendor, framework)."""
        on = {**(setting or {}), **match.params}
        return next((v for v in self.variants if v.holds(on)), None)

    def withheld(self, match: Match, setting: Mapping[str, Any] | None = None) -> str:
        """The premise that withholds the change here (the match's params filling it, as they fill the change), or
        ""."""
        chosen = self.variant(match, setting)
        return chosen.withheld.format(**self._text_values(match)) if chosen is not None else ""

    def change_text(self, match: Match, setting: Mapping[str, Any] | None = None) -> str:
        chosen = self.variant(match, setting)
        return (chosen.change if chosen is not None and chosen.change else self.change).format(
            **self._text_values(match))

    @staticmethod
    def _text_values(match: Match) -> dict[str, Any]:
        return {"line": match.line or "the line that builds it", "function": match.function or "the function",
                **match.params}


IDIOMS: dict[str, Idiom] = {}


def idiom(key: str, pattern: str, title: str, change: str, why: str, gain: tuple[float, float] | None,
          measured: str = "", alternatives: tuple[str, ...] = (), platforms: tuple[str, ...] = ("TPU", "GPU", "CPU"),
          lever: str = "", variants: tuple[Variant, ...] = ()
          ) -> Callable[[Callable[[Any], list[Match]]], Callable[[Any], list[Match]]]:
    """Registers the decorated recogniser as one entry of the catalogue."""
    if pattern not in PATTERNS:
        raise ValueError(f"idiom {key!r}: unknown pattern {pattern!r}")

    def register(recognise: Callable[[Any], list[Match]]) -> Callable[[Any], list[Match]]:
        if key in IDIOMS:
            raise ValueError(f"idiom {key!r} is registered twice")
        IDIOMS[key] = Idiom(key, pattern, title, recognise, change, why, gain, measured, alternatives, platforms,
                            lever, variants)
        return recognise

    return register
