"""Where profiles and analyses live in a bucket: XProf's layout, so XProf/TensorBoard can open the same bucket.

    <root>/<run>/plugins/profile/<session>/<host>.xplane.pb     the profile, one file per host
    <root>/<run>/plugins/profile/<session>/<rank>.pt.trace.json.gz   or a PyTorch (Kineto) trace, one per rank
    <root>/<run>/plugins/profile/<session>/xdiag/               the analysis: tools/, analysis.json, summary.html

`<root>` is `gs://BUCKET` (or a local folder); `<run>` may itself hold slashes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from xdiag.ids import check_name, check_run_id
from xdiag.pipeline.ports import BlobInfo, BlobStore
from xdiag.pipeline.run_index import state_key  # noqa: F401 (the pipeline's modules import it from here)
from xdiag.profile.compact import FILE_SUFFIX as PREPARED_SUFFIX
from xdiag.profile.locate import SUFFIX
from xdiag.tools.host_summary import SUFFIX as SUMMARY_SUFFIX

TRACE_OBJECT_SUFFIXES = (".pt.trace.json.gz", ".pt.trace.json")
"""PyTorch profiler traces (torch.profiler's tensorboard_trace_handler names them so), registered and analysed like
xplanes. Only these: XProf's own `<host>.trace.json.gz` beside an xplane is a view of that xplane, not a host."""
PROFILE_SUFFIXES = (SUFFIX, *TRACE_OBJECT_SUFFIXES)
PROFILE_DIR = "plugins/profile"
OUTPUT_DIR = "xdiag"
ANALYSES_DIR = "analyses"  # <session>/xdiag/analyses/<analysis_id>/: one analysis' own files
PREPARED_DIR = "prepared"  # <session>/xdiag/prepared/<inputs key>.s02.xdiag: a decoded session, keyed by its exact inputs
PREPARED_HOSTS_DIR = "prepared/hosts"  # <session>/xdiag/prepared/hosts/<file version key>.s02.xdiag: one decoded host file


@dataclass(frozen=True)
class ProfileObject:
    """One host's file of one session, as named in the bucket."""

    root: str
    run: str
    session: str
    host: str

    @property
    def session_prefix(self) -> str:
        return session_prefix(self.root, self.run, self.session)


def parse_profile_uri(uri: str) -> ProfileObject | None:
    """`<root>/<run>/plugins/profile/<session>/<host>.xplane.pb` (or `<host>.pt.trace.json[.gz]`) -> its parts; None
    for any other object."""
    head, sep, tail = uri.rpartition(f"/{PROFILE_DIR}/")
    if not sep or "/" not in head.rstrip("/"):
        return None
    session, slash, file_name = tail.partition("/")
    suffix = next((s for s in PROFILE_SUFFIXES if file_name.endswith(s)), None)
    if not slash or "/" in file_name or suffix is None or file_name == suffix or not session:
        return None
    if uri.startswith("gs://"):
        bucket_and_run = head.removeprefix("gs://")
        bucket, _, run = bucket_and_run.partition("/")
        root = f"gs://{bucket}"
    else:
        root, _, run = head.rpartition("/")
    if not run or not root:
        return None
    return ProfileObject(root=root, run=run, session=session, host=file_name.removesuffix(suffix))


def check_profile_object(named: ProfileObject) -> ProfileObject:
    """The object's run, session and host are xdiag ids (InvalidRequest with the reason otherwise): a bucket's
    object names are anyone's, and these become folders and file names (no `..`, none too long for a file)."""
    check_run_id(named.run)
    check_name(named.session, "session id")
    check_name(named.host, "host file name")
    return named


def session_prefix(root: str, run: str, session: str) -> str:
    return f"{root.rstrip('/')}/{run.strip('/')}/{PROFILE_DIR}/{session}/"


def output_uri(root: str, run: str, session: str) -> str:
    return session_prefix(root, run, session) + OUTPUT_DIR


def analysis_folder(output: str, analysis_id: str) -> str:
    """Where one analysis of a session keeps its own files: tools/, follow-ups, its report."""
    return f"{output.rstrip('/')}/{ANALYSES_DIR}/{analysis_id}"


def inputs_key(files: list[BlobInfo]) -> str:
    """One key per exact set of file versions (URI, generation, size): what derived artefacts are keyed by, never
    the URIs alone (a replaced file, or one more host, is other inputs)."""
    digest = hashlib.sha256()
    for info in sorted(files, key=lambda i: i.uri):
        digest.update(f"{info.uri}:{info.generation}:{info.size}\n".encode())
    return digest.hexdigest()[:24]


def recorded_input(recorded: dict) -> BlobInfo:
    """One of an analysis' recorded inputs (`Analysis.inputs`: uri, generation, size) as the file version it names."""
    return BlobInfo(uri=recorded["uri"], size=int(recorded["size"]), generation=str(recorded["generation"]))


def host_file_key(info: BlobInfo) -> str:
    """One key per version of one host file: its map's document and prepared file are named by it, so a session whose
    other files change (a late host, a replaced file) maps only what changed."""
    return inputs_key([info])


def prepared_host_uri(output: str, info: BlobInfo) -> str:
    """Where the map stage stores one host file's decoded columns, beside the session's analyses."""
    return f"{output.rstrip('/')}/{PREPARED_HOSTS_DIR}/{host_file_key(info)}{PREPARED_SUFFIX}"


def host_summary_uri(output: str, info: BlobInfo) -> str:
    """Where the map stage stores one host file's summary (xdiag.tools.host_summary), beside its columns."""
    return prepared_host_uri(output, info) + SUMMARY_SUFFIX


def session_files(blobs: BlobStore, root: str, run: str, session: str) -> list[BlobInfo]:
    """The session's host files (directly under its folder), sorted by URI: its xplanes, or where it has none its
    PyTorch traces (one format per session, as `xdiag analyze` locates a folder's files)."""
    prefix = session_prefix(root, run, session)
    files = sorted(
        (
            info
            for info in blobs.list(prefix)
            if parse_profile_uri(info.uri) is not None and "/" not in info.uri[len(prefix) :]
        ),
        key=lambda info: info.uri,
    )
    return [i for i in files if i.uri.endswith(SUFFIX)] or files


def analysis_id_for(run: str, session: str, files: list[BlobInfo], investigator: str) -> str:
    """Stable for one set of file versions: a redelivered upload or capture names the same analysis."""
    digest = hashlib.sha256(f"{run}\n{session}\n{investigator}".encode())
    for info in sorted(files, key=lambda i: i.uri):
        digest.update(f"\n{info.uri}:{info.generation}:{info.size}".encode())
    return digest.hexdigest()[:20]
