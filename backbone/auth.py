"""Who is calling: signed JWTs carried as ``authorization: Bearer <token>`` metadata.

Roles: ``player`` (subject = their account id), ``admin``, ``auditor`` and
``service`` (subject = ``service:<name>``, e.g. ``service:table``). Tokens are
HS256-signed with ``NIUNIU_JWT_SECRET``, shared by the services through a
Kubernetes Secret. The wallet issues player/admin/auditor tokens at log-in;
a service mints its own identity token with the same secret.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import grpc
import jwt

from backbone.errors import PermissionDenied, Unauthenticated

log = logging.getLogger(__name__)

ALGORITHM = "HS256"
ISSUER = "niuniu"
DEV_SECRET = "niuniu-dev-secret-not-for-production-use"
DEFAULT_TTL_S = 12 * 3600
MIN_SECRET_BYTES = 32


class Role(StrEnum):
    PLAYER = "player"
    ADMIN = "admin"
    AUDITOR = "auditor"
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


def secret_from_env() -> str:
    secret = os.environ.get("NIUNIU_JWT_SECRET")
    if not secret:
        log.warning("NIUNIU_JWT_SECRET is unset: using the development secret")
        return DEV_SECRET
    if len(secret.encode()) < MIN_SECRET_BYTES:
        raise ValueError(f"NIUNIU_JWT_SECRET must be at least {MIN_SECRET_BYTES} bytes")
    return secret


class Tokens:
    """Issues and verifies tokens. ``clock`` is injectable for tests."""

    def __init__(self, secret: str, *, clock: Callable[[], float] = time.time) -> None:
        self._secret = secret
        self._clock = clock

    def issue(self, subject: str, role: Role, *, ttl_s: int = DEFAULT_TTL_S) -> str:
        now = int(self._clock())
        claims = {"sub": subject, "role": role.value, "iss": ISSUER, "iat": now, "exp": now + ttl_s}
        return jwt.encode(claims, self._secret, algorithm=ALGORITHM)

    def service_token(self, service: str) -> str:
        return self.issue(f"service:{service}", Role.SERVICE)

    def verify(self, token: str) -> Principal:
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                self._secret,
                algorithms=[ALGORITHM],
                issuer=ISSUER,
                options={"require": ["sub", "role", "exp", "iat", "iss"]},
                leeway=5,
            )
        except jwt.ExpiredSignatureError:
            raise Unauthenticated("TOKEN_EXPIRED", "the token has expired; log in again") from None
        except jwt.PyJWTError as error:
            raise Unauthenticated("TOKEN_INVALID", f"the token is not valid: {error}") from None
        try:
            role = Role(claims["role"])
        except ValueError:
            raise Unauthenticated("TOKEN_INVALID", "the token names an unknown role") from None
        return Principal(str(claims["sub"]), role)

    def authenticate(self, context: grpc.aio.ServicerContext[Any, Any]) -> Principal:
        """The caller of this RPC, from its ``authorization`` metadata; UNAUTHENTICATED if none."""
        for key, value in context.invocation_metadata() or ():
            if key == "authorization":
                scheme, _, token = str(value).partition(" ")
                if scheme.lower() != "bearer" or not token:
                    raise Unauthenticated("TOKEN_MALFORMED", "authorization must be 'Bearer <token>'")
                return self.verify(token)
        raise Unauthenticated("TOKEN_MISSING", "this call needs an authorization token")


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
