"""The folder XProf's server reads: every run's sessions in XProf's own layout, built from where xdiag keeps them.

    <view>/<run path>/plugins/profile/<session>/<host>.xplane.pb

- the embedded default's local store (`xdiag analyze` writes `analysis.json` under `./xdiag-out`): each analysed
  session's files, linked (symlinks) where they are;
- a bucket on the Cloud Storage emulator: XProf 2.24.2 cannot read it directly (it lists the bucket through gcsfs,
  which honours STORAGE_EMULATOR_HOST, but opens sessions through google-cloud-storage with Application Default
  Credentials, which an emulator setup has none of: `run_tools` fails), so each file is downloaded once per object
  generation into a local cache and linked from there. Read-only: nothing is written to the bucket.

XProf writes its caches (`*.hlo_proto.pb`, `.cached_tools.json`, …) into each session folder; the folders here are
xdiag's own, so the user's profile folders and the bucket stay untouched. Run and session names are the bucket's
(`<run path>/<session>`, the name XProf shows and `viewer_links` uses); captured sessions carry their kind in their
id (`<time>_<kind>_<hex>`), the others are `programmatic`. Those names are anyone's who can write an object or an
`analysis.json`, and here they become folders that are removed and relinked: a session whose run, session or host
name is not an xdiag id (xdiag.ids: no `..`, no segment too long for a file name) is skipped, and said so.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from xdiag.errors import InvalidRequest
from xdiag.ids import check_name, check_run_id
from xdiag.pipeline.layout import PROFILE_DIR, check_profile_object, parse_profile_uri
from xdiag.profile.locate import SUFFIX

KINDS = ("on_demand", "snapshot", "auto")  # the captured kinds, as capture names its sessions
PROGRAMMATIC = "programmatic"


@dataclass
class ViewSession:
    """One session as the viewer shows it: `<run>/<session>`, its kind, and its host files (local paths or URIs)."""

    run: str
    session: str
    kind: str
    files: list[str] = field(default_factory=list)
    source: str = ""  # where it came from: the local store, or gs://BUCKET
    baseline: dict | None = None  # the session its analysis was compared with (Analysis.baseline), where recorded

    @property
    def name(self) -> str:
        return f"{self.run}/{self.session}"


def kind_from_id(session_id: str, known: str | None = None) -> str:
    """The kind the control plane recorded, else the one capture put in the id, else programmatic."""
    if known:
        return known
    return next((kind for kind in KINDS if f"_{kind}_" in session_id), PROGRAMMATIC)


@dataclass
class Found:
    """The sessions a source holds, and what it holds that cannot be shown safely (each with the reason)."""

    sessions: list[ViewSession] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def local_store_sessions(store: Path) -> Found:
    """Sessions analysed by the embedded default under `store` (each `analysis.json` names its profile files);
    the newest analysis of a run/session wins."""
    found: dict[str, tuple[float, ViewSession]] = {}
    skipped = []
    if not store.is_dir():
        return Found()
    for path in store.rglob("analysis.json"):
        try:
            analysis = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        files = [f for f in analysis.get("profile_uris") or [] if "://" not in f and Path(f).is_file()]
        run, session = analysis.get("run_id") or "local", analysis.get("session_id")
        if not files or not session:
            continue
        try:
            check_run_id(run.strip("/") if isinstance(run, str) else run)
            check_name(session, "session id")
            for file in files:
                check_name(Path(file).name.removesuffix(SUFFIX), "host file name")
        except InvalidRequest as exc:
            skipped.append(f"{shown_name(str(path))}: {shown_name(str(exc), 400)}")
            continue
        entry = ViewSession(run=run.strip("/"), session=session, kind=kind_from_id(session), files=files,
                            source=str(store), baseline=_baseline(analysis.get("baseline")))
        mtime = path.stat().st_mtime
        if entry.name not in found or found[entry.name][0] < mtime:
            found[entry.name] = (mtime, entry)
    return Found([entry for _, entry in sorted(found.values(), key=lambda item: item[1].name)], skipped)


def _baseline(baseline) -> dict | None:
    """An analysis' recorded baseline, where it names a session by a valid id (the names become viewer links)."""
    if not isinstance(baseline, dict):
        return None
    try:
        check_name(baseline.get("session_id"), "session id")
    except InvalidRequest:
        return None
    return {k: str(baseline.get(k) or "") for k in ("run_id", "session_id", "role", "since", "diff_uri")}


def bucket_sessions(blobs, root: str, kind_of: Callable[[str, str], str | None] | None = None,
                    runs: Iterable[str] = (), baseline_of: Callable[[str, str], dict | None] | None = None) -> Found:
    """Every session in the bucket (`gs://BUCKET/<run>/plugins/profile/<session>/<host>.xplane.pb`); `kind_of(run,
    session)` gives the kind the state store recorded, `baseline_of(run, session)` the baseline its analysis was
    compared with; `runs` limits the listing to those run folders. Objects in the profile layout whose names are
    not xdiag ids are skipped (register ignores them the same way)."""
    prefixes = [f"{root.rstrip('/')}/{run.strip('/')}/" for run in runs] or [f"{root.rstrip('/')}/"]
    sessions: dict[str, ViewSession] = {}
    skipped = []
    for prefix in prefixes:
        for info in blobs.list(prefix):
            parsed = parse_profile_uri(info.uri)
            if parsed is None:
                continue
            try:
                check_profile_object(parsed)
            except InvalidRequest as exc:
                skipped.append(f"{shown_name(info.uri)}: {shown_name(str(exc), 400)}")
                continue
            key = f"{parsed.run}/{parsed.session}"
            if key not in sessions:
                known = kind_of(parsed.run, parsed.session) if kind_of else None
                sessions[key] = ViewSession(run=parsed.run, session=parsed.session,
                                            kind=kind_from_id(parsed.session, known), source=root,
                                            baseline=_baseline(baseline_of(parsed.run, parsed.session))
                                            if baseline_of else None)
            sessions[key].files.append(info.uri)
    return Found(sorted(sessions.values(), key=lambda s: s.name), skipped)


TRACE_VIEWERS = ("the Perfetto UI (https://ui.perfetto.dev: 'Open trace file') or chrome://tracing ('Load'), which "
                 "read Chrome/Kineto trace JSON, gzipped or not")
"""Where a PyTorch (Kineto) trace is opened: XProf's viewer reads *.xplane.pb only."""


def split_traces(sessions: list[ViewSession]) -> tuple[list[ViewSession], list[ViewSession]]:
    """(sessions XProf can open: with an xplane, sessions holding only traces): a trace is for another viewer."""
    xplanes = [s for s in sessions if any(f.endswith(SUFFIX) for f in s.files)]
    return xplanes, [s for s in sessions if s not in xplanes]


def trace_note(session: ViewSession) -> str:
    """Where a session of traces alone can be opened, naming its files (local paths, or the bucket's URIs)."""
    files = ", ".join(session.files[:4]) + (f" (and {len(session.files) - 4} more)" if len(session.files) > 4 else "")
    fetch = " (fetch it first: gcloud storage cp URI .)" if any("://" in f for f in session.files) else ""
    return (f"{session.name}: a PyTorch/Chrome trace, which XProf's viewer cannot open (it reads *{SUFFIX} only); "
            f"open {files}{fetch} in {TRACE_VIEWERS}; xdiag's analysis of it is in its report (`xdiag report`)")


def shown_name(name: str, limit: int = 160) -> str:
    """A name from a bucket or a folder as a terminal line may show it: what is not printable (a newline, an escape
    sequence) written as its escape, so a name cannot forge output; cut at `limit`."""
    text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in name)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def build_view_tree(view_root: Path, sessions: Iterable[ViewSession], local_copy: Callable[[str], Path]) -> list[ViewSession]:
    """Links every session's files into `view_root` in XProf's layout; `local_copy(file)` gives a local path for
    a file (itself for a local file, the cached download for an object). A session whose files changed since the
    last build loses XProf's caches with its old links. Returns the sessions linked."""
    linked = []
    for session in sessions:
        folder = view_root / session.run / PROFILE_DIR / session.session
        wanted = {}
        for file in session.files:
            name = file.rsplit("/", 1)[-1]
            if not name.endswith(SUFFIX):
                continue
            wanted[name] = Path(local_copy(file)).resolve()
        if not wanted:
            continue
        current = {p.name: p.resolve() for p in folder.glob(f"*{SUFFIX}")} if folder.is_dir() else {}
        if current != wanted:
            shutil.rmtree(folder, ignore_errors=True)  # XProf's caches of other files go with the old links
            folder.mkdir(parents=True)
            for name, target in wanted.items():
                (folder / name).symlink_to(target)
        linked.append(session)
    return linked
