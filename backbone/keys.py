"""Local key material: ``scripts/keys`` (``python -m backbone.keys``).

    python -m backbone.keys generate [--dir .run/keys] [--tls]   # missing keys only; idempotent
    python -m backbone.keys rotate --owner issuer         # or service:table, ...
    python -m backbone.keys prune                         # forget the public keys of rotated-out keys

Writes one Ed25519 private key per owner (``issuer.pem`` for the wallet's player/admin/
auditor tokens, ``<service>.pem`` for each service's own calls; mode 0600), the public
keys every service trusts (``jwks.json``: current keys plus the rotated-out ones that
may still have live tokens, ``retired.json``) and ``env``, a shell file that points the
services at them (NIUNIU_JWKS_FILE, NIUNIU_ISSUER_KEY_FILE, NIUNIU_<SERVICE>_KEY_FILE).

Rotation: ``rotate`` makes a new key for the owner and keeps the old public key trusted;
restart the services (they read keys at start), then ``prune`` once the longest-lived
token signed by the old key has expired (12 h for log-ins, 15 min for service tokens).
In production the same files come from the operator's secret store.

``--tls`` also makes a local CA (``ca.pem``; its key ``ca-key.pem``) and, signed by it,
one certificate per service (``<service>.crt``/``<service>-tls.key``; names ``localhost``,
``<service>`` and 127.0.0.1) plus ``operator.crt`` for tools such as the health check (and
the gateway's calls), ``gateway.crt`` for the gateway's HTTPS and ``infra.crt`` for the local
Kafka, PostgreSQL and Redis TLS listeners (``NIUNIU_TLS=1 scripts/infra up``), and adds the
gRPC TLS variables to ``env`` (backbone/tls.py). A certificate missing from a directory that
has its CA already is signed by that CA.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import json
import os
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from backbone.auth import (
    ISSUER,
    ISSUER_KEY_ENV,
    JWKS_FILE_ENV,
    SERVICES,
    SIGNERS,
    SigningKey,
    TrustedKey,
    jwks,
    service_owner,
)

OWNERS = (ISSUER, *(service_owner(s) for s in SIGNERS))


def _file_of(owner: str) -> str:
    return "issuer.pem" if owner == ISSUER else f"{owner.removeprefix('service:')}.pem"


def _env_var(owner: str) -> str:
    return ISSUER_KEY_ENV if owner == ISSUER else f"NIUNIU_{owner.removeprefix('service:').upper()}_KEY_FILE"


def _write_private(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.replace(tmp, path)


def _load(directory: Path, owner: str) -> SigningKey | None:
    path = directory / _file_of(owner)
    return SigningKey.from_pem(owner, path.read_bytes()) if path.exists() else None


def _retired(directory: Path) -> list[TrustedKey]:
    path = directory / "retired.json"
    if not path.exists():
        return []
    return [TrustedKey.from_jwk(k) for k in json.loads(path.read_text()).get("keys", [])]


def _publish(directory: Path) -> None:
    current = [k.trusted for k in (_load(directory, o) for o in OWNERS) if k is not None]
    (directory / "jwks.json").write_text(json.dumps(jwks([*current, *_retired(directory)]), indent=2) + "\n")
    root = directory.resolve()
    lines = [f"export {JWKS_FILE_ENV}={root / 'jwks.json'}"]
    lines += [f"export {_env_var(o)}={root / _file_of(o)}" for o in OWNERS]
    if (directory / "ca.pem").exists():
        lines.append(f"export NIUNIU_TLS_CA_FILE={root / 'ca.pem'}")
        for name in SERVICES:
            lines.append(f"export NIUNIU_{name.upper()}_TLS_CERT_FILE={root / f'{name}.crt'}")
            lines.append(f"export NIUNIU_{name.upper()}_TLS_KEY_FILE={root / f'{name}-tls.key'}")
        lines.append(f"export NIUNIU_TLS_CLIENT_CERT_FILE={root / 'operator.crt'}")
        lines.append(f"export NIUNIU_TLS_CLIENT_KEY_FILE={root / 'operator-tls.key'}")
    if (directory / "gateway.crt").exists():
        lines.append(f"export NIUNIU_GATEWAY_TLS_CERT_FILE={root / 'gateway.crt'}")
        lines.append(f"export NIUNIU_GATEWAY_TLS_KEY_FILE={root / 'gateway-tls.key'}")
    (directory / "env").write_text("\n".join(lines) + "\n")


def generate(directory: Path, *, tls: bool = False) -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    made = []
    for owner in OWNERS:
        if _load(directory, owner) is None:
            _write_private(directory / _file_of(owner), SigningKey.generate(owner).pem())
            made.append(owner)
    if tls:
        made += [f"tls:{name}" for name in make_certificates(directory)]
    _publish(directory)
    return made


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _certificate(
    subject: str, key: ec.EllipticCurvePrivateKey, issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    issuer_name, signer = issuer or (name, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=825 if issuer else 3650))
    )
    if issuer is None:
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
    else:
        names = [x509.DNSName("localhost"), x509.DNSName(subject), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
        builder = (
            builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
    return builder.sign(signer, hashes.SHA256())


TLS_NAMES = (*SERVICES, "operator", "gateway", "infra")
"""Who gets a certificate from the local CA: the services, operator tools, the gateway, the infrastructure."""


def _local_ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey, bool]:
    """The directory's CA and its key, made first if missing; the flag says it was just made."""
    if (directory / "ca.pem").exists():
        ca = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
        key = serialization.load_pem_private_key((directory / "ca-key.pem").read_bytes(), None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise SystemExit(f"{directory / 'ca-key.pem'} is not an EC key")
        return ca, key, False
    key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("niuniu local CA", key, None)
    _write_private(directory / "ca-key.pem", _pem_key(key))
    (directory / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    return ca, key, True


def make_certificates(directory: Path) -> list[str]:
    """A local CA and, signed by it, the certificates of ``TLS_NAMES`` that are missing; returns what it made."""
    ca, ca_key, new_ca = _local_ca(directory)
    made = ["ca"] if new_ca else []
    for name in TLS_NAMES:
        if not new_ca and (directory / f"{name}.crt").exists():
            continue
        made.append(name)
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _certificate(name, key, (ca.subject, ca_key))
        _write_private(directory / f"{name}-tls.key", _pem_key(key))
        (directory / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return made


def rotate(directory: Path, owner: str) -> tuple[str, str]:
    old = _load(directory, owner)
    if old is None:
        raise SystemExit(f"no key for {owner} in {directory}; run generate first")
    retired = _retired(directory)
    (directory / "retired.json").write_text(json.dumps(jwks([*retired, old.trusted]), indent=2) + "\n")
    new = SigningKey.generate(owner)
    _write_private(directory / _file_of(owner), new.pem())
    _publish(directory)
    return old.trusted.kid, new.trusted.kid


def prune(directory: Path) -> int:
    count = len(_retired(directory))
    (directory / "retired.json").unlink(missing_ok=True)
    _publish(directory)
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/keys", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default=os.path.join(os.environ.get("NIUNIU_RUN_DIR", ".run"), "keys"))
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="create the keys that are missing; write jwks.json and env")
    gen.add_argument("--tls", action="store_true", help="also a local CA and a TLS certificate per service")
    rot = commands.add_parser("rotate", help="a new key for one owner; the old public key stays trusted")
    rot.add_argument("--owner", required=True, choices=OWNERS)
    commands.add_parser("prune", help="stop trusting rotated-out keys")
    args = parser.parse_args(argv)
    directory = Path(args.dir)
    if args.command == "generate":
        made = generate(directory, tls=args.tls)
        print(f"keys: {directory}: {'created ' + ', '.join(made) if made else 'all present'}")
    elif args.command == "rotate":
        old, new = rotate(directory, args.owner)
        print(f"keys: {args.owner}: signing with {new}; {old} still trusted until 'prune'; restart the services")
    else:
        print(f"keys: {prune(directory)} retired key(s) no longer trusted; restart the services")
    return 0


if __name__ == "__main__":
    sys.exit(main())
