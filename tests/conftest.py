"""Shared fixtures: real profiles only.

- CPU profiles are captured once per test session from the bundled JAX workloads (real
  `jax.profiler.trace` runs, one subprocess each, ~30 s in all).
- H200 GPU profiles of the same workloads are committed under tests/profiles/h200 (see its README).
- TPU/GPU/corrupt profiles from public repositories come from ../shared/profiles beside the checkout.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import pytest
from xdiag.examples import WORKLOADS
from xdiag.examples.capture import capture_workload

TESTS = Path(__file__).resolve().parent
H200 = TESTS / "profiles" / "h200"
SHARED_PROFILES = TESTS.parents[1] / "shared" / "profiles"


@pytest.fixture(scope="session", autouse=True)
def local_result_cache(tmp_path_factory) -> Path:
    """`xdiag tool` and `xdiag mcp` keep answers per user (~/.cache/xdiag): the tests' go to a folder of their own."""
    folder = tmp_path_factory.mktemp("local-result-cache")
    os.environ["XDIAG_LOCAL_CACHE_DIR"] = str(folder)
    return folder


@pytest.fixture(scope="session")
def cpu_profiles(tmp_path_factory) -> dict[str, Path]:
    """workload name -> its freshly captured CPU *.xplane.pb."""
    logdir = tmp_path_factory.mktemp("cpu-profiles")
    # One at a time: a workload sharing the cores with another would profile the contention, not itself.
    return {name: capture_workload(name, logdir) for name in WORKLOADS}


@pytest.fixture(scope="session")
def lockstep(tmp_path_factory) -> dict[str, Path]:
    """workload -> its session folder: one real xplane per process of a two-process jax.distributed job in lockstep
    (process1 is the straggler)."""
    logdir = tmp_path_factory.mktemp("lockstep")
    return {name: capture_workload(name, logdir) for name in ("straggler_input", "straggler_compute")}


@pytest.fixture(scope="session")
def h200_profiles() -> dict[str, Path]:
    return {p.name.removesuffix(".xplane.pb"): p for p in sorted(H200.glob("*.xplane.pb"))}


ALLOW_MISSING_SHARED = "XDIAG_ALLOW_MISSING_SHARED"
"""Set to 1 for a local run without ../shared: its tests then skip. CI (CI=true) never skips them: it fails."""


def missing_shared(path: Path) -> None:
    """`path` under ../shared (the public profiles and traces beside the checkout) is absent: a failure, or a skip
    where XDIAG_ALLOW_MISSING_SHARED=1 says so for a local run (never under CI=true)."""
    message = (f"{path} is not here: the public TPU/GPU profiles and traces live in ../shared/profiles and "
               "../shared/traces beside the checkout")
    in_ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    if os.environ.get(ALLOW_MISSING_SHARED) == "1" and not in_ci:
        pytest.skip(f"{message} ({ALLOW_MISSING_SHARED}=1)")
    pytest.fail(f"{message}; for a local run without them, set {ALLOW_MISSING_SHARED}=1 to skip these tests",
                pytrace=False)


def shared_profile(relative: str) -> Path:
    path = SHARED_PROFILES / relative
    if not path.exists():
        missing_shared(path)
    return path


@pytest.fixture
def private_copy(tmp_path):
    """Copies a profile into tmp_path (XProf's converters write next to their input)."""

    def copy(path: Path) -> Path:
        target = tmp_path / path.name
        shutil.copyfile(path, target)
        return target

    return copy


@contextlib.contextmanager
def running_local_stack(tmp_path_factory, settings=None):
    """The whole pipeline on the real emulators (Pub/Sub, Firestore, fake-gcs-server) and every function under
    functions-framework, stopped (every process group) on exit, or by its reaper if this process dies first. Its
    emulators' hosts are in os.environ while it runs (and what was there before, after).

    Never skipped: where the Google Cloud CLI, its emulators or Java are missing, the tests fail saying what to
    install."""
    import os

    from xdiag.cloud.localstack import LocalStack
    from xdiag.cloud.stack_config import StackError, StackSettings

    # Short enough for tests: a multi-host session waits 8 s for its late hosts; the sweeper ticks every 3 s and
    # repairs an analysis 30 s without progress (far above one tool's run here), failing it after 3 repairs.
    # Its bucket in memory: a test here uploads object names Cloud Storage takes and the filesystem backend cannot hold
    # (a path segment over 255 bytes); tests/test_durability.py runs the default, the bucket on disk.
    settings = settings or StackSettings(quiet_period_s=1.0, multi_host_quiet_period_s=8.0, stage_deadline_s=30.0,
                                         max_repairs=3, sweep_interval_s=3.0, min_backoff_s=1.0, max_backoff_s=2.0,
                                         storage_backend="memory")
    stack = LocalStack(tmp_path_factory.mktemp("stack"), settings)
    try:
        stack.start(owner_pid=os.getpid())
    except StackError as exc:
        pytest.fail(f"the emulator tests need the local stack: {exc}", pytrace=False)
    saved = {key: os.environ.get(key) for key in stack.env}
    os.environ.update(stack.env)
    try:
        yield stack
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if stack.state_file.exists():  # the services as they are now (a test may have restarted some: `xdiag up`)
            stack = LocalStack.attach(stack.state_dir)
        left = stack.stop()
        assert not left, f"the stack did not stop cleanly: {left}"


@pytest.fixture(scope="session")
def local_stack(tmp_path_factory):
    """One local stack (running_local_stack) for the test session. Tests that freeze or kill its functions use one
    of their own (tests/test_faults.py): see there why."""
    with running_local_stack(tmp_path_factory) as stack:
        yield stack
