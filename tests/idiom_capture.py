"""Captures small JAX programs on this CPU, each in a process of its own, the way the idiom tests read them: a
program is the body that defines `run()` (one step); the capture runs it twice to compile, then three annotated
steps under the profiler."""

from __future__ import annotations

import glob
import subprocess
import sys
import textwrap
from pathlib import Path

CAPTURE = """
import glob, shutil, sys
import jax, jax.numpy as jnp
import numpy as np
{body}
for _ in range(2):
    jax.block_until_ready(run())
with jax.profiler.trace(sys.argv[1]):
    for i in range(3):
        with jax.profiler.StepTraceAnnotation("train", step_num=i):
            jax.block_until_ready(run())
"""


def capture_programs(bodies: dict[str, str], root: Path) -> dict[str, Path]:
    """name -> its *.xplane.pb; each program's script lies beside its capture's folder as <root>/<name>.py (a
    capture's `.parents[4]` is root)."""
    out = {}
    for name, body in bodies.items():
        script = root / f"{name}.py"
        script.write_text(CAPTURE.format(body=textwrap.dedent(body)))
        subprocess.run([sys.executable, str(script), str(root / name)], check=True, timeout=300,
                       env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"})
        out[name] = Path(glob.glob(str(root / name / "plugins" / "profile" / "*" / "*.xplane.pb"))[0])
    return out
