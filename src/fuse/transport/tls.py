"""A small CA for mutual TLS between the controller and its hosts.

    fuse host ca create --out ./ca                        -> ca/ca.pem, ca/ca.key
    fuse host cert issue --ca ./ca --name rack1 --out d   -> d/rack1.pem, d/rack1.key, d/ca.pem
    fuse host cert issue --ca ./ca --name controller --client --out d

Keys are ECDSA P-256: every TLS stack speaks it, and keys and signatures stay
small. The CA may sign certificates and nothing else (BasicConstraints ca,
path length 0, KeyUsage keyCertSign/cRLSign). A host certificate is for
serving (ExtendedKeyUsage serverAuth) and names the host plus the loopback
names; a `--client` certificate is for the controller's side only
(clientAuth). OpenSSL checks the purpose, so a host's certificate cannot be
presented as the controller's, nor the other way round.

Both ends trust only this CA: a host's listener requires a client certificate
it signed (`fuse.serving.tls_server_options`), and the controller verifies the
host's certificate against the CA given in `PUT /v1/controller`
(`fuse.transport.TlsSettings`). Private keys are written 0600 and never
overwritten by accident: without `overwrite` (--force) any file already there is
refused, and then nothing is written. A host's DNS name may be longer than a
common name can be (64): its certificate then has none, the name being in the
subjectAltName, which is what TLS peers check.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ..paths import private_dir

CA_CERT, CA_KEY = "ca.pem", "ca.key"
CA_DAYS = 3650
CERT_DAYS = 825          # the longest leaf lifetime browsers ever accepted; hosts rotate by re-issuing
CLOCK_SKEW = dt.timedelta(minutes=5)
CN_MAX = 64              # X.509's bound on a common name (RFC 5280 ub-common-name)


@dataclass(frozen=True)
class CertFiles:
    cert: Path
    key: Path
    ca: Path


def _refusal(path: Path, why: str = "") -> FileExistsError:
    return FileExistsError(f"{path} exists{why}; refusing to overwrite it (pass --force to replace)")


def _write_all(files: list[tuple[Path, bytes, bool]], overwrite: bool, why: dict[Path, str] | None = None) -> None:
    """Write each (path, data, private), every path checked before any is written: a refused
    command leaves nothing behind (it wrote NAME.key, then refused NAME.pem: a new key that
    matched no certificate, review 35). ``why`` adds to a path's refusal."""
    if not overwrite:
        for path, _, _ in files:
            if os.path.lexists(path):
                raise _refusal(path, (why or {}).get(path, ""))
    for path, data, private in files:
        _write(path, data, private=private, overwrite=overwrite)


def _write(path: Path, data: bytes, private: bool, overwrite: bool) -> None:
    if os.path.lexists(path) and not overwrite:
        raise _refusal(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = 0o600 if private else 0o644
    # A new file (mkstemp: O_EXCL, 0600) renamed over the old one, never the old one rewritten:
    # whoever holds a descriptor to the old file (a key left readable, the reason to rotate
    # with --force) keeps reading the old bytes, and a symbolic link planted at `path` is
    # replaced, not followed. A key is never readable by others, not even briefly.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _validity(days: int) -> tuple[dt.datetime, dt.datetime]:
    """(not before, not after). A negative `days` makes a certificate that
    has already expired, which is what the refusal tests need."""
    now = dt.datetime.now(dt.timezone.utc)
    # A certificate's dates end at the year 9999 (as Python's do): past it, an OverflowError
    # traceback (review 33: `--days 3000000`). Refused as a ValueError naming the option and
    # the largest value it takes today, before anything is made or written.
    largest = (dt.datetime.max.replace(tzinfo=dt.timezone.utc) - now).days
    if days > largest:
        raise ValueError(f"--days {days} ends after the year 9999: the largest it takes today is {largest}")
    after = now + dt.timedelta(days=days)
    before = min(now - CLOCK_SKEW, after - dt.timedelta(days=1))
    return before, after


def _fits_common_name(name: str) -> bool:
    # (X.509 bounds a common name at 64, RFC 5280's ub-common-name; cryptography counts the
    # UTF-8 bytes, and refused a longer one with its own words, naming neither --name nor the bound)
    return 1 <= len(name.encode()) <= CN_MAX


def _subject(name: str) -> x509.Name:
    """A certificate's subject: its name as the common name and O=fuse. A name too long for a
    common name (a DNS name may be 253 characters) is left out of it, not cut short: a truncated
    CN reads as another host's name, and the full name is in the subjectAltName, the only name
    a TLS peer checks when one is there (RFC 6125; OpenSSL and Python's ssl alike)."""
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, name)] if _fits_common_name(name) else []
    return x509.Name(attrs + [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fuse")])


def create_ca(out: Path, *, name: str = "fuse CA", days: int = CA_DAYS, overwrite: bool = False) -> CertFiles:
    """Make a CA in `out` (ca.pem, ca.key)."""
    out = Path(out)
    # The CA's name is the only name its certificate has (and the issuer of all it signs):
    # it cannot be left out as a long host name is.
    if not name.strip():
        raise ValueError("--name is empty (or only spaces): the CA needs a name (its certificate's common name; the default is "
                         "'fuse CA')")
    if not _fits_common_name(name):
        raise ValueError(f"--name is {len(name.encode())} bytes long: the CA's name is its certificate's common "
                         f"name, which X.509 bounds at {CN_MAX} (bytes of UTF-8): give a shorter one")
    key = ec.generate_private_key(ec.SECP256R1())
    subject = _subject(name)
    before, after = _validity(days)
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (x509.CertificateBuilder()
            .subject_name(subject).issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(before).not_valid_after(after)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False, key_agreement=False,
                                         key_cert_sign=True, crl_sign=True, encipher_only=False,
                                         decipher_only=False), critical=True)
            .add_extension(ski, critical=False)
            .sign(key, hashes.SHA256()))
    files = CertFiles(cert=out / CA_CERT, key=out / CA_KEY, ca=out / CA_CERT)
    private_dir(out)  # the CA's own directory: owner-only (its parents made too, whatever the umask)
    _write_all([(files.key, _key_pem(key), True), (files.cert, cert.public_bytes(serialization.Encoding.PEM), False)],
               overwrite)
    return files


def load_ca(ca_dir: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """The CA's certificate and key, or ValueError (a `--ca` that does not load: invalid_argument)
    naming the file: missing, not PEM, not a CA's certificate, or a key that is not its key (what
    it signed would verify against nothing: every peer refused it, far from the cause)."""
    ca_dir = Path(ca_dir)
    cert_path, key_path = ca_dir / CA_CERT, ca_dir / CA_KEY
    for p in (cert_path, key_path):
        if not p.is_file():
            what = "is not a file" if p.exists() else "does not exist"
            raise ValueError(f"no {p.name} in {ca_dir} ({p} {what}): make the CA with "
                             f"`fuse host ca create --out {ca_dir}`")
    # (cryptography's own words named neither file: "Unable to load PEM file ... MalformedFraming")
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except ValueError:
        raise ValueError(f"{cert_path} holds no PEM certificate: give the directory `fuse host ca create` "
                         "made") from None
    try:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (ValueError, TypeError):  # (TypeError: an encrypted key, which is never prompted for)
        raise ValueError(f"{key_path} holds no unencrypted PEM private key: give the directory "
                         "`fuse host ca create` made") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{key_path} is not an ECDSA key")
    der = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if key.public_key().public_bytes(*der) != cert.public_key().public_bytes(*der):
        raise ValueError(f"{key_path} is not the key of {cert_path} (a certificate it signed would verify "
                         "against nothing): give the directory `fuse host ca create` made, both files from it")
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        raise ValueError(f"{cert_path} is not a CA's certificate ({cert.subject.rfc4514_string()}): give the "
                         "directory `fuse host ca create` made")
    return cert, key


def _alt_names(name: str) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    try:
        names.append(x509.IPAddress(ipaddress.ip_address(name)))
    except ValueError:
        names.append(x509.DNSName(name))
    # the loopback names, for an agent on the controller's own machine; ::1 too, for one listening
    # only on IPv6 loopback (registered as [::1]:PORT or https://[::1]:PORT, it failed "IP address
    # mismatch" without it)
    for extra in (x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.IPAddress(ipaddress.ip_address("::1")),
                  x509.DNSName("localhost")):
        if extra not in names:
            names.append(extra)
    return names


def clashes_with_ca(name: str) -> str | None:
    """Why ``name``'s files (NAME.pem, NAME.key) would be the CA's own (ca.pem, ca.key),
    or None: issued under that name, the certificate went over the copy of the CA beside
    it, or, issued into the CA's directory, over the CA itself."""
    # (case-folded: on a file system that ignores case, as macOS's does, CA.pem is ca.pem)
    if {f"{name}.pem".lower(), f"{name}.key".lower()} & {CA_CERT.lower(), CA_KEY.lower()}:
        return (f"--name {name!r}: its files would be the CA's own ({CA_CERT}, {CA_KEY}); "
                "name the host by its address or DNS name")
    return None


def issue_cert(ca_dir: Path, name: str, out: Path, *, client: bool = False, days: int = CERT_DAYS,
               overwrite: bool = False) -> CertFiles:
    """Issue `name`'s certificate from the CA in `ca_dir` into `out`
    (NAME.pem, NAME.key, and a copy of ca.pem so the directory is all a host
    or the controller needs). `client` makes a clientAuth certificate (the
    controller's); otherwise it is a host's serverAuth certificate."""
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"--name must be a plain name, not {name!r}")
    if why := clashes_with_ca(name):
        raise ValueError(why)
    ca_cert, ca_key = load_ca(ca_dir)
    out = Path(out)
    before, after = _validity(days)
    if ca_cert.not_valid_after_utc <= dt.datetime.now(dt.timezone.utc):  # (what it signs would fail as expired)
        raise ValueError(f"the CA in {ca_dir} has expired (it was valid until "
                         f"{ca_cert.not_valid_after_utc:%Y-%m-%d %H:%M:%S} UTC): make a new one with "
                         "`fuse host ca create` and issue the certificates again from it")
    after = min(after, ca_cert.not_valid_after_utc)  # (valid no longer than what it is checked against)
    key = ec.generate_private_key(ec.SECP256R1())
    eku = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
    builder = (x509.CertificateBuilder()
               .subject_name(_subject(name))
               .issuer_name(ca_cert.subject)
               .public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(before).not_valid_after(after)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                            key_encipherment=False, data_encipherment=False, key_agreement=False,
                                            key_cert_sign=False, crl_sign=False, encipher_only=False,
                                            decipher_only=False), critical=True)
               .add_extension(x509.ExtendedKeyUsage([eku]), critical=False)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                              critical=False))
    if not client:
        builder = builder.add_extension(x509.SubjectAlternativeName(_alt_names(name)), critical=False)
    else:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    files = CertFiles(cert=out / f"{name}.pem", key=out / f"{name}.key", ca=out / CA_CERT)
    private_dir(out)  # (it holds a private key: owner-only whatever the umask, as the CA's)
    writes = [(files.key, _key_pem(key), True), (files.cert, cert.public_bytes(serialization.Encoding.PEM), False)]
    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
    # The copy of the CA is written unless it is there already (a second host's certificate
    # issued into the same directory), or `out` is the CA's own directory. Any other file or
    # link at ca.pem is refused without --force as the others are: it was replaced, and the
    # certificates already beside it no longer verified against it, nor the host it served
    # trusted the controller its own CA signed (review 35).
    if Path(ca_dir).resolve() != out.resolve() and not _holds(files.ca, ca_pem):
        writes.append((files.ca, ca_pem, False))
    _write_all(writes, overwrite, why={files.ca: f" and is not a copy of {Path(ca_dir) / CA_CERT}"})
    return files


def _holds(path: Path, data: bytes) -> bool:
    """Whether ``path`` is a regular file (or a link to one) holding exactly ``data``; a FIFO
    or a device is never opened (reading one blocks)."""
    try:
        st = os.stat(path)
        return stat.S_ISREG(st.st_mode) and st.st_size == len(data) and path.read_bytes() == data
    except OSError:
        return False


def describe(cert_path: Path) -> dict:
    """Subject, issuer, validity and purpose of a certificate, for the CLI."""
    cert = x509.load_pem_x509_certificate(Path(cert_path).read_bytes())
    try:
        eku = [o._name for o in cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value]
    except x509.ExtensionNotFound:
        eku = []
    try:
        sans = [str(n.value) for n in cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value]
    except x509.ExtensionNotFound:
        sans = []
    return {"subject": cert.subject.rfc4514_string(), "issuer": cert.issuer.rfc4514_string(),
            "not_before": cert.not_valid_before_utc.isoformat(), "not_after": cert.not_valid_after_utc.isoformat(),
            "purpose": eku, "names": sans, "serial": format(cert.serial_number, "x")}
