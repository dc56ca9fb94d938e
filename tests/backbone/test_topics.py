"""Topic creation settings from the environment (backbone/topics.py): replication, min.insync, partitions."""

from __future__ import annotations

import pytest

from backbone.config import ConfigError
from backbone.kafka import RETENTION_MS
from backbone.topics import DEFAULT_PARTITIONS, Topics, TopicSettings


def test_defaults_are_one_broker_and_the_known_partitions() -> None:
    specs = {s.name: s for s in Topics("p.").specs(TopicSettings.from_env({}))}
    assert {name: s.partitions for name, s in specs.items()} == {f"p.{n}": c for n, c in DEFAULT_PARTITIONS.items()}
    assert {s.replication_factor for s in specs.values()} == {1}
    assert all("min.insync.replicas" not in s.config for s in specs.values())
    assert {(s.config["retention.ms"], s.config["compression.type"]) for s in specs.values()} == {
        (str(RETENTION_MS), "zstd")
    }


def test_a_cluster_sets_replication_min_insync_and_partitions() -> None:
    env = {
        "NIUNIU_TOPIC_REPLICATION_FACTOR": "3",
        "NIUNIU_TOPIC_MIN_INSYNC_REPLICAS": "2",
        "NIUNIU_TOPIC_PARTITIONS": "niuniu.table.events=12, niuniu.wallet.events=24",
    }
    specs = {s.name: s for s in Topics().specs(TopicSettings.from_env(env))}
    assert specs["niuniu.table.events"].partitions == 12 and specs["niuniu.wallet.events"].partitions == 24
    assert specs["niuniu.rng.events"].partitions == DEFAULT_PARTITIONS["niuniu.rng.events"]
    assert {(s.replication_factor, s.config["min.insync.replicas"]) for s in specs.values()} == {(3, "2")}


@pytest.mark.parametrize(
    ("env", "reason"),
    [
        ({"NIUNIU_TOPIC_REPLICATION_FACTOR": "three"}, "not a whole number"),
        ({"NIUNIU_TOPIC_REPLICATION_FACTOR": "0"}, "must be 1..16"),
        ({"NIUNIU_TOPIC_REPLICATION_FACTOR": "2", "NIUNIU_TOPIC_MIN_INSYNC_REPLICAS": "3"}, "exceeds"),
        ({"NIUNIU_TOPIC_PARTITIONS": "niuniu.table.events"}, "is not <topic>=<count>"),
        ({"NIUNIU_TOPIC_PARTITIONS": "niuniu.tables=4"}, "is not <topic>=<count>"),
        ({"NIUNIU_TOPIC_PARTITIONS": "niuniu.table.events=0"}, "must be 1..1000"),
    ],
)
def test_a_bad_setting_stops_the_service_with_its_name(env: dict[str, str], reason: str) -> None:
    with pytest.raises(ConfigError, match=reason):
        TopicSettings.from_env(env)
