"""A stand-in for Google's ID-token signing keys (https://www.googleapis.com/oauth2/v1/certs), for tests only.

It is NOT Google: a small HTTP server on 127.0.0.1 that serves `{key id: X.509 certificate}` for an RSA key made
here, and signs ID tokens with that key (google-auth's own `jwt.encode`, RS256), with Google's issuer and the
claims Google puts in an ID token. The control plane verifies them with google-auth exactly as it verifies Google's,
pointed at this server by XDIAG_ID_TOKEN_CERTS_URL. `foreign_token` signs with a key the server does not serve.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from google.auth import crypt, jwt

ISSUER = "https://accounts.google.com"


def _key_and_cert() -> tuple[bytes, bytes]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "xdiag test ID-token signer")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=1)).sign(key, hashes.SHA256()))
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    return pem, cert.public_bytes(serialization.Encoding.PEM)


class FakeGoogleCerts:
    def __init__(self) -> None:
        self.key_id = "xdiag-test-key"
        key, cert = _key_and_cert()
        self._signer = crypt.RSASigner.from_string(key, key_id=self.key_id)
        self._foreign = crypt.RSASigner.from_string(_key_and_cert()[0], key_id=self.key_id)
        body = json.dumps({self.key_id: cert.decode()}).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/oauth2/v1/certs"

    def claims(self, email: str, audience: str, lifetime_s: int = 600, **change) -> dict:
        now = int(time.time())
        return {"iss": ISSUER, "aud": audience, "sub": str(abs(hash(email))), "email": email,
                "email_verified": True, "iat": now, "exp": now + lifetime_s, **change}

    def token(self, email: str, audience: str, **change) -> str:
        return jwt.encode(self._signer, self.claims(email, audience, **change)).decode()

    def foreign_token(self, email: str, audience: str) -> str:
        """Signed with a key of the same id that the server does not serve."""
        return jwt.encode(self._foreign, self.claims(email, audience)).decode()

    def unsigned_token(self, email: str, audience: str) -> str:
        """`alg: none`: claims anyone can write."""
        part = lambda value: base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()  # noqa: E731
        return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(self.claims(email, audience))}."

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def as_cloud_run_forwards(token: str) -> str:
    """A token as Cloud Run's front end passes it to the container once it has checked it: header and claims as
    sent, the signature replaced by SIGNATURE_REMOVED_BY_GOOGLE (a stand-in for that front end, which cannot run
    here)."""
    return token.rsplit(".", 1)[0] + ".SIGNATURE_REMOVED_BY_GOOGLE"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
