"""Shared fixtures: real profiles only.

- CPU profiles are captured once per test session from the bundled JAX workloads (real
  `jax.profiler.trace` runs, one subprocess each, ~30 s in all).
- H200 GPU profiles of the same workloads are committed under tests/profiles/h200 (see its README).
- TPU/GPU/corrupt profiles from public repositories come from ../shared/profiles beside the checkout.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from xdiag.workloads import WORKLOADS
from xdiag.workloads.capture import capture_workload

TESTS = Path(__file__).resolve().parent
H200 = TESTS / "profiles" / "h200"
SHARED_PROFILES = TESTS.parents[1] / "shared" / "profiles"


@pytest.fixture(scope="session")
def cpu_profiles(tmp_path_factory) -> dict[str, Path]:
    """workload name -> its freshly captured CPU *.xplane.pb."""
    logdir = tmp_path_factory.mktemp("cpu-profiles")
    # One at a time: a workload sharing the cores with another would profile the contention, not itself.
    return {name: capture_workload(name, logdir) for name in WORKLOADS}


@pytest.fixture(scope="session")
def h200_profiles() -> dict[str, Path]:
    return {p.name.removesuffix(".xplane.pb"): p for p in sorted(H200.glob("*.xplane.pb"))}


def shared_profile(relative: str) -> Path:
    path = SHARED_PROFILES / relative
    if not path.exists():
        pytest.skip(f"{path} is not here: the public TPU/GPU profiles live in ../shared/profiles beside the checkout")
    return path


@pytest.fixture
def private_copy(tmp_path):
    """Copies a profile into tmp_path (XProf's converters write next to their input)."""

    def copy(path: Path) -> Path:
        target = tmp_path / path.name
        shutil.copyfile(path, target)
        return target

    return copy
