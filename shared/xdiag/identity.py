"""Who calls the control plane (and the viewer on Cloud Run), and what they may do with a run.

Behind IAM (`XDIAG_CONTROL_PLANE_AUTH=iam`) the caller is the e-mail of the Google-signed ID token the request
carries, in `X-Serverless-Authorization: Bearer …` where present (Cloud Run authenticates that header when both are
sent and passes `Authorization` on unchecked, so that one could name anybody), else in `Authorization: Bearer …`.
Cloud Run's front end checks the token against IAM and then replaces its signature with
`SIGNATURE_REMOVED_BY_GOOGLE` before the request reaches the container: where the service runs on Cloud Run (it sets
`K_SERVICE`), such a token is read on its claims (audience `XDIAG_CONTROL_PLANE_AUDIENCE`, Google's issuer, expiry, a
verified e-mail), which holds only because infra/ lets no unauthenticated caller through that front end (no
`allUsers` invoker; tests/test_infra.py checks). Anywhere else no front end checked it, and it is refused. Any other
token is verified here in full (google-auth: the signature against Google's certificates too). A token
that does not hold is refused (401). With the local token the caller is the principal it stands for
(`XDIAG_CONTROL_PLANE_PRINCIPAL`), who runs the stack: an administrator.

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
CERTS_URL_ENV = "XDIAG_ID_TOKEN_CERTS_URL"  # another signer's keys (tests: tests/fake_google_certs.py)
SIGNATURE_REMOVED = "SIGNATURE_REMOVED_BY_GOOGLE"  # what Cloud Run leaves of a token it verified
SERVERLESS_HEADERS = ("X-Serverless-Authorization", "Authorization")  # the one Cloud Run authenticated comes first
CLOUD_RUN_ENV = "K_SERVICE"  # set by Cloud Run (and Cloud Functions, which run on it) in every container it runs
LOCAL_PRINCIPAL = "user:local-operator"


class Unauthenticated(Exception):
    """No verified identity: the message says why (401)."""


@dataclass(frozen=True)
class Identity:
    """How callers are told apart: `iam` (verified ID tokens for `audiences`) or the local token's `principal`;
    `admins` may read and share every run and name any run's readers. `on_cloud_run`: requests come through Cloud
    Run's front end, which verified their tokens (a token it stripped of its signature is read on its claims)."""

    iam: bool = False
    audiences: tuple[str, ...] = ()
    certs_url: str = GOOGLE_CERTS_URL
    principal: str = LOCAL_PRINCIPAL
    admins: frozenset[str] = frozenset()
    on_cloud_run: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str], iam: bool) -> Identity:
        principal = env.get("XDIAG_CONTROL_PLANE_PRINCIPAL") or LOCAL_PRINCIPAL
        admins = set(listed_values(env.get("XDIAG_CONTROL_PLANE_ADMINS")))
        return cls(iam=iam, audiences=listed_values(env.get("XDIAG_CONTROL_PLANE_AUDIENCE")),
                   certs_url=env.get(CERTS_URL_ENV) or GOOGLE_CERTS_URL, principal=principal,
                   admins=frozenset(admins if iam else admins | {principal}),  # the local token's holder runs it all
                   on_cloud_run=bool(env.get(CLOUD_RUN_ENV)))

    def caller(self, headers: Mapping[str, str]) -> str:
        """The caller's principal (`user:EMAIL`, `serviceAccount:EMAIL`); Unauthenticated without a verified one."""
        if not self.iam:
            return self.principal
        if not self.audiences:
            raise Unauthenticated("XDIAG_CONTROL_PLANE_AUDIENCE is not set: no ID token can be checked, so none is "
                                  "accepted")
        scheme, _, token = _bearer_header(headers).partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("send a Google-signed ID token for the service: Authorization: Bearer <token>")
        claims = verify_id_token(token.strip(), self.audiences, self.certs_url, self.on_cloud_run)
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


def _bearer_header(headers: Mapping[str, str]) -> str:
    for name in SERVERLESS_HEADERS:
        value = headers.get(name) or headers.get(name.lower())
        if value:
            return value
    return ""


def verify_id_token(token: str, audiences: Iterable[str], certs_url: str, on_cloud_run: bool = False) -> dict[str, Any]:
    """The token's claims, once its signature (a key of `certs_url`; or, `on_cloud_run`, Cloud Run's front end, which
    checked it and left SIGNATURE_REMOVED in its place), expiry, issuer and audience hold and it names a verified
    e-mail; Unauthenticated with the reason otherwise."""
    from google.auth import exceptions, jwt
    from google.auth.transport.requests import Request
    from google.oauth2 import id_token

    try:
        if token.rsplit(".", 1)[-1] == SIGNATURE_REMOVED:
            if not on_cloud_run:
                raise Unauthenticated(f"the ID token has no signature ({SIGNATURE_REMOVED}): only Cloud Run's front "
                                      f"end may strip it, and this service does not run behind it ({CLOUD_RUN_ENV} "
                                      "is not set)")
            claims = _checked_claims(jwt.decode(token, verify=False), list(audiences))
        else:
            claims = id_token.verify_token(token, Request(), audience=list(audiences), certs_url=certs_url,
                                           clock_skew_in_seconds=10)
    except (ValueError, exceptions.GoogleAuthError) as exc:
        raise Unauthenticated(f"the ID token does not verify: {str(exc)[:200]}") from None
    if claims.get("iss") not in GOOGLE_ISSUERS:
        raise Unauthenticated(f"the ID token's issuer {str(claims.get('iss'))[:100]!r} is not Google")
    if not isinstance(claims.get("email"), str) or claims.get("email_verified") is not True:
        raise Unauthenticated("the ID token names no verified e-mail")
    return claims


def _checked_claims(claims: dict[str, Any], audiences: list[str], clock_skew_s: int = 10) -> dict[str, Any]:
    """What google-auth checks besides the signature: the audience, and the token's lifetime."""
    import time

    now = time.time()
    if claims.get("aud") not in audiences:
        raise ValueError(f"the token's audience {str(claims.get('aud'))[:100]!r} is not this service's")
    if not isinstance(claims.get("exp"), (int, float)) or claims["exp"] + clock_skew_s < now:
        raise ValueError("the token has expired")
    if not isinstance(claims.get("iat"), (int, float)) or claims["iat"] - clock_skew_s > now:
        raise ValueError("the token was issued in the future")
    return claims


def listed_values(value: str | None) -> tuple[str, ...]:
    return tuple(item.strip() for item in (value or "").split(",") if item.strip())
