"""Share links: a V4 signed URL for a session's report object, with an expiry, recorded with who asked and when.

In the cloud the link is Cloud Storage's own V4 signed URL, signed through IAM (`signBlob`) as the control plane's
service account, and Cloud Storage refuses it after its expiry. The Cloud Storage emulator (fake-gcs-server 1.x)
does not: it serves a V4 signed URL's object whether the URL expired or its signature was tampered with (and
path-style URLs only with `-public-host` set to its own address). So on the local stack the link points at the
control plane's own link endpoint (`GET /v1/links/<bucket>/<object>?X-Goog-…`), which checks what Cloud Storage
would — the V4 signature (RSA-SHA256 over the canonical request, with the stack's signing key) and
`X-Goog-Date` + `X-Goog-Expires` — before it serves the object. Every link issued is `links/{id}` in the state
store: run, session, object, who asked, when, until when.

Who may share: a caller who may read the run (xdiag.identity: its owners, its readers, the administrators).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

LINKS = "links"
MAX_EXPIRY_S = 7 * 24 * 3600  # the longest a V4 signed URL may live
MIN_EXPIRY_S = 1
LINK_PATH = "/v1/links"
_DURATION = re.compile(r"\s*(\d+)\s*([smhd]?)\s*")


class ShareRefused(Exception):
    """The caller may not share this (403), or there is nothing to share (404); the message says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def parse_expiry(text: str) -> int:
    """`7d`, `12h`, `30m`, `90s` (a bare number is seconds) → seconds, within 1 second and 7 days."""
    match = _DURATION.fullmatch(text or "")
    if not match:
        raise ValueError(f"{text!r} is not an expiry like 7d, 12h or 30m")
    seconds = int(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]
    if not MIN_EXPIRY_S <= seconds <= MAX_EXPIRY_S:
        raise ValueError(f"expiry {text!r} is outside 1 second to 7 days (the longest a V4 signed URL lives)")
    return seconds


@dataclass
class KeySigner:
    """Signs with a service-account key (the local stack's own, made by `xdiag up`); `base_url` is where the link
    endpoint answers (the control plane)."""

    key_file: Path
    base_url: str

    def _credentials(self):
        from google.oauth2 import service_account

        return service_account.Credentials.from_service_account_file(str(self.key_file))

    def sign(self, bucket: str, name: str, expires_s: int) -> str:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        # Signed as Cloud Storage would see it (/<bucket>/<object> on the endpoint's host); the link endpoint strips
        # its own path prefix before it checks, so the check is the one Cloud Storage makes.
        client = storage.Client(project="xdiag-links", credentials=AnonymousCredentials())  # no request is made
        blob = client.bucket(bucket).blob(name)
        return blob.generate_signed_url(version="v4", expiration=dt.timedelta(seconds=expires_s), method="GET",
                                        credentials=self._credentials(),
                                        api_access_endpoint=self.base_url.rstrip("/") + LINK_PATH)

    def public_key(self):
        from cryptography.hazmat.primitives import serialization

        info = json.loads(self.key_file.read_text())
        return serialization.load_pem_private_key(info["private_key"].encode(), password=None).public_key()


@dataclass
class IamSigner:
    """Signs through IAM as the service account the control plane runs as (no key anywhere)."""

    def sign(self, bucket: str, name: str, expires_s: int) -> str:
        import google.auth
        from google.auth.transport.requests import Request
        from google.cloud import storage

        credentials, project = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
        credentials.refresh(Request())
        blob = storage.Client(project=project, credentials=credentials).bucket(bucket).blob(name)
        return blob.generate_signed_url(version="v4", expiration=dt.timedelta(seconds=expires_s), method="GET",
                                        service_account_email=credentials.service_account_email,
                                        access_token=credentials.token)


def make_link(state, signer, run_id: str, session_id: str, report_uri: str, caller: str, expires_s: int) -> dict[str, Any]:
    """Signs the report object's URL and records the link; returns the record (with the URL)."""
    bucket, _, name = report_uri.removeprefix("gs://").partition("/")
    if not report_uri.startswith("gs://") or not name:
        raise ShareRefused(404, f"the report {report_uri!r} is not an object in a bucket")
    url = signer.sign(bucket, name, expires_s)
    signed_at = parse_qs(urlsplit(url).query)["X-Goog-Date"][0]
    now = dt.datetime.strptime(signed_at, "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.timezone.utc)
    link_id = secrets.token_hex(8)
    record = {
        "link_id": link_id, "run_id": run_id, "session_id": session_id, "object": report_uri, "by": caller,
        "at": now.isoformat(), "expires_at": (now + dt.timedelta(seconds=expires_s)).isoformat(),
        "expires_s": expires_s, "url_sha256": hashlib.sha256(url.encode()).hexdigest(),  # not the URL: it is a key
    }
    state.set(LINKS, link_id, record)
    return {**record, "url": url}


# --- the local link endpoint: what Cloud Storage checks, done by xdiag ---------------------------------------


def _canonical_query(query: Mapping[str, str]) -> str:
    return "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(query.items())
                    if k != "X-Goog-Signature")


def check_signed_link(path: str, query: Mapping[str, str], host: str, public_key, now: dt.datetime) -> tuple[str, str]:
    """(bucket, object) of a valid, unexpired V4 link to the link endpoint; ShareRefused otherwise."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding

    resource = path[len(LINK_PATH):]
    bucket, _, name = resource.lstrip("/").partition("/")
    needed = ("X-Goog-Algorithm", "X-Goog-Credential", "X-Goog-Date", "X-Goog-Expires", "X-Goog-SignedHeaders",
              "X-Goog-Signature")
    if not bucket or not name or any(k not in query for k in needed) or query["X-Goog-Algorithm"] != "GOOG4-RSA-SHA256":
        raise ShareRefused(403, "not a V4 signed link")
    try:
        signed_at = dt.datetime.strptime(query["X-Goog-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.timezone.utc)
        lifetime = int(query["X-Goog-Expires"])
        signature = bytes.fromhex(query["X-Goog-Signature"])
    except ValueError:
        raise ShareRefused(403, "the link's date, expiry or signature is malformed") from None
    if now >= signed_at + dt.timedelta(seconds=lifetime):
        raise ShareRefused(410, f"the link expired at {(signed_at + dt.timedelta(seconds=lifetime)).isoformat()}")
    if query["X-Goog-SignedHeaders"] != "host":
        raise ShareRefused(403, "the link signs headers other than host")
    scope = query["X-Goog-Credential"].partition("/")[2]
    canonical = "\n".join(["GET", quote(resource, safe="/~"), _canonical_query(query), f"host:{host}", "", "host",
                           "UNSIGNED-PAYLOAD"])
    to_sign = "\n".join(["GOOG4-RSA-SHA256", query["X-Goog-Date"], scope, hashlib.sha256(canonical.encode()).hexdigest()])
    try:
        public_key.verify(signature, to_sign.encode(), padding.PKCS1v15(), hashes.SHA256())
    except InvalidSignature:
        raise ShareRefused(403, "the link's signature does not match") from None
    return bucket, name


def new_signing_key(path: Path, project: str) -> Path:
    """A service-account-shaped key for the local stack's links (0600); never a real account's."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    info = {"type": "service_account", "project_id": project, "private_key_id": secrets.token_hex(8),
            "private_key": pem, "client_email": f"xdiag-links@{project}.iam.gserviceaccount.com",
            "client_id": "0", "token_uri": "https://oauth2.googleapis.com/token"}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.write_text(json.dumps(info))
    return path
