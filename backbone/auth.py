"""Who is calling: signed JWTs carried as ``authorization: Bearer <token>`` metadata.

Roles: ``player`` (subject = their account id), ``admin``, ``auditor``, ``cashier``
(an operator's payment integration: the wallet lets it only deposit to and withdraw
from player accounts) and ``service`` (subject = ``service:<name>``, e.g. ``service:table``).

Tokens are signed with Ed25519 keys (JWS ``EdDSA``); every key has an *owner*:

- ``issuer``: the wallet's key for player, admin, auditor and cashier tokens (issued at log-in);
- ``service:<name>``: one key per service for its own calls to other services.

A verifier trusts a set of public keys (a JWKS file, ``NIUNIU_JWKS_FILE``), each with
its key id (``kid``, the RFC 7638 thumbprint) and its owner, and accepts a token only if
the key named by its ``kid`` is trusted *and its owner may vouch for the token's role*:
``service:table`` only from the table's key, player/admin/auditor/cashier only from the
issuer's key. So a service, which holds only its own private key, can never mint a
player's or an admin's token. Rotation: publish the new public key in the JWKS next to
the old one, switch the signer to the new private key, drop the old public key once
the longest-lived token it signed has expired.

Outside development mode (``NIUNIU_ENV=development``, set only by the local scripts and
the test harness) a process refuses to start without key material, and refuses the
development keys that are derived from constants written in this file.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import grpc
import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from backbone.config import PLACEHOLDER, ConfigError
from backbone.errors import PermissionDenied, Unauthenticated

log = logging.getLogger(__name__)

ALGORITHM = "EdDSA"
ISSUER = "issuer"  # the owner of the key that signs player, admin, auditor and cashier tokens
SERVICES = ("rng", "table", "wallet", "ledger")
GATEWAY = "gateway"  # the browser gateway: signs only its own calls, vouching for the client address it forwards
SIGNERS = (*SERVICES, GATEWAY)  # every process with a ``service:<name>`` key of its own
DEFAULT_TTL_S = 12 * 3600  # a log-in
SERVICE_TTL_S = 15 * 60  # a service's own token; renewed well before it expires
SERVICE_RENEW_BEFORE_S = 5 * 60
LEEWAY_S = 30  # clock skew tolerated between services
VERIFIED_CACHE_SIZE = 4_096
"""Tokens whose signature this process has checked, kept so a caller's next call skips the Ed25519
verification and the JWT parsing (~5 % of a service's time under load); their times are
still checked on every call, against this verifier's clock."""
ENV_MODE = "NIUNIU_ENV"
DEVELOPMENT = "development"
JWKS_FILE_ENV = "NIUNIU_JWKS_FILE"
ISSUER_KEY_ENV = "NIUNIU_ISSUER_KEY_FILE"
# Written in the repository, hence public: anyone can derive these keys. They exist so that
# tests and a laptop run without key files; outside development mode they are refused.
_DEVELOPMENT_KEY_LABEL = b"niuniu development key, public, never for production: "


class Role(StrEnum):
    PLAYER = "player"
    ADMIN = "admin"
    AUDITOR = "auditor"
    CASHIER = "cashier"
    SERVICE = "service"


@dataclass(frozen=True, slots=True)
class Principal:
    subject: str
    role: Role

    @property
    def service_name(self) -> str | None:
        if self.role is Role.SERVICE and self.subject.startswith("service:"):
            return self.subject.removeprefix("service:")
        return None


def development_mode() -> bool:
    return os.environ.get(ENV_MODE, "") == DEVELOPMENT


def service_owner(service: str) -> str:
    return f"service:{service}"


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _raw_public(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(public: Ed25519PublicKey) -> str:
    """The RFC 7638 thumbprint of the key: stable, and derived, so it cannot be mislabelled."""
    canonical = json.dumps({"crv": "Ed25519", "kty": "OKP", "x": _b64url(_raw_public(public))}, separators=(",", ":"))
    return _b64url(hashlib.sha256(canonical.encode()).digest())


def development_private_key(owner: str) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(hashlib.sha256(_DEVELOPMENT_KEY_LABEL + owner.encode()).digest())


def is_development_key(public: Ed25519PublicKey, owner: str = "") -> bool:
    """True for the key derived from this file's constant for ``owner`` or any well-known owner."""
    raw = _raw_public(public)
    owners = {owner, ISSUER, *(service_owner(s) for s in SIGNERS)} - {""}
    return any(_raw_public(development_private_key(o).public_key()) == raw for o in owners)


@dataclass(frozen=True, slots=True)
class TrustedKey:
    owner: str
    public: Ed25519PublicKey

    @property
    def kid(self) -> str:
        return key_id(self.public)

    def jwk(self) -> dict[str, str]:
        x = _b64url(_raw_public(self.public))
        return {
            "kty": "OKP",
            "crv": "Ed25519",
            "x": x,
            "kid": self.kid,
            "alg": ALGORITHM,
            "use": "sig",
            "owner": self.owner,
        }

    @classmethod
    def from_jwk(cls, jwk: Mapping[str, Any]) -> TrustedKey:
        if jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519":
            raise ConfigError(f"JWKS: only Ed25519 (OKP) keys are supported, not {jwk.get('kty')}/{jwk.get('crv')}")
        owner = str(jwk.get("owner", ""))
        if owner != ISSUER and not owner.startswith("service:"):
            raise ConfigError(f"JWKS: key {jwk.get('kid')} needs an owner ('issuer' or 'service:<name>')")
        x = str(jwk.get("x", ""))
        public = Ed25519PublicKey.from_public_bytes(base64.urlsafe_b64decode(x + "=" * (-len(x) % 4)))
        key = cls(owner, public)
        if jwk.get("kid") not in (None, key.kid):
            raise ConfigError(f"JWKS: kid {jwk.get('kid')} is not the thumbprint of its key ({key.kid})")
        return key


@dataclass(frozen=True, slots=True)
class SigningKey:
    owner: str
    private: Ed25519PrivateKey

    @property
    def trusted(self) -> TrustedKey:
        return TrustedKey(self.owner, self.private.public_key())

    @classmethod
    def generate(cls, owner: str) -> SigningKey:
        return cls(owner, Ed25519PrivateKey.generate())

    @classmethod
    def development(cls, owner: str) -> SigningKey:
        return cls(owner, development_private_key(owner))

    @classmethod
    def from_pem(cls, owner: str, pem: bytes) -> SigningKey:
        key = serialization.load_pem_private_key(pem, password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ConfigError(f"the {owner} key must be an Ed25519 private key (PEM, PKCS#8)")
        return cls(owner, key)

    def pem(self) -> bytes:
        return self.private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )


def jwks(keys: Iterable[TrustedKey]) -> dict[str, list[dict[str, str]]]:
    return {"keys": [k.jwk() for k in keys]}


def load_jwks(path: str | Path) -> list[TrustedKey]:
    try:
        document = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise ConfigError(f"cannot read the JWKS file {path}: {error}") from None
    return [TrustedKey.from_jwk(jwk) for jwk in document.get("keys", [])]


class ServiceCredentials:
    """A service's own token, renewed ``renew_before_s`` before it expires (fresh on every call)."""

    def __init__(
        self, tokens: Tokens, service: str, *, ttl_s: int = SERVICE_TTL_S, renew_before_s: int = SERVICE_RENEW_BEFORE_S
    ) -> None:
        assert 0 < renew_before_s < ttl_s
        self._tokens = tokens
        self._service = service
        self._ttl_s = ttl_s
        self._renew_before_s = renew_before_s
        self._token = ""
        self._renew_at = float("-inf")
        self.renewals = 0

    def token(self) -> str:
        now = self._tokens.now()
        # Renew also when the clock went backwards past the issue time (its iat would be in the future).
        if now >= self._renew_at or now < self._renew_at - self._ttl_s:
            self._token = self._tokens.service_token(self._service, ttl_s=self._ttl_s)
            self._renew_at = now + self._ttl_s - self._renew_before_s
            self.renewals += 1
        return self._token

    def metadata(self) -> tuple[tuple[str, str]]:
        return bearer(self.token())


class Tokens:
    """Issues (with the private keys this process holds) and verifies (against trusted public keys)."""

    def __init__(
        self,
        trusted: Iterable[TrustedKey],
        signers: Iterable[SigningKey] = (),
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._signers = {s.owner: s for s in signers}
        self._trusted = {k.kid: k for k in trusted}
        self._clock = clock
        self._verified: dict[str, tuple[Principal, dict[str, Any]]] = {}

    # -- construction -------------------------------------------------------------------

    @classmethod
    def development(cls, *, clock: Callable[[], float] = time.time) -> Tokens:
        """Every development key, signing and trusted: for tests and a development laptop only."""
        signers = [SigningKey.development(o) for o in (ISSUER, *(service_owner(s) for s in SIGNERS))]
        return cls([s.trusted for s in signers], signers, clock=clock)

    @classmethod
    def ephemeral(cls, *owners: str) -> Tokens:
        """Fresh random keys for ``owners`` (default: all), trusting only themselves: a forger in tests."""
        names = owners or (ISSUER, *(service_owner(s) for s in SIGNERS))
        signers = [SigningKey.generate(o) for o in names]
        return cls([s.trusted for s in signers], signers)

    @classmethod
    def from_env(cls, service: str | None, *, issuer: bool = False, env: Mapping[str, str] | None = None) -> Tokens:
        """The keys of ``service`` (and the issuer's when ``issuer``) from the environment.

        Raises ConfigError, with what to set, when key material is missing or is a
        development key outside development mode.
        """
        env = os.environ if env is None else env
        development = env.get(ENV_MODE, "") == DEVELOPMENT
        owners = ([service_owner(service)] if service else []) + ([ISSUER] if issuer else [])
        key_vars = {ISSUER: ISSUER_KEY_ENV}
        if service:
            key_vars[service_owner(service)] = f"NIUNIU_{service.upper()}_KEY_FILE"
        signers: list[SigningKey] = []
        for owner in owners:
            path = env.get(key_vars[owner], "")
            if path:
                signers.append(SigningKey.from_pem(owner, _read_key(path, key_vars[owner])))
            elif development:
                signers.append(SigningKey.development(owner))
            else:
                raise ConfigError(_missing(key_vars[owner], f"the {owner} private key (Ed25519, PEM)"))
        jwks_path = env.get(JWKS_FILE_ENV, "")
        if jwks_path:
            trusted = load_jwks(jwks_path)
            if not trusted:
                raise ConfigError(f"{JWKS_FILE_ENV}: {jwks_path} trusts no key (the placeholder?); deliver niuniu-jwks")
        elif development:
            trusted = [s.trusted for s in cls.development()._signers.values()]
        else:
            raise ConfigError(_missing(JWKS_FILE_ENV, "the public keys every service trusts (JWKS)"))
        if not development:
            for key in [*(s.trusted for s in signers), *trusted]:
                if is_development_key(key.public, key.owner):
                    raise ConfigError(
                        f"refusing the development key for {key.owner} (kid {key.kid}): it is written in the "
                        f"repository, so anyone can sign with it; generate real keys (scripts/keys) or set "
                        f"{ENV_MODE}={DEVELOPMENT} for a local run"
                    )
        kids = {k.kid for k in trusted}
        for signer in signers:
            if signer.trusted.kid not in kids:
                raise ConfigError(
                    f"the {signer.owner} key (kid {signer.trusted.kid}) is not in the trusted keys "
                    f"({JWKS_FILE_ENV}); publish its public key there first"
                )
        if development:
            log.warning("%s=%s: development keys are accepted; never in production", ENV_MODE, DEVELOPMENT)
        return cls(trusted, signers)

    # -- issuing ------------------------------------------------------------------------

    def now(self) -> float:
        return self._clock()

    def can_issue(self, role: Role, subject: str = "") -> bool:
        return self._owner_for(role, subject) in self._signers

    def issue(self, subject: str, role: Role, *, ttl_s: int = DEFAULT_TTL_S) -> str:
        owner = self._owner_for(role, subject)
        signer = self._signers.get(owner)
        if signer is None:
            raise PermissionDenied("NO_SIGNING_KEY", f"this process holds no key to sign {role.value} tokens")
        now = int(self._clock())
        claims = {
            "sub": subject,
            "role": role.value,
            "iss": owner,
            "iat": now,
            "nbf": now - LEEWAY_S,
            "exp": now + ttl_s,
        }
        return jwt.encode(claims, signer.private, algorithm=ALGORITHM, headers={"kid": signer.trusted.kid})

    def service_token(self, service: str, *, ttl_s: int = SERVICE_TTL_S) -> str:
        return self.issue(service_owner(service), Role.SERVICE, ttl_s=ttl_s)

    def service_credentials(self, service: str, **kwargs: int) -> ServiceCredentials:
        return ServiceCredentials(self, service, **kwargs)

    def public_keys(self) -> list[TrustedKey]:
        """The public halves of the keys this process signs with (what it publishes)."""
        return [s.trusted for s in self._signers.values()]

    @staticmethod
    def _owner_for(role: Role, subject: str) -> str:
        return subject if role is Role.SERVICE else ISSUER

    # -- verifying ----------------------------------------------------------------------

    def verify(self, token: str) -> Principal:
        known = self._verified.get(token)
        if known is not None:
            principal, claims = known
            self._check_times(claims)
            return principal
        principal, claims = self._verify_signed(token)
        if len(self._verified) >= VERIFIED_CACHE_SIZE:
            self._verified.clear()  # bounded; the callers of the moment come back at their next call
        self._verified[token] = (principal, claims)
        return principal

    def _verify_signed(self, token: str) -> tuple[Principal, dict[str, Any]]:
        """The token's signature, issuer, times and role checked in full: (its caller, its claims)."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise Unauthenticated("TOKEN_INVALID", "the token is not a JWT") from None
        key = self._trusted.get(str(header.get("kid", "")))
        if key is None:
            raise Unauthenticated("TOKEN_INVALID", "the token is signed by a key this service does not trust")
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key.public,
                algorithms=[ALGORITHM],
                issuer=key.owner,
                # Times are checked below against this verifier's clock (injectable, like the issuer's).
                options={
                    "require": ["sub", "role", "exp", "iat", "iss"],
                    "verify_exp": False,
                    "verify_nbf": False,
                    "verify_iat": False,
                },
            )
        except jwt.PyJWTError as error:
            raise Unauthenticated("TOKEN_INVALID", f"the token is not valid: {str(error)[:80]}") from None
        self._check_times(claims)
        try:
            role = Role(claims["role"])
        except ValueError:
            raise Unauthenticated("TOKEN_INVALID", "the token names an unknown role") from None
        subject = str(claims["sub"])
        if self._owner_for(role, subject) != key.owner:
            # e.g. the table's key signing an admin token, or service:wallet signed by the table
            raise Unauthenticated("TOKEN_INVALID", f"a {key.owner} key may not vouch for this {role.value} token")
        return Principal(subject, role), claims

    def _check_times(self, claims: Mapping[str, Any]) -> None:
        now = self._clock()
        try:
            expires, issued, not_before = int(claims["exp"]), int(claims["iat"]), int(claims.get("nbf", claims["iat"]))
        except (TypeError, ValueError):
            raise Unauthenticated("TOKEN_INVALID", "the token's times are not integers") from None
        if now > expires + LEEWAY_S:
            raise Unauthenticated("TOKEN_EXPIRED", "the token has expired; log in again")
        if now < not_before - LEEWAY_S or now < issued - LEEWAY_S:
            raise Unauthenticated("TOKEN_INVALID", "the token is not valid yet (issued in the future)")

    def authenticate(self, context: grpc.aio.ServicerContext[Any, Any]) -> Principal:
        """The caller of this RPC, from its ``authorization`` metadata; UNAUTHENTICATED if none."""
        for key, value in context.invocation_metadata() or ():
            if key == "authorization":
                scheme, _, token = str(value).partition(" ")
                if scheme.lower() != "bearer" or not token:
                    raise Unauthenticated("TOKEN_MALFORMED", "authorization must be 'Bearer <token>'")
                return self.verify(token)
        raise Unauthenticated("TOKEN_MISSING", "this call needs an authorization token")


KEY_ENV_VARS = (JWKS_FILE_ENV, ISSUER_KEY_ENV, *(f"NIUNIU_{s.upper()}_KEY_FILE" for s in SIGNERS))


def development_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for a child process on the development keys (tests, benches): NIUNIU_ENV=development, no key files."""
    out = {k: v for k, v in env.items() if k not in KEY_ENV_VARS}
    out[ENV_MODE] = DEVELOPMENT
    return out


def operator_token(role: Role, subject: str, *, ttl_s: int = 3600) -> str:
    """A token for an operator's command-line tool (e.g. ``niuniu-audit`` as an auditor).

    ``NIUNIU_<ROLE>_TOKEN`` (a token from the wallet's Login) if set; otherwise signed
    here with the issuer key (``NIUNIU_ISSUER_KEY_FILE``, i.e. run next to the wallet),
    under the same rules as a service: no development key outside development mode.
    """
    token = os.environ.get(f"NIUNIU_{role.value.upper()}_TOKEN", "")
    if token:
        return token
    return Tokens.from_env(None, issuer=True).issue(subject, role, ttl_s=ttl_s)


def _read_key(path: str, var: str) -> bytes:
    try:
        pem = Path(path).read_bytes()
    except OSError as error:
        raise ConfigError(f"{var}: cannot read {path}: {error.strerror}") from None
    if PLACEHOLDER.encode() in pem:
        raise ConfigError(f"{var}: {path} holds the placeholder {PLACEHOLDER}; deliver the real key")
    return pem


def _missing(var: str, what: str) -> str:
    return (
        f"{var} is not set: this service needs {what}. Generate local keys with scripts/keys "
        f"(or deliver them from your secret store), or set {ENV_MODE}={DEVELOPMENT} for a local run"
    )


def require(principal: Principal, *roles: Role, service: str | None = None) -> Principal:
    """PERMISSION_DENIED unless the caller has one of ``roles`` (and is ``service`` when a service)."""
    if principal.role not in roles:
        allowed = ", ".join(r.value for r in roles)
        raise PermissionDenied("ROLE_NOT_ALLOWED", f"role {principal.role.value} may not do this (allowed: {allowed})")
    if service is not None and principal.role is Role.SERVICE and principal.service_name != service:
        raise PermissionDenied("SERVICE_NOT_ALLOWED", f"only the {service} service may do this")
    return principal


def bearer(token: str) -> tuple[tuple[str, str]]:
    """Call metadata carrying ``token``."""
    return (("authorization", f"Bearer {token}"),)
