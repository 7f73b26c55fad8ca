"""The idiom trials' table of bench/fix_trials.md ("Every trial, as the reports read now"): for each trial of
idiom_trials.json, the before capture's top finding and its fix as written, the predicted range, the step times
before (both captures) and after, the realized gain, realized over the prediction's middle, and the after report's
top finding. `python bench/fix_trials/idiom_table.py > table.md` (about a minute per ten trials)."""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trials as T  # noqa: E402  (this folder's reader of the committed captures)

MANIFEST = Path(__file__).resolve().parent / "idiom_trials.json"


def _ms(program: str, label: str) -> float:
    return T.steps(program, label)["pipelined"]["mean_ms"]


def _cell(text: str, width: int = 150) -> str:
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= width else text[:width] + "…"


def row(trial: dict, work: Path) -> str:
    program, after = trial["program"], trial["after"]
    before = T.diagnosis(program, "before-a", work)
    top = (before.get("findings") or [{}])[0]
    fixed = T.diagnosis(program, after, work)
    predicted = T.predicted(top) if top else None
    realized = 100 * (1 - _ms(program, after) / _ms(program, "before-a"))
    ratio = f"{realized / (sum(predicted) / 2):.2f}" if predicted and sum(predicted) else "–"
    best = trial.get("best")
    best_cell = (f"{100 * (1 - _ms(program, best) / _ms(program, 'before-a')):+.1f}% (`{best}`)" if best
                 else f"{realized:+.1f}% (`{after}`)")
    return (f"| `{program}` | {trial['written']} | {top.get('key') or before['status']} | {_cell(top.get('fix', '…'))} | "
            f"{f'{predicted[0]:g}–{predicted[1]:g}%' if predicted else '–'} | "
            f"{_ms(program, 'before-a'):.4g} / {_ms(program, 'before-b'):.4g} ms | {_ms(program, after):.4g} ms (`{after}`) | "
            f"{realized:+.1f}% | {best_cell} | {ratio} | "
            f"{(fixed.get('findings') or [{}])[0].get('key') or fixed['status']} |")


def main() -> None:
    print("| program | written | top finding | its fix, as written (abridged) | predicted | before | after (change) | "
          "realized | best change found | ratio | after report's top |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for trial in json.loads(MANIFEST.read_text())["trials"]:
            print(row(trial, Path(tmp)), flush=True)


if __name__ == "__main__":
    main()
