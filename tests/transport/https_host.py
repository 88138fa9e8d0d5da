"""An https:// server on loopback that answers GET /v1/host as a fuse agent's
probe does, behind a real certificate made with `cryptography`: self-signed,
from a CA the controller does not trust, or expired. For the tests of an
https:// host whose certificate does not verify (transport and registry)."""

from __future__ import annotations

import datetime as dt
import http.server
import ipaddress
import json
import ssl
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from fuse.transport.tls import create_ca, issue_cert

FACTS = {"cpus": 4, "ram_mb": 8192, "storage_gb": 100, "arch": "amd64", "backend": "qemu"}
KINDS = ("a self-signed certificate", "a certificate from an unknown CA", "an expired certificate")
# What OpenSSL says of each (the reason the controller quotes).
VERIFY_MESSAGE = {"a self-signed certificate": "self-signed certificate",
                  "a certificate from an unknown CA": "unable to get local issuer certificate",
                  "an expired certificate": "certificate has expired"}


@dataclass(frozen=True)
class Certificate:
    cert: Path
    key: Path
    ca: Path  # what a client would have to trust for it to verify (the certificate itself when self-signed)


def self_signed(out: Path, name: str = "127.0.0.1") -> Certificate:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(name))]), critical=False)
            .sign(key, hashes.SHA256()))
    out.mkdir(parents=True, exist_ok=True)
    (out / "self.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (out / "self.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                     serialization.NoEncryption()))
    return Certificate(out / "self.pem", out / "self.key", out / "self.pem")


def certificate(kind: str, out: Path) -> Certificate:
    """A server certificate for 127.0.0.1 of `kind` (one of KINDS)."""
    if kind == "a self-signed certificate":
        return self_signed(out)
    create_ca(out / "ca")
    files = issue_cert(out / "ca", "127.0.0.1", out / "cert", days=-1 if kind == "an expired certificate" else 30)
    return Certificate(files.cert, files.key, files.ca)


@contextmanager
def https_host(cert: Certificate) -> Iterator[str]:
    """Serve the probe's facts over https with `cert`; yields the https:// url."""
    body = json.dumps(FACTS).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert.cert), str(cert.key))

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True

        def get_request(self):
            sock, addr = super().get_request()
            # the handshake in the handler's thread, so a client that gives up mid-way holds no one else up
            return ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr

        def handle_error(self, request, client_address):
            pass  # a client refusing our certificate hangs up mid-handshake: expected here

    server = Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
