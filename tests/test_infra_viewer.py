"""The viewer's deployment (infra/viewer.tf) against XProf and the code, offline, like tests/test_infra.py: every flag
given to XProf is one the pinned server accepts, the frontend sends work to exactly its worker sidecars, it scales
to zero, only the named members may invoke it, its service account can read the bucket and add XProf's caches but
never overwrite or delete, the image pins the xprof the code pins, and share links are signed through IAM; and the
image's own modules, laid out as its Dockerfile copies them, run XProf behind xdiag's guard (a real XProf server)."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
import uuid

import pytest
from xdiag.local_ports import free_ports

from tests.test_infra import INFRA, REPO, _all_strings, _block, infra
from tests.test_viewer import _outward_address


def _service() -> dict:
    return infra().resource("google_cloud_run_v2_service", "viewer")


def _containers() -> tuple[dict, dict]:
    template = _block(_service(), "template")
    [frontend] = template["containers"]
    [dynamic] = [d["containers"] for d in template["dynamic"] if "containers" in d]
    return frontend, dynamic


def _flags(args: list[str]) -> dict[str, str]:
    return dict((a.split("=", 1) + [""])[:2] for a in args)


def _xprof_server_flags() -> set[str]:
    from xprof import server

    help_text = io.StringIO()
    with contextlib.redirect_stdout(help_text), pytest.raises(SystemExit):
        server.main(["--help"])
    return set(re.findall(r"(--[a-z_]+)", help_text.getvalue()))


def test_every_flag_the_viewer_gives_xprof_is_one_its_server_accepts():
    frontend, workers = _containers()
    accepted = _xprof_server_flags()
    for args in (frontend["args"], workers["content"][0]["args"]):
        assert set(_flags(args)) <= accepted, set(_flags(args)) - accepted
    for args in (frontend["args"], workers["content"][0]["args"]):
        flags = _flags(args)
        assert flags["--logdir"] == "${local.viewer_logdir}" and "--hide_capture_profile_button" in flags
    assert infra().locals["viewer_logdir"] == "gs://${google_storage_bucket.profiles.name}"


def test_the_frontend_sends_work_to_exactly_its_worker_sidecars():
    frontend, workers = _containers()
    flags = _flags(frontend["args"])
    # one plaintext stub per address (XProf's stub_factory), the workers' gRPC ports on the instance's loopback
    assert flags["--worker_service_address"] == \
        '${join(",", [for port in local.viewer_worker_ports : "127.0.0.1:${port}"])}'
    assert workers["for_each"] == "${local.viewer_worker_ports}"
    worker_flags = _flags(workers["content"][0]["args"])
    assert worker_flags["--grpc_port"] == "${containers.value}"
    assert _block(_block(workers["content"][0], "startup_probe"), "tcp_socket")["port"] == "${containers.value}"
    # no port is used twice on the instance: the frontend's web and gRPC ports lie outside the workers' ranges
    assert flags["--port"] == "${local.viewer_port}" and flags["--grpc_port"] == "${local.viewer_grpc_port}"
    first_worker = int(re.search(r": (\d+) \+ i\]", infra().locals["viewer_worker_ports"]).group(1))
    assert infra().locals["viewer_grpc_port"] < first_worker and infra().locals["viewer_port"] < 9000 < first_worker
    assert frontend["depends_on"] == '${[for i, _ in local.viewer_worker_ports : "xprof-worker-${i}"]}'
    assert frontend["ports"][0]["container_port"] == "${local.viewer_port}"


def test_the_viewer_scales_to_zero_and_only_named_members_may_invoke_it():
    scaling = _block(_block(_service(), "template"), "scaling")
    assert scaling["min_instance_count"] == 0 and scaling["max_instance_count"] == "${var.viewer_max_instances}"
    invokers = infra().resource("google_cloud_run_v2_service_iam_member", "viewer_members")
    assert invokers["role"] == "roles/run.invoker" and "var.viewer_members" in invokers["for_each"]
    assert infra().variables["viewer_members"]["default"] == []
    strings = [s for s in _all_strings(infra().files["viewer.tf"])]
    assert not any("allUsers" in s or "allAuthenticatedUsers" in s for s in strings)


def test_the_viewer_shows_each_session_to_the_readers_of_its_run_as_firestore_records_them():
    frontend, _ = _containers()
    env = {e["name"]: e["value"] for e in frontend["env"]}
    assert env["XDIAG_VIEWER_AUTH"] == "iam" and "var.control_plane_admins" in env["XDIAG_VIEWER_ADMINS"]
    assert "-viewer-${data.google_project.this.number}.${var.region}.run.app" in env["XDIAG_VIEWER_AUDIENCE"]
    assert env["GOOGLE_CLOUD_PROJECT"] == "${var.project}"
    reads = infra().resource("google_project_iam_member", "viewer_reads_runs")
    assert reads["role"] == "roles/datastore.viewer"
    assert reads["member"] == "serviceAccount:${google_service_account.viewer[0].email}"


def test_the_viewer_reads_the_bucket_and_adds_caches_but_cannot_overwrite_or_delete():
    roles = infra().resource("google_storage_bucket_iam_member", "viewer")
    assert roles["for_each"] == \
        '${local.viewer_enabled ? toset(["roles/storage.objectViewer", "roles/storage.objectCreator"]) : toset([])}'
    assert roles["bucket"] == "${google_storage_bucket.profiles.name}"
    assert roles["member"] == "serviceAccount:${google_service_account.viewer[0].email}"
    assert _block(_service(), "template")["service_account"] == "${google_service_account.viewer[0].email}"


def test_the_image_pins_what_the_code_pins():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = {r.split("==")[0]: r for r in [*project["dependencies"], *project["optional-dependencies"]["cloud"]]}
    dockerfile = (INFRA / "viewer" / "Dockerfile").read_text()
    installed = [w for w in re.search(r"^RUN pip install (.+)$", dockerfile, re.M).group(1).split() if "==" in w]
    assert "xprof==" + pins["xprof"].split("==")[1] in installed
    for requirement in installed:
        name = requirement.split("==")[0]
        assert name == "gcsfs" or pins.get(name) == requirement, f"{requirement}: pyproject.toml pins {pins.get(name)}"
    assert 'ENTRYPOINT ["python", "-m", "xdiag.viewer.server"]' in dockerfile
    assert _block(_service(), "template")["execution_environment"] == "EXECUTION_ENVIRONMENT_GEN2"


def test_share_links_are_signed_through_iam_as_the_control_plane_itself():
    signer = infra().resource("google_service_account_iam_member", "control_plane_signs_links")
    assert signer["role"] == "roles/iam.serviceAccountTokenCreator"
    assert signer["service_account_id"] == '${google_service_account.function["control_plane"].name}'
    assert signer["member"] == 'serviceAccount:${google_service_account.function["control_plane"].email}'
    assert infra().locals["common_env"]["XDIAG_VIEWER_URL"] == "${var.viewer_link_base}"
    assert {"viewer_service", "viewer_url"} <= set(infra().outputs)
    assert "run.googleapis.com" in infra().locals["apis"]


def _image_layout(root) -> dict[str, str]:
    """The xdiag files the Dockerfile copies, laid out under `root` as in the image (PYTHONPATH=/opt/xdiag)."""
    dockerfile = (INFRA / "viewer" / "Dockerfile").read_text()
    env = dict(re.findall(r"^ENV (\w+)=(\S+)$", dockerfile, re.M))
    for line in re.findall(r"^COPY (.+)$", dockerfile, re.M):
        *sources, target = line.split()
        assert target.startswith(env["PYTHONPATH"] + "/")
        for source in sources:
            placed = root / target.removeprefix("/") / (REPO / source).name
            placed.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(REPO / source, placed)
    return {"PYTHONPATH": str(root / env["PYTHONPATH"].removeprefix("/"))}


@contextlib.contextmanager
def _image_server(tmp_path, logdir, **env_changes):
    """XProf's server from the image's modules over `logdir`, bound to loopback (Cloud Run's binds every interface):
    yields (get(path, headers) -> (status, body), its gRPC port); stopped on exit."""
    port, grpc_port = free_ports(2)
    env = {k: v for k, v in os.environ.items() if not k.startswith("XDIAG_VIEWER_")}
    env.update(_image_layout(tmp_path / "image"), XDIAG_VIEWER_BIND="127.0.0.1", **env_changes)
    with open(tmp_path / "xprof.log", "wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "xdiag.viewer.server", f"--logdir={logdir}",
                                    f"--port={port}", f"--grpc_port={grpc_port}",
                                    f"--worker_service_address=127.0.0.1:{grpc_port}", "--hide_capture_profile_button"],
                                   stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path, start_new_session=True)

    def get(path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        try:
            request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
            with urllib.request.urlopen(request, timeout=120) as answer:
                data = answer.read()
                return answer.status, gzip.decompress(data) if answer.headers.get("Content-Encoding") == "gzip" else data
        except urllib.error.HTTPError as refused:
            return refused.code, refused.read()

    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, (tmp_path / "xprof.log").read_text()[-2000:]
            try:
                get("/data/plugin/profile/runs")
                break
            except OSError:
                assert time.monotonic() < deadline, (tmp_path / "xprof.log").read_text()[-2000:]
                time.sleep(0.3)
        yield get, grpc_port
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(30)


def _session(logdir, run_folder: str, session: str, profile) -> None:
    tree = logdir / run_folder / "plugins" / "profile" / session
    tree.mkdir(parents=True)
    (tree / "vm.xplane.pb").write_bytes(profile.read_bytes())


def test_the_image_s_modules_run_xprof_behind_the_guard_serving_only_what_it_lists_in_its_log_dir(h200_profiles, tmp_path):
    """The Cloud Run viewer's rules: no session list is given, so the guard allows what XProf lists under its log dir
    (the bucket there; a folder here), follows no path a request names, and keeps the worker on loopback."""
    _session(tmp_path / "logdir", "r", "s1", h200_profiles["healthy"])
    outside = tmp_path / "elsewhere" / "plugins" / "profile" / "x"
    outside.mkdir(parents=True)
    (outside / "secret.xplane.pb").write_bytes(h200_profiles["healthy"].read_bytes())
    with _image_server(tmp_path, tmp_path / "logdir") as (get, grpc_port):
        status, runs = get("/data/plugin/profile/runs")
        assert json.loads(runs) == ["r/s1"]
        status, data = get("/data/plugin/profile/data?run=r/s1&tag=overview_page")
        assert status == 200 and json.loads(data)
        assert get(f"/data/plugin/profile/data?run={tmp_path / 'elsewhere'}/x&tag=overview_page&host=secret")[0] == 404
        assert get(f"/data/plugin/profile/runs?session_path={outside}")[0] == 403
        with socket.socket() as far:
            far.settimeout(5)
            assert far.connect_ex((_outward_address(), grpc_port)) != 0
    assert sorted(p.name for p in outside.iterdir()) == ["secret.xplane.pb"]


@pytest.mark.slow
def test_on_cloud_run_the_viewer_shows_each_session_only_to_the_readers_of_its_run(local_stack, h200_profiles, tmp_path):
    """Failed before: every member the viewer's IAM let in listed and opened every run's sessions. Now the caller is
    the one the ID token names (as Cloud Run's front end forwards it, signature removed, or signed), and a session
    is the run's owners', readers' and the administrators' (a run nobody claimed: the administrators' only), the
    runs read from the stack's Firestore emulator as the control plane wrote them."""
    from xdiag.cloud.firestore import FirestoreStateStore
    from xdiag.cloud.runtime import firestore_client

    from tests.fake_google_certs import FakeGoogleCerts, as_cloud_run_forwards

    state = FirestoreStateStore(firestore_client(local_stack.env["GOOGLE_CLOUD_PROJECT"]))
    tag = uuid.uuid4().hex[:6]
    alices, carols, unclaimed = f"alice-{tag}", f"carol-{tag}", f"uploaded-{tag}"
    state.set("runs", alices, {"run_id": alices, "path": f"team/{alices}", "owners": ["user:alice@example.com"],
                               "readers": ["user:bob@example.com"]})
    state.set("runs", carols, {"run_id": carols, "owners": ["user:carol@example.com"]})
    logdir = tmp_path / "logdir"
    for folder in (f"team/{alices}", carols, unclaimed):
        _session(logdir, folder, "s1", h200_profiles["healthy"])
    google = FakeGoogleCerts()
    audience = "https://xdiag-viewer-123456789.us-central1.run.app"

    def as_(email: str, forwarded: bool = True) -> dict[str, str]:
        token = google.token(email, audience)
        return {"Authorization": f"Bearer {as_cloud_run_forwards(token) if forwarded else token}"}

    try:
        with _image_server(tmp_path, logdir, K_SERVICE="xdiag-viewer",  # on Cloud Run, behind its front end
                           XDIAG_VIEWER_AUTH="iam", XDIAG_VIEWER_AUDIENCE=audience,
                           XDIAG_VIEWER_ADMINS="user:admin@example.com", XDIAG_ID_TOKEN_CERTS_URL=google.url) as (get, _):
            sessions = lambda who: sorted(json.loads(get("/data/plugin/profile/runs", who)[1]))  # noqa: E731
            assert get("/data/plugin/profile/runs")[0] == 401
            assert get("/data/plugin/profile/runs", {"Authorization": f"Bearer {google.unsigned_token('admin@example.com', audience)}"})[0] == 401
            assert sessions(as_("alice@example.com")) == [f"team/{alices}/s1"]
            assert sessions(as_("alice@example.com", forwarded=False)) == [f"team/{alices}/s1"]
            assert sessions(as_("bob@example.com")) == [f"team/{alices}/s1"]
            assert sessions(as_("carol@example.com")) == [f"{carols}/s1"]
            assert sessions(as_("dave@example.com")) == []
            assert sessions(as_("admin@example.com")) == sorted([f"team/{alices}/s1", f"{carols}/s1", f"{unclaimed}/s1"])
            overview = "/data/plugin/profile/data?run={}&tag=overview_page"
            assert get(overview.format(f"{carols}/s1"), as_("alice@example.com"))[0] == 404
            assert get(overview.format(f"{unclaimed}/s1"), as_("carol@example.com"))[0] == 404
            status, data = get(overview.format(f"team/{alices}/s1"), as_("bob@example.com"))
            assert status == 200 and json.loads(data)
    finally:
        google.close()
        for run in (alices, carols):
            state.delete("runs", run)
