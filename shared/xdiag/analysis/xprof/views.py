"""XProf's own analyses of one device (TPU/GPU) profile session, in-process, each computed at most once.

`XprofViews` gives XProf the session's xplane files in a private folder (`session_dir`) and answers each view by
calling the XProf CLI tool functions that ship in the `xprof` wheel (`xprof.cli.tools.*`,
`xprof.cli.internal.xprof_data`), or the converter itself where no tool reads it (kernel_stats, smart_suggestion,
memory_profile); one module per view builds its dict (`overview`, `roofline` …). Every view returns a plain
JSON-serialisable dict: a compact top level of numbers with units in their names, `unavailable` (top-level key -> why
it is None) where some are missing, and `detail` with bounded fuller data. A view XProf has no data for raises
`NotAvailable` with the reason; an unreadable file raises `ProfileError`.

Computed once, per instance: the conversions behind the views (`conversions`, routed from XProf's process-wide
client), the tools' results and the finished views. The tools' own result cache (`decorators.cached`: SQLite shared by
every process, keyed by file *content*) is bypassed by calling the undecorated functions, so two instances never see
each other's results. `prefetch()` starts the conversions in worker processes where one process runs every tool.

Two conversions whose answer a scan of the files' bytes can tell in advance are not run where it can (they cost
seconds each on large profiles): utilization_viewer builds rows only from events carrying the `counter_value` stat,
and smart_suggestion in xprof 2.24.2 suggests only where events named `barrier-cores` are. `may_have_counter_samples`
/ `may_have_suggestions` say which; tests/test_xprof_views.py compares these answers with the converters' own.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from xdiag.analysis.xprof import (
    device_information,
    hlo_op_profile,
    kernel_stats,
    kpi_metrics,
    memory_profile,
    overview,
    peak_allocations,
    roofline,
    smart_suggestions,
    step_trace,
    utilization,
)
from xdiag.analysis.xprof.common import DEFAULT_TOP_N, as_positive, datatable_rows, table_with, xprof_api, xprof_version
from xdiag.analysis.xprof.conversions import (
    OP_STATS_CONVERTERS,
    ConversionTooLarge,
    Conversions,
    converter_name,
    install_router,
    op_profile_as,
    planned_conversions,
)
from xdiag.analysis.xprof.quiet import quiet
from xdiag.analysis.xprof.session_dir import (
    COUNTER_SAMPLE_STAT,
    extract_hlo_protos,
    file_holds,
    make_private_copy,
    remove_private_copy,
    xprof_side_files,
)
from xdiag.errors import NotAvailable, ProfileError, XdiagError
from xdiag.profile import scratch, slim
from xdiag.profile.reader import plane_names

_OP_PROFILE_FORMS = {"get_hlo_op_profile": "binary", "get_top_hlo_ops": "binary", "get_roofline_model": "expressions"}
"""XProf's CLI tools that read op_profile, and the form they get it in (`conversions.op_profile_as`)."""
_COMMAND_BUFFER = b"command_buffer"
"""The HLO op name (`command_buffer`, `command_buffer.3`) of kernels XLA:GPU replays from a CUDA graph."""
_BARRIER_CORES_EVENT = b"barrier-cores"
"""The event xprof 2.24.2's only smart-suggestion rule (BarrierCoresRule) measures."""
_SMART_SUGGESTION_AUDITED_VERSION = "2.24.2"
"""The xprof version whose smart_suggestion rule set was read (the wheel registers BarrierCoresRule only)."""


def view_key(method: str, **arguments: Any) -> str:
    """The key a view is memoised under (and stored under, `xdiag.analysis.xprof.stored`): its name, with its
    arguments (top_n as an int, module as its repr) where it takes any."""
    if not arguments:
        return method
    shown = ", ".join(f"{name}={int(value) if name == 'top_n' else value!r}" for name, value in arguments.items())
    return f"{method}({shown})"


class ViewMethods:
    """XProf's views, one method each, all answered by `_answer(view name, **arguments)`: computed (`XprofViews`) or
    taken from a record (`xdiag.analysis.xprof.stored.StoredViews`)."""

    def _answer(self, method: str, **arguments: Any) -> dict:
        raise NotImplementedError

    def overview(self) -> dict:
        """XProf's overview page: step time, duty cycle, idle, MXU, roofline utilisation, device.

        Top level: device_type, device_core_count, host_count, is_training, step_time_ms,
        step_time_stddev_ms, duty_cycle_percent, device_idle_percent, mxu_utilization_percent,
        flop_rate_utilization_percent, memory_bw_utilization_percent, hbm_bw_utilization_percent,
        bound_by, custom_call_share_percent. Detail: performance_summary and run_environment as
        XProf's get_overview gives them (numbers made numbers), xprof_statement (XProf's own
        bottleneck verdict, not a finding), diagnostics, top_ops (XProf's top-10 table).
        """
        return self._answer("overview")

    def step_trace(self) -> dict:
        """Per-step breakdown (pod_viewer / input_pipeline_analyzer, via get_step_trace).

        Top level: step_count, step_time_ms (average), step_time_min_ms, step_time_max_ms,
        step_time_stddev_ms, compute_time_ms, compute_percent, communication_percent,
        infeed_percent, outfeed_percent, idle_percent, primary_bottleneck, is_aggregate.
        Detail: steps (first 20). NotAvailable when the profile has no step markers.
        """
        return self._answer("step_trace")

    def kpi_metrics(self) -> dict:
        """XProf's get_kpi_metrics fields, assembled from this instance's overview, memory profile
        and roofline (nothing is converted again): step_time_ms, duty_cycle_percent,
        mxu_utilization_percent, flop_rate_utilization_percent, flops_provenance,
        derived_flops_fraction, peak_hbm_gib, memory_capacity_gib, hbm_utilization_percent,
        device_type, device_core_count."""
        return self._answer("kpi_metrics")

    def device_information(self) -> dict:
        """Device peaks from the roofline model plus the run environment: device_type,
        device_core_count, host_count, peak_flop_rate_gflops, peak_hbm_bw_gibs,
        peak_vmem_read_bw_gibs, peak_vmem_write_bw_gibs, hbm_ridge_point_flop_per_byte,
        megacore, has_cmem. Detail: every property XProf gives, units in the names."""
        return self._answer("device_information")

    def utilization(self) -> dict:
        """Hardware-counter utilisation (utilization_viewer): *percent_of per unit (HBM, MXU, ICI,
        vector ALU …) over the whole capture. NotAvailable without performance counters."""
        return self._answer("utilization")

    def smart_suggestions(self) -> dict:
        """XProf's rule-based suggestions: suggestion_count; detail.suggestions (rule, text)."""
        return self._answer("smart_suggestions")

    def roofline(self) -> dict:
        """Program roofline (get_roofline_model): roofline_efficiency_percent,
        compute_efficiency_percent, max_mem_bw_utilization_percent, hbm_bw_utilization_percent,
        bound_by, operational intensities and ridge point, measured_flop_rate_gflops,
        hbm_bw_gibs, peaks, total_time_ms, flops_provenance, derived_flops_fraction, ops_analyzed.
        Detail: top_operations (20, per-op roofline placement), device_info.
        NotAvailable when XProf analysed no HLO ops."""
        return self._answer("roofline")

    def hlo_op_profile(self, top_n: int = DEFAULT_TOP_N) -> dict:
        """HLO ops by self time (op_profile, via get_hlo_op_profile and get_top_hlo_ops).

        Top level: total_time_ms (summed core time), idle_percent, op_count, category_count,
        top_category, top_category_percent, top_op, top_op_percent. Detail: categories,
        top_ops_by_time, top_ops_by_flops, top_ops_by_bytes (top_n rows each).
        NotAvailable when op_profile holds no HLO ops (only idle time).
        """
        return self._answer("hlo_op_profile", top_n=top_n)

    def memory_profile(self) -> dict:
        """Device memory over the capture (memory_profile), per allocator.

        Top level: peak_hbm_gib, peak_hbm_bytes, memory_capacity_gib (of the allocator holding
        the peak), hbm_utilization_percent, peak_allocator, heap_at_peak_gib, stack_at_peak_gib,
        free_at_peak_gib, fragmentation_at_peak_percent, device_allocator_count. Detail:
        allocators (device and host), largest_allocations_at_peak (of the peak allocator).
        """
        return self._answer("memory_profile")

    def peak_allocations(self, module: str | None = None) -> dict:
        """HLO modules by peak HBM and their largest buffers (memory_viewer, via get_peak_allocations).

        Top level: module_count, peak_module, peak_module_hbm_gib, top_buffer, top_buffer_mib
        (with `module`: module, module_hbm_gib, buffer_count, top_buffer, top_buffer_mib).
        `module` may be the full name (`jit_f(1219…)`), or a unique base name or prefix.
        Detail: modules (20), each with top_buffers (20). NotAvailable without HLO modules.
        """
        return self._answer("peak_allocations", module=module)

    def kernel_stats(self, top_n: int = DEFAULT_TOP_N) -> dict:
        """GPU kernels (XProf's kernel_stats converter).

        Top level: kernel_count, kernel_launches, total_kernel_time_ms, top_kernel,
        top_kernel_time_percent, tensor_core_time_percent, tensor_core_eligible_time_percent.
        Detail: kernels (top_n by total time: launch config, registers, occupancy, op).
        NotAvailable on TPUs (no kernel launches: see hlo_op_profile) and without kernel events.
        """
        return self._answer("kernel_stats", top_n=top_n)


_BUILDERS: dict[str, Callable[..., dict]] = {
    "overview": overview.build,
    "step_trace": step_trace.build,
    "kpi_metrics": kpi_metrics.build,
    "device_information": device_information.build,
    "utilization": utilization.build,
    "smart_suggestions": smart_suggestions.build,
    "roofline": roofline.build,
    "hlo_op_profile": lambda views, top_n: hlo_op_profile.build(views, max(1, int(top_n))),
    "memory_profile": memory_profile.build,
    "peak_allocations": peak_allocations.build,
    "kernel_stats": lambda views, top_n: kernel_stats.build(views, max(1, int(top_n))),
}
"""Each view's builder, given the views and the view method's arguments."""


class XprofViews(ViewMethods):
    """XProf's converters over one session's xplane files, on a private copy, each view computed once.

    Every view returns a JSON-serialisable dict (numbers are numbers, units in key names, None
    where XProf has no value and `unavailable` saying why, bounded `detail`), or raises
    `NotAvailable` with the reason, or `ProfileError` when XProf cannot read the files.
    Thread-safe; instances on different sessions may run concurrently.
    """

    def __init__(
        self,
        xplane_paths: Sequence[str | os.PathLike[str]] | str | os.PathLike[str],
        workdir: Path | None = None,
        all_events: bool = False,
        memory_from_host_planes: bool = False,
    ):
        """`all_events=True` gives XProf the files as they are; by default the private copy leaves out the host
        events XProf's views make no use of (`xdiag.profile.slim`, `host_events`). `memory_from_host_planes=True`
        converts memory_profile from copies without the device planes (`host_plane_views`), which give the same
        view: the detached converter's choice (`background`), where the device planes are most of the bytes."""
        if isinstance(xplane_paths, (str, os.PathLike)):
            xplane_paths = [xplane_paths]
        originals = [Path(p).expanduser().absolute() for p in xplane_paths]
        if not originals:
            raise ProfileError("no xplane files given")
        for path in originals:
            if not path.is_file():
                raise ProfileError(f"{path}: no such file")
            if path.stat().st_size == 0:
                raise ProfileError(f"{path}: empty file")
        self.originals: tuple[Path, ...] = tuple(originals)

        private_copy = make_private_copy(originals, workdir, all_events)
        self.run_dir: Path = private_copy.run_dir
        self.files: list[Path] = private_copy.files
        self.events_left_out = private_copy.events_left_out
        """Host events the private copy leaves out, all files together."""
        self.xspace_bytes = sum(path.stat().st_size for path in self.files)
        """The bytes XProf's converters read (the private copy): what their memory is estimated from."""
        self._side_files: list[str] = []
        self._lock = threading.RLock()
        self.conversions = Conversions(
            self.run_dir, self.files, self.originals, self.xspace_bytes, self._lock, self._work_while_waiting
        )
        self._finalizer = weakref.finalize(
            self, remove_private_copy, private_copy.removable, self._side_files, self.conversions.worker_folders
        )
        self._pages: dict[str, Any] = {}
        self._tools: dict[str, Any] = {}
        self._views: dict[str, Any] = {}
        self._hlo_protos_extracted = False
        self._done_while_waiting: set[str] = set()
        self._mentioned: dict[bytes, bool] = {}
        self._memory_from_host_planes = memory_from_host_planes
        self._host_planes: XprofViews | None = None
        self._host_planes_folder: str | None = None
        self.timings_s: dict[str, float] = {}
        """Seconds each view took the first time (conversions included), keyed by view name."""

    # context manager and clean-up

    def __enter__(self) -> XprofViews:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"XprofViews({[str(p) for p in self.originals]!r}, run_dir={str(self.run_dir)!r})"

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    @property
    def conversion_counts(self) -> dict[str, int]:
        """How often each conversion ran, keyed by converter and parameters; 1 each, by design."""
        return self.conversions.counts

    @property
    def worker_cpu_s(self) -> dict[str, float]:
        """CPU seconds of each conversion that ran in a worker process (see `prefetch`)."""
        return self.conversions.worker_cpu_s

    @property
    def workers_converting(self) -> int:
        """How many worker processes `prefetch` started whose conversions are not all taken yet (0 for none)."""
        return self.conversions.workers_converting

    def close(self) -> None:
        """Removes the private copy (and XProf's per-run-folder files under its cache folder)."""
        with self._lock:
            if self.closed:
                return
            self.conversions.stop()
            if self._host_planes is not None:
                self._host_planes.close()
            if self._host_planes_folder is not None:
                shutil.rmtree(self._host_planes_folder, ignore_errors=True)
            names = [path.name for path in self.files]
            if self.conversions.counts:
                self._side_files.extend(xprof_side_files(self.run_dir, names))
            for run_dir in self.conversions.worker_run_dirs:
                self._side_files.extend(xprof_side_files(run_dir, names))
            self._finalizer()

    def prefetch(self) -> int:
        """Starts the conversions the views need in worker processes (`Conversions.prefetch`) and returns at once:
        the op_stats family in one group (what the first view, the overview, waits for), every other converter in
        its own. Returns how many processes were started (0: off, or already started)."""
        with self._lock:
            if self.closed:
                raise RuntimeError(f"{self!r} is closed")
            return self.conversions.prefetch(
                lambda: planned_conversions(self.files, self.may_have_counter_samples(), self.may_have_suggestions())
            )

    # the views: each built once, by its module (`_BUILDERS`)

    def _answer(self, method: str, **arguments: Any) -> dict:
        return self._view(view_key(method, **arguments), lambda: _BUILDERS[method](self, **arguments))

    def _view(self, key: str, build: Callable[[], dict]) -> dict:
        with self._lock:
            if self.closed:
                raise RuntimeError(f"{self!r} is closed")
            if key not in self._views:
                started = time.perf_counter()
                try:
                    outcome: Any = build()
                except XdiagError as error:
                    outcome = error
                except Exception as error:
                    if self.conversions.unreadable:
                        raise ProfileError(self.conversions.unreadable) from error
                    raise
                self._views[key] = outcome
                self.timings_s[key] = round(time.perf_counter() - started, 4)
            outcome = self._views[key]
        if isinstance(outcome, Exception):
            raise outcome
        return copy.deepcopy(outcome)

    def _work_while_waiting(self) -> None:
        """Work the views will ask for and that needs no conversion still in a worker, done by a thread about to wait
        for one instead of after: XProf's peak-allocation table (the HLO protos' extraction and a memory_viewer
        conversion per module, which no worker runs) from the start, and once the op_stats family is in hand, the
        CLI answers read from it (each parses op_profile's JSON: tens of ms apiece on large profiles, while the views
        wait for memory_profile). Each once; whatever fails is left for its own view to meet and report (`tool`
        memoises the failure), never raised to the view that waits."""
        with self._lock:
            if self.closed or self.conversions.unreadable:
                return
            op_stats_in_hand = all(self.conversions.holds(name) for name in OP_STATS_CONVERTERS)
            work = {"peak_allocations": lambda: self.has_metadata_plane() and peak_allocations.every_module(self)}
            if op_stats_in_hand:
                work.update(roofline=self.roofline_tool, hlo_op_profile=lambda: hlo_op_profile.answers(self))
            for name, do in work.items():
                if name in self._done_while_waiting:
                    continue
                self._done_while_waiting.add(name)
                with contextlib.suppress(Exception):
                    do()

    # XProf's answers for this session, each once

    def _check_readable(self) -> None:
        if self.conversions.unreadable:
            raise ProfileError(self.conversions.unreadable)

    def fetch(self, tool_name: str, **params: Any) -> Any:
        """A converter's raw output for this session (through the router, so memoised)."""
        self._check_readable()
        install_router()
        with quiet():
            result = xprof_api().client.get_client().fetch(tool_name, str(self.run_dir), **params)
        self._check_readable()
        return result[1] if isinstance(result, tuple) and len(result) == 2 else result

    def host_plane_views(self) -> XprofViews:
        """XprofViews of copies of the files without their device planes (`session_dir.copy_without_device_planes`),
        made once: XProf's memory_profile reads the host threads plane alone, yet parses the whole file first (on the
        87.6 MiB TPU v5e capture 1.1 s of CPU whole against 0.4 s on the copy, for the same view:
        tests/test_xprof_background.py compares them). Raises ProfileError where a copy cannot be made."""
        from xdiag.analysis.xprof.session_dir import copy_without_device_planes

        with self._lock:
            if self._host_planes is None:
                folder = scratch.make("xprof-host-planes")
                try:
                    copies = [folder / path.name for path in self.files]
                    for path, copy_path in zip(self.files, copies):
                        copy_without_device_planes(path, copy_path)
                    self._host_planes = XprofViews(copies)
                except BaseException as error:
                    shutil.rmtree(folder, ignore_errors=True)
                    if isinstance(error, OSError):
                        raise ProfileError(f"no copy without the device planes in {folder}: {error}") from error
                    raise
                self._host_planes_folder = str(folder)
            return self._host_planes

    def page(self, tool_name: str, **params: Any) -> Any:
        """A converter's JSON output, parsed once; None when the converter gave nothing."""
        host_planes = self._memory_from_host_planes and not self.conversions.unreadable
        if host_planes and converter_name(tool_name) == "memory_profile":
            with contextlib.suppress(ProfileError):  # no copy: converted from the files, XProf says what it meets
                return self.host_plane_views().page(tool_name, **params)
        key = converter_name(tool_name) + json.dumps(params, sort_keys=True, default=str)
        with self._lock:
            if key not in self._pages:
                data = self.fetch(tool_name, **params)
                if isinstance(data, bytes):
                    data = data.decode("utf-8", errors="replace")
                self._pages[key] = json.loads(data) if data else None
            return self._pages[key]

    def tool(self, name: str, function: Callable[..., Any], **kwargs: Any) -> Any:
        """A CLI tool function's result for this session, parsed, once per name and arguments.

        The undecorated function is called: the decorated one reads and writes XProf's
        cross-process result cache, keyed by file content rather than by session."""
        key = name + json.dumps(kwargs, sort_keys=True, default=str)
        with self._lock:
            if key not in self._tools:
                self._check_readable()
                install_router()
                undecorated = getattr(function, "__wrapped__", None)
                refusals = self.conversions.refusals
                form = _OP_PROFILE_FORMS.get(name)
                op_profile = op_profile_as(form) if form else contextlib.nullcontext()
                try:
                    with quiet(), op_profile:
                        if undecorated is not None:
                            text = undecorated(str(self.run_dir), **kwargs)
                        else:
                            text = function(str(self.run_dir), bypass_cache=True, **kwargs)
                    outcome: Any = json.loads(text) if isinstance(text, str) else text
                except Exception as error:
                    outcome = error
                # XProf's tool functions turn a failed fetch into an error text
                if self.conversions.refusals != refusals:
                    outcome = ConversionTooLarge(self.conversions.too_large)
                self._tools[key] = outcome
            outcome = self._tools[key]
        self._check_readable()
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def extract_hlo_protos(self) -> None:
        """Puts the HLO protos XProf's memory viewer reads in the run folder, once (`session_dir.extract_hlo_protos`:
        from the metadata plane alone, instead of XProf converting every file whole for them)."""
        with self._lock:
            if self._hlo_protos_extracted or self.closed:
                return
            self._hlo_protos_extracted = True
            extract_hlo_protos(self.run_dir, self.files)

    # answers known from the files' bytes (see the module docstring)

    def may_have_counter_samples(self) -> bool:
        """False when no file holds the stat name utilization_viewer reads counter samples from."""
        return self._mentions(COUNTER_SAMPLE_STAT)

    def may_have_command_buffers(self) -> bool:
        """False when no file holds the name XLA gives kernels run from a command buffer (a CUDA graph) as their
        HLO op; XProf's op_profile does not attribute those kernels to HLO instructions."""
        return self._mentions(_COMMAND_BUFFER)

    def has_metadata_plane(self) -> bool:
        """Whether any file has the metadata plane, where the profilers put the HLO modules (from the planes' names:
        milliseconds, whatever the size)."""
        return any(slim.METADATA_PLANE in plane_names(path) for path in self.files)

    def may_have_suggestions(self) -> bool:
        """False when smart_suggestion (the rule set audited for xprof's version) cannot suggest anything."""
        return xprof_version() != _SMART_SUGGESTION_AUDITED_VERSION or self._mentions(_BARRIER_CORES_EVENT)

    def _mentions(self, name: bytes) -> bool:
        """Whether any file holds these bytes (a string in a protobuf is stored as its UTF-8 bytes)."""
        with self._lock:
            if name not in self._mentioned:
                self._mentioned[name] = any(file_holds(path, name) for path in self.files)
            return self._mentioned[name]

    def require_readable(self) -> None:
        """Raises ProfileError if XProf cannot read the files (as a conversion of them would)."""
        with contextlib.suppress(NotAvailable):
            self.overview_tool()

    # shared pieces

    def overview_tool(self) -> dict:
        try:
            return self.tool("get_overview", xprof_api().overview)
        except (FileNotFoundError, ValueError, RuntimeError) as error:
            raise NotAvailable(f"XProf's overview_page has no data for this profile ({error})") from error

    def device_type(self) -> str | None:
        with contextlib.suppress(XdiagError):
            return self.overview_tool().get("run_environment", {}).get("device_type")
        return None

    def no_steps_reason(self) -> str:
        for row in datatable_rows(table_with(self.page("overview_page"), "severity")):
            message = str(row.get("message") or "")
            if "step" in message.lower():
                return f'no step markers (XProf: "{message.split(". ")[0].strip().rstrip(".")}")'
        return "XProf measured no step time in this profile (no step markers)"

    def roofline_tool(self) -> dict:
        try:
            data = self.tool("get_roofline_model", xprof_api().roofline, top_n=DEFAULT_TOP_N)
        except (FileNotFoundError, ValueError, RuntimeError) as error:
            raise NotAvailable(f"XProf's roofline_model failed on this profile ({error})") from error
        if data.get("status") == "NO_DATA" or "program" not in data:
            message = data.get("message", "no program row")
            raise NotAvailable(f"XProf's roofline_model has no data for this profile: {message}")
        if not data.get("total_operations_analyzed"):
            peak = as_positive(data.get("device_info", {}).get("peak_flop_rate"))
            raise NotAvailable(
                "XProf's roofline_model analysed 0 HLO ops on this profile (no XLA ops with cost-model "
                "FLOPs and bytes" + ("" if peak else "; the device's peak FLOP rate is reported as 0") + ")"
            )
        return data

    def roofline_gap(self) -> str | None:
        try:
            self.roofline_tool()
        except NotAvailable as error:
            return str(error)
        return None
