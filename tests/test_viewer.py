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
