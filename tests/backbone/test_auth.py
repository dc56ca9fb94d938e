"""Tokens and roles (pure)."""

from __future__ import annotations

import jwt
import pytest

from backbone.auth import Principal, Role, Tokens, require
from backbone.errors import PermissionDenied, Unauthenticated

SECRET = "a-test-secret-that-is-long-enough-for-hs256"


def test_issued_token_verifies_to_its_principal() -> None:
    tokens = Tokens(SECRET)
    assert tokens.verify(tokens.issue("player:7", Role.PLAYER)) == Principal("player:7", Role.PLAYER)
    service = tokens.verify(tokens.service_token("table"))
    assert service.role is Role.SERVICE and service.service_name == "table"


def test_expired_forged_and_malformed_tokens_are_unauthenticated() -> None:
    now = [1_000_000.0]
    tokens = Tokens(SECRET, clock=lambda: now[0])
    token = tokens.issue("player:7", Role.PLAYER, ttl_s=60)
    with pytest.raises(Unauthenticated) as expired:
        Tokens(SECRET).verify(token)
    assert expired.value.reason == "TOKEN_EXPIRED"
    forged = Tokens("another-secret-that-is-long-enough-0000").issue("admin", Role.ADMIN)
    with pytest.raises(Unauthenticated):
        Tokens(SECRET).verify(forged)
    with pytest.raises(Unauthenticated):
        Tokens(SECRET).verify("not-a-jwt")
    unknown_role = jwt.encode(
        {"sub": "x", "role": "god", "iss": "niuniu", "iat": 1, "exp": 2**40}, SECRET, algorithm="HS256"
    )
    with pytest.raises(Unauthenticated):
        Tokens(SECRET).verify(unknown_role)


def test_require_checks_role_and_service_identity() -> None:
    table = Principal("service:table", Role.SERVICE)
    wallet = Principal("service:wallet", Role.SERVICE)
    player = Principal("player:1", Role.PLAYER)
    assert require(table, Role.SERVICE, service="table") is table
    with pytest.raises(PermissionDenied):
        require(wallet, Role.SERVICE, service="table")
    with pytest.raises(PermissionDenied):
        require(player, Role.SERVICE, Role.ADMIN)
