"""What an agent's call to the command line imports: `xdiag --help` and a cached `xdiag tool` answer load none of the
heavy libraries (numpy, pydantic, jinja2, protobuf, rich; the cached answer not typer either), each imported where it
is used. Read from the command's own `python -X importtime`, in a fresh process as the console script runs; how
long it takes is measured in bench/ (bench/startup_bench.py), never here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import H200

PROFILE = H200 / "healthy.xplane.pb"
HEAVY = ("numpy", "pydantic", "pydantic_core", "jinja2", "google.protobuf", "rich", "xprof.convert")


def _imported(*args: str, cwd: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, set[str]]:
    """The command's result and every module it imported (`-X importtime` writes one line a module on stderr)."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "xdiag.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env={**os.environ, **env})
    modules = {line.rpartition("|")[2].strip() for line in done.stderr.splitlines()
               if line.startswith("import time:") and "self [us]" not in line}  # (not the header line)
    return done, modules


def _heavy(modules: set[str], heavy: tuple[str, ...]) -> list[str]:
    return sorted(name for name in modules if any(name == top or name.startswith(f"{top}.") for top in heavy))


def test_help_imports_none_of_the_heavy_libraries(tmp_path):
    done, modules = _imported("--help", cwd=tmp_path, env={})
    assert done.returncode == 0 and "tool" in done.stdout and "analyze" in done.stdout
    assert "typer" in modules and "xdiag.cli.local" in modules  # (the command's imports were read)
    assert _heavy(modules, HEAVY) == []


@pytest.mark.parametrize("extra", [(), ("--arg", "top_n=3"), ("--arg=top_n=3",)])
def test_a_cached_tool_answer_imports_neither_typer_nor_the_heavy_libraries(tmp_path, extra):
    env = {"XDIAG_LOCAL_CACHE_DIR": str(tmp_path / "cache")}
    tool = ("get_hlo_op_profile",) if extra else ("get_step_trace",)
    first, modules = _imported("tool", *tool, str(PROFILE), *extra, cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "numpy" in modules  # the first call computes the answer
    again, modules = _imported("tool", *tool, str(PROFILE), *extra, cwd=tmp_path, env=env)
    assert again.returncode == 0 and again.stdout == first.stdout
    assert "xdiag.agent.result_cache" in modules
    assert _heavy(modules, (*HEAVY, "typer")) == []


def test_a_cached_tool_call_in_another_form_runs_through_typer_with_the_same_answer_and_errors(tmp_path):
    """Options the cached lookup does not read (`--max-profile-gib`, an unknown one) leave the call to typer: the
    same kept answer, or typer's usage error, exactly as before."""
    env = {"XDIAG_LOCAL_CACHE_DIR": str(tmp_path / "cache")}
    first, _ = _imported("tool", "get_step_trace", str(PROFILE), cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stderr[-2000:]
    other_form, modules = _imported("tool", "get_step_trace", "--max-profile-gib", "1", str(PROFILE), cwd=tmp_path,
                                    env=env)
    assert other_form.returncode == 0 and other_form.stdout == first.stdout and "typer" in modules
    unknown, _ = _imported("tool", "get_step_trace", str(PROFILE), "--colour", cwd=tmp_path, env=env)
    assert unknown.returncode == 2 and "No such option" in unknown.stderr and not unknown.stdout
    missing, _ = _imported("tool", "get_step_trace", str(tmp_path / "missing.xplane.pb"), cwd=tmp_path, env=env)
    assert missing.returncode == 2 and "no such file or directory" in missing.stderr
    assert json.loads(first.stdout)["tool"] == "get_step_trace"


def test_tool_without_a_name_prints_its_help_as_it_is(tmp_path):
    """The help is click's plain text: printed as it is, its `[name]` and `<list[str]>` are not read as markup."""
    done, _ = _imported("tool", cwd=tmp_path, env={})
    assert done.returncode == 0
    assert "tool [OPTIONS] [name] [path]" in done.stdout and "--arg <list[str]>" in done.stdout
