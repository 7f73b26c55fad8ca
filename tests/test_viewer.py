"""`xdiag view` over the embedded default's local store: XProf's own server (the pinned wheel) answers its own
endpoints for every analysed session — the session list, a session's tools, a tool's data — with the capture
button hidden, on the loopback address; the user's profile folders stay untouched; SIGTERM stops everything.
The local stack's bucket (captured and uploaded sessions, mirrored) is in test_viewer_stack.py."""

from __future__ import annotations

import gzip
import html
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from xdiag.cloud.embedded import analyze_session
from xdiag.profile.locate import locate_session
from xdiag.model import Analysis
from xdiag.report.viewer_links import viewer_links, viewer_links_for


def get(url: str, timeout: float = 120):
    """XProf's answer, decoded (it gzips JSON)."""
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        data = answer.read()
        if answer.headers.get("Content-Encoding") == "gzip":
            data = gzip.decompress(data)
        return answer.status, data


class View:
    """`xdiag view …` in its own process group, stopped by SIGTERM."""

    def __init__(self, tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.err = tmp_path / "view.err"
        self.out = tmp_path / "view.out"
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.process = subprocess.Popen([sys.executable, "-m", "xdiag.cli", "view", "--port", "0", *args],
                                            stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=tmp_path,
                                            start_new_session=True, env={**os.environ, **(env or {})})
        deadline = time.monotonic() + 120
        while not self.out.read_text().strip():
            assert self.process.poll() is None, f"xdiag view exited {self.process.returncode}: {self.err.read_text()}"
            assert time.monotonic() < deadline, f"no URL from xdiag view: {self.err.read_text()}"
            time.sleep(0.2)
        self.url = self.out.read_text().split()[0]

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(30)


def _listening(url: str) -> bool:
    parts = urlsplit(url)
    with socket.socket() as s:
        return s.connect_ex((parts.hostname, parts.port)) == 0


@pytest.fixture(scope="module")
def store(h200_profiles, tmp_path_factory) -> Path:
    """The embedded default's store: two sessions analysed by `xdiag analyze`'s code, from copies of the
    profiles in an XProf log dir (run `train`)."""
    root = tmp_path_factory.mktemp("store")
    for name in ("host_sync", "healthy"):
        session = root / "logs" / "train" / "plugins" / "profile" / f"{name}_session"
        session.mkdir(parents=True)
        (session / "vm.xplane.pb").write_bytes(h200_profiles[name].read_bytes())
        analysis = analyze_session(locate_session(session, None), root / "xdiag-out" / name)
        assert analysis.status == "DONE", analysis.failure_reason
    return root


def test_xdiag_view_serves_every_analysed_session_through_xprof_s_own_endpoints(store, tmp_path):
    before = sorted(p.name for p in (store / "logs").rglob("*"))
    view = View(tmp_path, "--store", str(store / "xdiag-out"), "--no-bucket", "--view-dir", str(tmp_path / "v"))
    try:
        assert urlsplit(view.url).hostname == "127.0.0.1"
        status, runs = get(view.url + "/data/plugin/profile/runs")
        assert status == 200 and sorted(json.loads(runs)) == ["train/healthy_session", "train/host_sync_session"]
        status, tools = get(view.url + "/data/plugin/profile/run_tools?run=train/host_sync_session")
        assert {"trace_viewer@", "op_profile", "overview_page", "memory_viewer"} <= set(json.loads(tools))
        status, hosts = get(view.url + "/data/plugin/profile/hosts?run=train/host_sync_session&tag=op_profile")
        host = json.loads(hosts)[0]["hostname"]
        status, data = get(f"{view.url}/data/plugin/profile/data?run=train/host_sync_session&tag=op_profile&host={host}")
        assert status == 200 and json.loads(data)  # XProf converted the profile itself
        status, config = get(view.url + "/data/plugin/profile/config")
        assert json.loads(config)["hideCaptureProfileButton"] is True
        # a report's viewer links name a session XProf lists, and open XProf's page
        analysis = Analysis.model_validate_json((store / "xdiag-out" / "host_sync" / "analysis.json").read_text())
        [(_, report_link), *_] = viewer_links_for(analysis)
        assert parse_qs(urlsplit(report_link).query)["run"][0] in json.loads(runs)
        summary = (store / "xdiag-out" / "host_sync" / "summary.html").read_text()
        for label, link in viewer_links_for(analysis):  # the report shows them as links
            assert f'<a href="{html.escape(link)}">{label}</a>' in summary
        links = dict(viewer_links("train", "host_sync_session", view.url))
        assert parse_qs(urlsplit(links["trace viewer"]).query)["run"] == ["train/host_sync_session"]
        status, page = get(links["op profile"])
        assert status == 200 and b"<title>XProf</title>" in page
        listed = view.err.read_text()
        assert "train/host_sync_session" in listed and "programmatic" in listed
    finally:
        assert view.stop() == 0, view.err.read_text()
    assert not _listening(view.url), "XProf still listens after xdiag view stopped"
    # XProf wrote its caches into xdiag's own tree, never beside the user's profiles
    assert sorted(p.name for p in (store / "logs").rglob("*")) == before
    assert list((tmp_path / "v" / "tree" / "train" / "plugins" / "profile" / "host_sync_session").glob("*.hlo_proto.pb"))


def test_xdiag_view_with_nothing_to_show_still_serves_and_says_so(tmp_path):
    view = View(tmp_path, "--store", str(tmp_path / "empty"), "--no-bucket", "--view-dir", str(tmp_path / "v"))
    try:
        status, runs = get(view.url + "/data/plugin/profile/runs")
        assert status == 200 and json.loads(runs) == []
        assert "no sessions yet" in view.err.read_text()
    finally:
        assert view.stop() == 0


def _answer(url: str) -> tuple[int, bytes]:
    try:
        return get(url, timeout=60)
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read()


def test_xdiag_view_serves_only_its_own_sessions_and_never_a_path_a_request_names(store, h200_profiles, tmp_path):
    """XProf joins `run` onto its log dir (an absolute one replaces it) and takes `session_path`/`run_path` as they
    come: it converted any xplane on the machine and wrote its caches beside it."""
    outside = tmp_path / "elsewhere" / "plugins" / "profile" / "x"
    outside.mkdir(parents=True)
    (outside / "secret.xplane.pb").write_bytes(h200_profiles["healthy"].read_bytes())
    stale = tmp_path / "v" / "tree" / "earlier" / "plugins" / "profile" / "old"  # linked by an earlier view
    stale.mkdir(parents=True)
    (stale / "vm.xplane.pb").write_bytes(h200_profiles["healthy"].read_bytes())
    view = View(tmp_path, "--store", str(store / "xdiag-out"), "--no-bucket", "--view-dir", str(tmp_path / "v"))
    try:
        status, runs = get(view.url + "/data/plugin/profile/runs")
        assert sorted(json.loads(runs)) == ["train/healthy_session", "train/host_sync_session"]
        data = view.url + "/data/plugin/profile/data?tag=overview_page&host=secret&run="
        assert _answer(data + f"{tmp_path / 'elsewhere'}/x")[0] == 404
        assert _answer(data + "../../elsewhere/x")[0] == 404
        assert _answer(view.url + "/data/plugin/profile/data?tag=overview_page&run=earlier/old")[0] == 404
        assert _answer(view.url + "/data/plugin/profile/data?tag=overview_page&run=x&session_path=" + str(outside))[0] == 403
        assert _answer(view.url + "/data/plugin/profile/runs?run_path=" + str(outside.parent))[0] == 403
        assert _answer(view.url + "/data/plugin/profile/capture_profile?service_addr=127.0.0.1:1")[0] == 403
        status, tools = _answer(view.url + "/data/plugin/profile/run_tools?run=train/healthy_session")
        assert status == 200 and "overview_page" in json.loads(tools)
    finally:
        assert view.stop() == 0, view.err.read_text()
    assert sorted(p.name for p in outside.iterdir()) == ["secret.xplane.pb"]  # nothing converted, nothing written


def _outward_address() -> str:
    """An address of this machine on an interface other than loopback (the one its default route leaves by)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # UDP: nothing is sent
        except OSError:
            pytest.skip("this machine has no interface but loopback: nothing to check the worker against")
        return probe.getsockname()[0]


def _worker_port(logdir: Path) -> int:
    """The gRPC port of the XProf server `xdiag view` started over `logdir` (from its command line)."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().decode().split("\0")
        except OSError:
            continue
        if "xdiag.viewer.server" in args and f"--logdir={logdir}" in args:
            return int(next(a for a in args if a.startswith("--grpc_port=")).split("=")[1])
    raise AssertionError(f"no XProf server over {logdir}")


def test_xprof_s_worker_answers_only_on_the_loopback_interface(store, tmp_path):
    """XProf's gRPC worker has no authentication and converts any path it is sent (GetProfileData(session_id=…)):
    it listened on every interface."""
    view = View(tmp_path, "--store", str(store / "xdiag-out"), "--no-bucket", "--view-dir", str(tmp_path / "v"))
    try:
        port = _worker_port(tmp_path / "v" / "tree")
        with socket.socket() as near:
            assert near.connect_ex(("127.0.0.1", port)) == 0  # the frontend's own way to it
        with socket.socket() as far:
            far.settimeout(5)
            assert far.connect_ex((_outward_address(), port)) != 0
        # and the viewer still converts through it
        status, data = get(view.url + "/data/plugin/profile/data?run=train/healthy_session&tag=overview_page")
        assert status == 200 and json.loads(data)
    finally:
        assert view.stop() == 0, view.err.read_text()


def test_a_taken_port_is_refused_with_the_reason_not_answered_with_another_s_url(store, tmp_path):
    first = View(tmp_path, "--store", str(store / "xdiag-out"), "--no-bucket", "--view-dir",
                 str(tmp_path / "v1"))
    try:
        port = str(urlsplit(first.url).port)
        second = subprocess.run([sys.executable, "-m", "xdiag.cli", "view", "--port", port, "--store",
                                 str(store / "xdiag-out"), "--no-bucket", "--view-dir", str(tmp_path / "v2")],
                                capture_output=True, text=True, timeout=120, cwd=tmp_path, stdin=subprocess.DEVNULL)
        assert second.returncode != 0 and not second.stdout.strip(), second.stdout
        assert f"port {port}" in second.stderr and "taken" in second.stderr, second.stderr
    finally:
        assert first.stop() == 0


def _build_tree_when_all_are_ready(view_dir: Path, store: Path, ready, built) -> None:
    from xdiag.viewer.sources import plan_view

    ready.wait()
    try:
        built.put(len(plan_view(view_dir, store, None, []).sessions))
    except Exception as exc:  # the parent asserts on what each view met
        built.put(repr(exc))


def test_several_xdiag_views_of_one_folder_build_it_at_once_without_failing(store, tmp_path):
    """Two `xdiag view` in one folder removed and relinked the same session folders at once (FileExistsError)."""
    import multiprocessing

    # more sessions than the store fixture's two, so the views' relinking overlaps: the same analysis, other names
    many = tmp_path / "store"
    analysis = json.loads((store / "xdiag-out" / "healthy" / "analysis.json").read_text())
    for n in range(40):
        (many / f"s{n}").mkdir(parents=True)
        (many / f"s{n}" / "analysis.json").write_text(json.dumps({**analysis, "session_id": f"session_{n}"}))
    fork = multiprocessing.get_context("fork")
    views = 6
    for round_ in range(3):
        ready, built = fork.Barrier(views), fork.Queue()
        processes = [fork.Process(target=_build_tree_when_all_are_ready, args=(tmp_path / f"v{round_}", many, ready,
                                                                              built)) for _ in range(views)]
        for process in processes:
            process.start()
        answers = [built.get(timeout=120) for _ in processes]
        for process in processes:
            process.join(30)
        assert answers == [40] * views
        for n in range(40):
            folder = tmp_path / f"v{round_}" / "tree" / analysis["run_id"] / "plugins" / "profile" / f"session_{n}"
            assert [p.name for p in folder.iterdir()] == ["vm.xplane.pb"]


def test_xdiag_view_of_a_session_holding_only_a_pytorch_trace_says_where_to_open_it(store, tmp_path):
    """XProf's viewer reads xplanes only: a session analysed from a Kineto trace is not linked into its tree, and
    `xdiag view` names the file and the viewers that open it (Perfetto UI, chrome://tracing) instead of failing."""
    from tests.conftest import SHARED_PROFILES, missing_shared
    from xdiag.viewer.sources import plan_view

    source = SHARED_PROFILES.parent / "traces" / "kineto_TraceLens_h100_bert-small.json.gz"
    if not source.exists():
        missing_shared(source)
    trace = tmp_path / "logs" / "rank0.pt.trace.json.gz"
    trace.parent.mkdir(parents=True)
    trace.write_bytes(source.read_bytes())
    only_traces = tmp_path / "xdiag-out"
    analysis = analyze_session(locate_session(trace, None), only_traces / "rank0")
    assert analysis.status == "DONE", analysis.failure_reason
    done = subprocess.run([sys.executable, "-m", "xdiag.cli", "view", "--port", "0", "--store", str(only_traces),
                           "--no-bucket", "--view-dir", str(tmp_path / "v")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert done.returncode == 0 and not done.stdout.strip(), (done.stdout, done.stderr)
    said = " ".join(done.stderr.split())
    assert "Perfetto" in said and "chrome://tracing" in said and "rank0.pt.trace.json.gz" in said, said
    # Beside xplane sessions: those are linked for XProf, the trace's session is named with where to open it.
    mixed = tmp_path / "mixed"
    for folder in (store / "xdiag-out" / "healthy", only_traces / "rank0"):
        (mixed / folder.name).mkdir(parents=True)
        (mixed / folder.name / "analysis.json").write_bytes((folder / "analysis.json").read_bytes())
    plan = plan_view(tmp_path / "v2", mixed, None, [])
    assert [s.session for s in plan.traces] == [analysis.session_id]
    assert len(plan.sessions) == 1 and all(f.endswith(".xplane.pb") for f in plan.sessions[0].files)
    assert any("Perfetto" in note and str(trace) in note for note in plan.notes), plan.notes


def test_a_name_that_would_forge_terminal_output_is_shown_escaped_among_the_skipped(tmp_path):
    """Failed before: `xdiag view` printed a skipped object's name raw, so a newline or an escape sequence in it
    wrote lines (and colours) of the attacker's choosing."""
    from xdiag.cloud.memory import LocalBlobStore
    from xdiag.viewer.sources import _skipped_notes
    from xdiag.viewer.tree import bucket_sessions

    blobs = LocalBlobStore(buckets=tmp_path / "buckets")
    forged = "gs://b/run\x1b[2J\x1b[31m/plugins/profile/s1\n  good-run: s2 programmatic http:\\evil.example/h.xplane.pb"
    blobs.put(forged, b"attacker's bytes")
    found = bucket_sessions(blobs, "gs://b")
    said = "\n".join(_skipped_notes(found.skipped, "gs://b"))
    assert not found.sessions and "skipped 1 object(s)" in said
    assert "\x1b" not in said and "\\x1b[2J" in said, said
    assert not any(line.lstrip().startswith("good-run") for line in said.splitlines()), said
