"""Tokens, keys and roles (pure): who may sign what, rotation, renewal, key material from the environment."""

from __future__ import annotations

import json
from pathlib import Path

import jwt
import pytest

from backbone import keys
from backbone.auth import (
    ISSUER,
    Principal,
    Role,
    ServiceCredentials,
    SigningKey,
    Tokens,
    TrustedKey,
    development_private_key,
    is_development_key,
    key_id,
    require,
    service_owner,
)
from backbone.config import ConfigError
from backbone.errors import PermissionDenied, Unauthenticated


def _ring(*owners: str) -> tuple[list[SigningKey], Tokens]:
    signers = [SigningKey.generate(o) for o in owners]
    return signers, Tokens([s.trusted for s in signers], signers)


def test_issued_token_verifies_to_its_principal() -> None:
    _, tokens = _ring(ISSUER, service_owner("table"))
    assert tokens.verify(tokens.issue("player:7", Role.PLAYER)) == Principal("player:7", Role.PLAYER)
    service = tokens.verify(tokens.service_token("table"))
    assert service.role is Role.SERVICE and service.service_name == "table"
    header = jwt.get_unverified_header(tokens.issue("a", Role.ADMIN))
    assert header["alg"] == "EdDSA" and header["kid"] == key_id(tokens.public_keys()[0].public)


def test_expired_forged_and_malformed_tokens_are_unauthenticated() -> None:
    signers, tokens = _ring(ISSUER)
    past = Tokens([s.trusted for s in signers], signers, clock=lambda: 1_000_000.0)
    with pytest.raises(Unauthenticated) as expired:
        tokens.verify(past.issue("player:7", Role.PLAYER, ttl_s=60))
    assert expired.value.reason == "TOKEN_EXPIRED"
    for forger in (Tokens.ephemeral(), Tokens.development()):  # any key other than the trusted issuer's
        with pytest.raises(Unauthenticated, match="does not trust"):
            tokens.verify(forger.issue("admin", Role.ADMIN))
    with pytest.raises(Unauthenticated):
        tokens.verify("not-a-jwt")
    # The issuer's kid on a token signed by another key, or an HS256 token "signed" with the public key.
    kid = signers[0].trusted.kid
    stolen_kid = jwt.encode(
        {"sub": "x", "role": "admin", "iss": ISSUER, "iat": 1, "exp": 2**40},
        SigningKey.generate(ISSUER).private,
        algorithm="EdDSA",
        headers={"kid": kid},
    )
    hs256 = jwt.encode(
        {"sub": "x", "role": "admin", "iss": ISSUER, "iat": 1, "exp": 2**40}, "k" * 32, headers={"kid": kid}
    )
    for token in (stolen_kid, hs256):
        with pytest.raises(Unauthenticated):
            tokens.verify(token)
    unknown_role = jwt.encode(
        {"sub": "x", "role": "god", "iss": ISSUER, "iat": 1, "exp": 2**40},
        signers[0].private,
        algorithm="EdDSA",
        headers={"kid": kid},
    )
    with pytest.raises(Unauthenticated):
        tokens.verify(unknown_role)


def test_a_service_key_vouches_only_for_its_own_service() -> None:
    issuer, table, wallet = (SigningKey.generate(o) for o in (ISSUER, service_owner("table"), service_owner("wallet")))
    verifier = Tokens([issuer.trusted, table.trusted, wallet.trusted])
    table_process = Tokens([issuer.trusted, table.trusted, wallet.trusted], [table])
    # The table's process holds no issuer key: it cannot even try to mint an admin/player token...
    for role in (Role.ADMIN, Role.PLAYER, Role.AUDITOR):
        with pytest.raises(PermissionDenied):
            table_process.issue("someone", role)
    with pytest.raises(PermissionDenied):
        table_process.service_token("wallet")
    # ...and tokens signed with the table's key claiming another identity are refused.
    for subject, claimed in (("root", "admin"), ("p1", "player"), ("a", "auditor"), ("service:wallet", "service")):
        forged = jwt.encode(
            {"sub": subject, "role": claimed, "iss": table.owner, "iat": 1, "exp": 2**40},
            table.private,
            algorithm="EdDSA",
            headers={"kid": table.trusted.kid},
        )
        with pytest.raises(Unauthenticated, match="may not vouch"):
            verifier.verify(forged)
    # The issuer's key cannot vouch for a service either.
    as_service = jwt.encode(
        {"sub": "service:table", "role": "service", "iss": ISSUER, "iat": 1, "exp": 2**40},
        issuer.private,
        algorithm="EdDSA",
        headers={"kid": issuer.trusted.kid},
    )
    with pytest.raises(Unauthenticated):
        verifier.verify(as_service)
    assert verifier.verify(table_process.service_token("table")).service_name == "table"


def test_rotation_accepts_old_and_new_keys_while_both_are_published(tmp_path: Path) -> None:
    directory = tmp_path / "keys"
    keys.generate(directory)
    env = {
        k: v
        for k, v in (
            line.removeprefix("export ").split("=", 1) for line in (directory / "env").read_text().splitlines()
        )
    }
    env["NIUNIU_ENV"] = "production"
    before = Tokens.from_env("wallet", issuer=True, env=env)
    old_token = before.issue("p1", Role.PLAYER)
    old_kid, new_kid = keys.rotate(directory, ISSUER)
    after = Tokens.from_env("wallet", issuer=True, env=env)
    new_token = after.issue("p1", Role.PLAYER)
    assert jwt.get_unverified_header(new_token)["kid"] == new_kid != old_kid
    assert after.verify(old_token).subject == after.verify(new_token).subject == "p1"
    assert keys.prune(directory) == 1
    pruned = Tokens.from_env("wallet", issuer=True, env=env)
    assert pruned.verify(new_token).subject == "p1"
    with pytest.raises(Unauthenticated):
        pruned.verify(old_token)
    assert (directory / "issuer.pem").stat().st_mode & 0o777 == 0o600
    published = json.loads((directory / "jwks.json").read_text())["keys"]
    assert all("d" not in k for k in published)  # public halves only


def test_service_credentials_renew_before_they_expire() -> None:
    now = [1_000_000.0]
    signers = [SigningKey.generate(service_owner("table"))]
    tokens = Tokens([s.trusted for s in signers], signers, clock=lambda: now[0])
    creds = ServiceCredentials(tokens, "table", ttl_s=900, renew_before_s=300)
    first = creds.token()
    now[0] += 599
    assert creds.token() == first
    now[0] += 2  # 601 s: within 300 s of the expiry
    second = creds.token()
    assert second != first and creds.renewals == 2
    now[0] += 13 * 3600  # a clock jump far past any expiry: the next call still carries a valid token
    assert tokens.verify(creds.token()).service_name == "table"
    now[0] -= 3600  # and backwards (the last token's iat would be in the future)
    assert tokens.verify(creds.token()).service_name == "table"


def test_key_material_is_required_outside_development_mode(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="NIUNIU_TABLE_KEY_FILE is not set"):
        Tokens.from_env("table", env={})
    with pytest.raises(ConfigError, match="NIUNIU_WALLET_KEY_FILE: cannot read"):
        Tokens.from_env("wallet", issuer=True, env={"NIUNIU_WALLET_KEY_FILE": str(tmp_path / "none.pem")})
    wallet_pem = tmp_path / "wallet.pem"
    wallet_pem.write_bytes(SigningKey.generate(service_owner("wallet")).pem())
    with pytest.raises(ConfigError, match="NIUNIU_ISSUER_KEY_FILE is not set"):
        Tokens.from_env("wallet", issuer=True, env={"NIUNIU_WALLET_KEY_FILE": str(wallet_pem)})
    dev = Tokens.from_env("table", env={"NIUNIU_ENV": "development"})
    assert dev.verify(Tokens.development().issue("p", Role.PLAYER)).subject == "p"
    # The development keys, configured explicitly as files, are still refused outside development mode.
    pem = tmp_path / "table.pem"
    pem.write_bytes(SigningKey.development(service_owner("table")).pem())
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [SigningKey.development(service_owner("table")).trusted.jwk()]}))
    env = {"NIUNIU_TABLE_KEY_FILE": str(pem), "NIUNIU_JWKS_FILE": str(jwks)}
    with pytest.raises(ConfigError, match="development key"):
        Tokens.from_env("table", env=env)
    # A real signing key but a development key among the trusted ones: refused too.
    real = SigningKey.generate(service_owner("table"))
    pem.write_bytes(real.pem())
    dev_issuer = SigningKey.development(ISSUER).trusted
    jwks.write_text(json.dumps({"keys": [real.trusted.jwk(), dev_issuer.jwk()]}))
    with pytest.raises(ConfigError, match="development key for issuer"):
        Tokens.from_env("table", env=env)
    jwks.write_text(json.dumps({"keys": [real.trusted.jwk()]}))
    assert Tokens.from_env("table", env=env).can_issue(Role.SERVICE, "service:table")
    assert is_development_key(development_private_key("service:rng").public_key())
    assert not is_development_key(real.private.public_key(), real.owner)


def test_jwks_kid_must_be_the_thumbprint() -> None:
    jwk = SigningKey.generate(ISSUER).trusted.jwk()
    assert TrustedKey.from_jwk(jwk).kid == jwk["kid"]
    with pytest.raises(ConfigError):
        TrustedKey.from_jwk({**jwk, "kid": "issuer-1"})
    with pytest.raises(ConfigError):
        TrustedKey.from_jwk({**jwk, "owner": "root"})


def test_require_checks_role_and_service_identity() -> None:
    table = Principal("service:table", Role.SERVICE)
    wallet = Principal("service:wallet", Role.SERVICE)
    player = Principal("player:1", Role.PLAYER)
    assert require(table, Role.SERVICE, service="table") is table
    with pytest.raises(PermissionDenied):
        require(wallet, Role.SERVICE, service="table")
    with pytest.raises(PermissionDenied):
        require(player, Role.SERVICE, Role.ADMIN)


def test_a_verified_token_is_still_checked_against_the_clock_on_every_call() -> None:
    signers, _ = _ring(ISSUER)
    now = [1_000_000.0]
    tokens = Tokens([s.trusted for s in signers], signers, clock=lambda: now[0])
    token = tokens.issue("player:7", Role.PLAYER, ttl_s=60)
    assert tokens.verify(token) == Principal("player:7", Role.PLAYER)
    assert tokens.verify(token) == Principal("player:7", Role.PLAYER)  # the second time from what the first checked
    tampered = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    with pytest.raises(Unauthenticated) as forged:
        tokens.verify(tampered)  # a token differing in its signature is verified on its own
    assert forged.value.reason == "TOKEN_INVALID"
    now[0] += 60 + 31  # past its expiry and the leeway
    with pytest.raises(Unauthenticated) as expired:
        tokens.verify(token)
    assert expired.value.reason == "TOKEN_EXPIRED"
