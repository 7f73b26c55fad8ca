"""The chip's fix-trial captures committed under tests/profiles/fix_trials/, decompressed for a test."""

from __future__ import annotations

import lzma
import shutil
from pathlib import Path

CAPTURES = Path(__file__).resolve().parent / "profiles" / "fix_trials"


def unpack_capture(program: str, label: str, folder: Path) -> Path:
    """<folder>/<program>.<label>/<program>.xplane.pb, decompressed from the committed capture (the file name is the
    program's, as the driver wrote it, so a report names the program's own session)."""
    out = folder / f"{program}.{label}" / f"{program}.xplane.pb"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        with lzma.open(CAPTURES / f"{program}.{label}.xplane.pb.xz") as packed, open(out, "wb") as target:
            shutil.copyfileobj(packed, target)
    return out
