"""How a Kafka client finds its principal in the environment (backbone/kafka.py); no broker needed."""

from __future__ import annotations

import pytest

from backbone.config import ConfigError
from backbone.kafka import KafkaCredentials, credentials_from_env, default_principal_env

ENV = {
    "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
    "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
    "KAFKA_SASL_USERNAME": "niuniu_test",
    "KAFKA_SASL_PASSWORD": "t-secret",
    "NIUNIU_RNG_KAFKA_USER": "niuniu_rng",
    "NIUNIU_RNG_KAFKA_PASSWORD": "r-secret",
}


def test_a_service_uses_its_own_principal_else_the_default() -> None:
    assert credentials_from_env("rng", ENV) == KafkaCredentials("niuniu_rng", "r-secret")
    assert credentials_from_env("wallet", ENV) == KafkaCredentials("niuniu_test", "t-secret")
    assert credentials_from_env(None, ENV) == KafkaCredentials("niuniu_test", "t-secret")


def test_the_client_config_authenticates_with_scram() -> None:
    config = KafkaCredentials("niuniu_rng", "r-secret").client_config()
    assert config == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "niuniu_rng",
        "sasl_plain_password": "r-secret",
    }
    assert "r-secret" not in repr(KafkaCredentials("niuniu_rng", "r-secret"))


def test_no_credentials_means_plaintext_unless_sasl_is_asked_for() -> None:
    assert credentials_from_env("rng", {}) is None
    with pytest.raises(ConfigError, match="no Kafka user"):
        credentials_from_env("rng", {"KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT"})
    with pytest.raises(ConfigError, match="NIUNIU_RNG_KAFKA_PASSWORD"):
        credentials_from_env("rng", {"NIUNIU_RNG_KAFKA_USER": "niuniu_rng"})


def test_a_prefixed_system_runs_every_service_as_the_default_principal() -> None:
    env = default_principal_env(ENV)
    for identity in ("rng", "table", "wallet", "ledger", "auditor"):
        assert credentials_from_env(identity, env) == KafkaCredentials("niuniu_test", "t-secret"), identity
    assert ENV["NIUNIU_RNG_KAFKA_USER"] == "niuniu_rng", "the input is not changed"
    assert "NIUNIU_RNG_KAFKA_USER" not in default_principal_env({"NIUNIU_RNG_KAFKA_USER": "niuniu_rng"})
