"""Profile workloads with the real JAX profiler, each in its own subprocess.

For every workload a fresh Python process is started (so XLA flags such as
``--xla_force_host_platform_device_count`` take effect before jax is imported
and no compile cache or profiler state leaks between workloads). The child:

1. calls the module's ``setup()`` and runs ``WARMUP_STEPS`` steps outside the
   trace (compiling everything the steps need);
2. runs the measured steps inside ``jax.profiler.trace(<logdir>/<name>)``,
   each step inside ``jax.profiler.StepTraceAnnotation("train", step_num=k)``
   (k = 0..steps-1) and, unless the module sets ``BLOCK_EACH_STEP = False``,
   blocks on the step's outputs inside the annotation so that the step's
   device work falls inside it;
3. reports the ``<logdir>/<name>/plugins/profile/<session>/<host>.xplane.pb``
   it wrote.

Use :func:`capture_workload` from Python or ``python -m xdiag.examples``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from xdiag.examples import WORKLOADS, WorkloadSkipped, load_module

WARMUP_STEPS = 2
CHILD_TIMEOUT_S = 600
_RESULT_MARK = "XDIAG_CAPTURE_RESULT "
_SKIP_MARK = "XDIAG_CAPTURE_SKIP "
_SKIP_RC = 3
_DISTRIBUTED_ENV = "XDIAG_CAPTURE_DISTRIBUTED"  # "coordinator,processes,process" for a multi-process workload
_PKG_ROOT = Path(__file__).resolve().parents[2]  # directory holding the xdiag package


class WorkloadFailed(RuntimeError):
    """A workload's capture subprocess failed."""


@dataclass(frozen=True)
class CaptureResult:
    name: str
    path: Path  # the .xplane.pb written
    size_bytes: int
    steps: int
    steps_wall_s: float  # wall time of the measured steps (inside the trace)
    process_wall_s: float  # wall time of the whole subprocess


def child_env(name: str) -> dict[str, str]:
    """Environment for the capture subprocess of workload ``name``."""
    env = dict(os.environ)
    paths = [str(_PKG_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    need = WORKLOADS[name].needs_devices
    flags = env.get("XLA_FLAGS", "")
    if need > 1 and "xla_force_host_platform_device_count" not in flags:
        # Only affects the CPU (host) platform; harmless on GPU/TPU.
        env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={need}".strip()
    extra = WORKLOADS[name].xla_flags
    if extra:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {extra}".strip()
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    return env


def _folder(name: str, fixed: bool, step_markers: bool) -> str:
    return name + ("-fixed" if fixed else "") + ("" if step_markers else "-unmarked")


def capture(
    name: str, logdir: str | os.PathLike, steps: int | None = None, fixed: bool = False, step_markers: bool = True
) -> CaptureResult:
    """Profile workload ``name`` in a subprocess; return what it wrote. ``fixed`` runs the module's
    ``fixed_step`` (the known problem fixed) into ``<logdir>/<name>-fixed/``, for before/after comparisons.
    ``step_markers=False`` leaves out the step annotations (into ``<name>-unmarked/``), as many real captures do.

    Raises WorkloadSkipped if the workload cannot run here (e.g. too few
    devices), WorkloadFailed if the subprocess fails.
    """
    if name not in WORKLOADS:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    logdir = Path(logdir).resolve()
    folder = _folder(name, fixed, step_markers)
    try:
        (logdir / folder).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise WorkloadFailed(f"workload {name!r}: cannot create {logdir / folder}: {exc}") from exc
    cmd = [sys.executable, "-m", "xdiag.examples.capture", name, str(logdir), str(int(steps)) if steps else "0"]
    if fixed:
        cmd.append("--fixed")
    if not step_markers:
        cmd.append("--no-step-markers")
    processes = WORKLOADS[name].processes
    t0 = time.perf_counter()
    if processes > 1:
        info = _run_processes(name, cmd, processes, logdir / folder)
    else:
        info = _run_child(name, cmd, child_env(name))
    process_wall = time.perf_counter() - t0
    path = Path(info["path"])
    return CaptureResult(
        name=name,
        path=path,
        size_bytes=sum(p.stat().st_size for p in path.glob("*.xplane.pb")) if path.is_dir() else path.stat().st_size,
        steps=info["steps"],
        steps_wall_s=info["steps_wall_s"],
        process_wall_s=process_wall,
    )


def _run_child(name: str, cmd: list[str], env: dict[str, str]) -> dict:
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise WorkloadFailed(f"workload {name!r} timed out after {CHILD_TIMEOUT_S}s") from exc
    return _child_result(name, proc.returncode, proc.stdout, proc.stderr)


def _child_result(name: str, returncode: int, stdout: str, stderr: str) -> dict:
    lines = stdout.splitlines()
    if returncode == _SKIP_RC:
        reason = next((line[len(_SKIP_MARK):] for line in lines if line.startswith(_SKIP_MARK)), "skipped")
        raise WorkloadSkipped(f"{name}: {reason}")
    result = next((line[len(_RESULT_MARK):] for line in lines if line.startswith(_RESULT_MARK)), None)
    if returncode != 0 or result is None:
        tail = "\n".join((stderr or stdout).strip().splitlines()[-25:])
        raise WorkloadFailed(f"workload {name!r} failed (exit code {returncode}):\n{tail}")
    return json.loads(result)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run_processes(name: str, cmd: list[str], processes: int, out: Path) -> dict:
    """Start `processes` children that join one jax.distributed job on 127.0.0.1, each tracing its own steps;
    gather their profiles into one session folder, one file per process."""
    coordinator = f"127.0.0.1:{_free_port()}"
    children = []
    for process in range(processes):
        env = child_env(name)
        env[_DISTRIBUTED_ENV] = f"{coordinator},{processes},{process}"
        children.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    try:
        for child in children:
            stdout, stderr = child.communicate(timeout=CHILD_TIMEOUT_S)
            results.append((child.returncode, stdout, stderr))
    except subprocess.TimeoutExpired as exc:
        raise WorkloadFailed(f"workload {name!r} timed out after {CHILD_TIMEOUT_S}s") from exc
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    infos = [_child_result(name, *result) for result in results]
    session = out / "session"
    session.mkdir(parents=True, exist_ok=True)
    for process, info in enumerate(infos):
        written = Path(info["path"])
        # Each process names its file after the machine; on one machine they would collide.
        shutil.copyfile(written, session / f"{written.name.removesuffix('.xplane.pb')}_process{process}.xplane.pb")
    return {"path": str(session), "steps": infos[0]["steps"], "steps_wall_s": max(i["steps_wall_s"] for i in infos)}


def capture_workload(
    name: str, logdir: str | os.PathLike, steps: int | None = None, fixed: bool = False, step_markers: bool = True
) -> Path:
    """Profile workload ``name`` into ``<logdir>/<name>/`` (``<name>-fixed/`` with the fix) and return the
    ``.xplane.pb`` path (a multi-process workload: the session folder holding one file per process).
    ``steps`` defaults to the module's DEFAULT_STEPS."""
    return capture(name, logdir, steps, fixed, step_markers).path


def trace_steps(step, state, out: Path, steps: int, step_markers: bool = True,
                block_each_step: bool = True, perfetto: bool = False) -> tuple[Path, float] | None:
    """Warm up (``WARMUP_STEPS`` steps outside the trace, compiling what the steps need), then run ``steps`` steps
    inside ``jax.profiler.trace(out)``, each in a ``train`` step annotation unless ``step_markers`` is False; with
    ``perfetto`` the profiler also writes its Chrome trace (``perfetto_trace.json.gz``) beside the xplane.
    Returns the ``.xplane.pb`` written and the measured steps' wall time, or None when the profiler wrote nothing."""
    import jax

    for i in range(WARMUP_STEPS):
        state = step(state, i)
    jax.block_until_ready(state)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    with jax.profiler.trace(str(out), create_perfetto_trace=perfetto):
        t0 = time.perf_counter()
        for k in range(steps):
            marker = jax.profiler.StepTraceAnnotation("train", step_num=k) if step_markers else contextlib.nullcontext()
            with marker:
                state = step(state, WARMUP_STEPS + k)
                if block_each_step:
                    jax.block_until_ready(state)
        jax.block_until_ready(state)
        steps_wall = time.perf_counter() - t0
    written = [p for p in out.glob("plugins/profile/*/*.xplane.pb") if p.stat().st_mtime >= started - 1.0]
    if not written:
        return None
    return max(written, key=lambda p: p.stat().st_mtime), steps_wall


def _child_main(name: str, logdir: str, steps: int | None, fixed: bool = False, step_markers: bool = True) -> int:
    """Runs inside the subprocess: warm up, then trace the measured steps."""
    import jax

    distributed = os.environ.get(_DISTRIBUTED_ENV)
    process = ""
    if distributed:
        coordinator, processes, process = distributed.split(",")
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=coordinator, num_processes=int(processes), process_id=int(process))
    module = load_module(name)
    steps = steps or module.DEFAULT_STEPS
    if fixed and not hasattr(module, "fixed_step"):
        print(f"workload {name!r} has no fixed variant (no fixed_step)", file=sys.stderr)
        return 1
    step = module.fixed_step if fixed else module.step
    try:
        state = module.setup()
    except WorkloadSkipped as exc:
        print(_SKIP_MARK + str(exc), flush=True)
        return _SKIP_RC
    out = Path(logdir) / _folder(name, fixed, step_markers) / (f"process{process}" if distributed else "")
    traced = trace_steps(step, state, out, steps, step_markers, getattr(module, "BLOCK_EACH_STEP", True))
    if traced is None:
        print(f"no .xplane.pb written under {out}", file=sys.stderr)
        return 1
    path, steps_wall = traced
    print(
        _RESULT_MARK
        + json.dumps({"path": str(path), "steps": steps, "steps_wall_s": round(steps_wall, 4)}),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    # Child entry point: python -m xdiag.examples.capture NAME LOGDIR STEPS [--fixed] [--no-step-markers]
    # (STEPS 0: the default)
    _flags = {"--fixed", "--no-step-markers"}
    _args = [a for a in sys.argv[1:] if a not in _flags]
    if len(_args) != 3:
        sys.exit("usage: python -m xdiag.examples.capture NAME LOGDIR STEPS [--fixed] [--no-step-markers]  "
                 "(internal; use python -m xdiag.examples)")
    sys.exit(_child_main(_args[0], _args[1], int(_args[2]), "--fixed" in sys.argv[1:], "--no-step-markers" not in sys.argv[1:]))
