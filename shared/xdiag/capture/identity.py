"""Who calls the control plane, and what they may do with a run.

Behind IAM (`XDIAG_CONTROL_PLANE_AUTH=iam`) the caller is the e-mail of the Google-signed ID token in
`Authorization: Bearer …`, verified here (google-auth: signature against Google's certificates, expiry, issuer, and
an audience of `XDIAG_CONTROL_PLANE_AUDIENCE`, the control plane's URL): Cloud Run's front end lets in any
invoker, but a header it passes on is not proof of who sent it. A token that does not verify is refused (401).
With the local token the caller is the principal it stands for (`XDIAG_CONTROL_PLANE_PRINCIPAL`), who runs the
stack: an administrator.

A run is read by its owners (who created it through the control plane), its readers (`PUT /v1/runs/{run}/readers`,
set by an owner) and the administrators (`XDIAG_CONTROL_PLANE_ADMINS`); by nobody else, so a run nobody claimed
(uploaded straight to the bucket) is the administrators' until they name readers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

GOOGLE_ISSUERS = ("accounts.google.com", "https://accounts.google.com")
GOOGLE_CERTS_URL = "https://www.googleapis.com/oauth2/v1/certs"  # the keys Google signs ID tokens with
LOCAL_PRINCIPAL = "user:local-operator"


class Unauthenticated(Exception):
    """No verified identity: the message says why (401)."""


@dataclass(frozen=True)
class Identity:
    """How callers are told apart: `iam` (verified ID tokens for `audiences`) or the local token's `principal`;
    `admins` may read and share every run and name any run's readers."""

    iam: bool = False
    audiences: tuple[str, ...] = ()
    certs_url: str = GOOGLE_CERTS_URL
    principal: str = LOCAL_PRINCIPAL
    admins: frozenset[str] = frozenset()

    @classmethod
    def from_env(cls, env: Mapping[str, str], iam: bool) -> Identity:
        principal = env.get("XDIAG_CONTROL_PLANE_PRINCIPAL") or LOCAL_PRINCIPAL
        admins = set(_listed(env.get("XDIAG_CONTROL_PLANE_ADMINS")))
        return cls(iam=iam, audiences=_listed(env.get("XDIAG_CONTROL_PLANE_AUDIENCE")),
                   certs_url=env.get("XDIAG_ID_TOKEN_CERTS_URL") or GOOGLE_CERTS_URL, principal=principal,
                   admins=frozenset(admins if iam else admins | {principal}))  # the local token's holder runs it all

    def caller(self, headers: Mapping[str, str]) -> str:
        """The caller's principal (`user:EMAIL`, `serviceAccount:EMAIL`); Unauthenticated without a verified one."""
        if not self.iam:
            return self.principal
        if not self.audiences:
            raise Unauthenticated("XDIAG_CONTROL_PLANE_AUDIENCE is not set: no ID token can be checked, so none is "
                                  "accepted")
        scheme, _, token = (headers.get("Authorization") or headers.get("authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("send a Google-signed ID token for the control plane: Authorization: Bearer <token>")
        claims = verify_id_token(token.strip(), self.audiences, self.certs_url)
        email = claims["email"]
        return f"serviceAccount:{email}" if email.endswith(".gserviceaccount.com") else f"user:{email}"

    def may_read(self, run: Mapping[str, Any], caller: str) -> bool:
        return caller in self.admins or caller in (run.get("owners") or ()) or caller in (run.get("readers") or ())

    def may_name_readers(self, run: Mapping[str, Any], caller: str) -> bool:
        return caller in self.admins or caller in (run.get("owners") or ())


@dataclass(frozen=True)
class Who:
    """The verified caller of one request, and the rules of what it may do."""

    identity: Identity
    caller: str

    def may_read(self, run: Mapping[str, Any]) -> bool:
        return self.identity.may_read(run, self.caller)


def verify_id_token(token: str, audiences: Iterable[str], certs_url: str) -> dict[str, Any]:
    """The token's claims, once its signature (a key of `certs_url`), expiry, issuer and audience hold and it names a
    verified e-mail; Unauthenticated with the reason otherwise."""
    from google.auth import exceptions
    from google.auth.transport.requests import Request
    from google.oauth2 import id_token

    try:
        claims = id_token.verify_token(token, Request(), audience=list(audiences), certs_url=certs_url,
                                       clock_skew_in_seconds=10)
    except (ValueError, exceptions.GoogleAuthError) as exc:
        raise Unauthenticated(f"the ID token does not verify: {str(exc)[:200]}") from None
    if claims.get("iss") not in GOOGLE_ISSUERS:
        raise Unauthenticated(f"the ID token's issuer {str(claims.get('iss'))[:100]!r} is not Google")
    if not isinstance(claims.get("email"), str) or claims.get("email_verified") is not True:
        raise Unauthenticated("the ID token names no verified e-mail")
    return claims


def _listed(value: str | None) -> tuple[str, ...]:
    return tuple(item.strip() for item in (value or "").split(",") if item.strip())
