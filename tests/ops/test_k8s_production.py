"""overlays/production: operators' resources valid against their CRD schemas, and what production needs.

The custom resources (Strimzi, CloudNativePG, Prometheus Operator) are checked against
the CRD schemas shipped in deploy/k8s/schemas (deploy/k8s/crd_schemas.py); a misspelt
field, a wrong type or an unknown ACL operation fails. Then the overlay's content: every
topic the code knows declared with 3 replicas, min.insync.replicas 2 and the code's
partitions; each service's Kafka user with the ACLs the local broker gives it; one
CloudNativePG cluster, database and owner per service; a managed Redis (no in-cluster
single replica); disruption budgets, probes, requests and limits for every Deployment;
frontends reach the table and the wallet. overlays/operators (Strimzi's v1beta2 API) is
checked against its CRD schemas too.
"""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from ops_support import ROOT, SERVICES, render

from backbone.kafka import MAX_RECORD_BYTES, RETENTION_MS
from backbone.topics import DEFAULT_PARTITIONS


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


crd_schemas = _load("crd_schemas", ROOT / "deploy" / "k8s" / "crd_schemas.py")
sys.path.insert(0, str(ROOT))  # deploy/local/kafka/provision.py imports backbone
provision = _load("provision", ROOT / "deploy" / "local" / "kafka" / "provision.py")


@pytest.fixture(scope="module")
def docs() -> list[dict[str, Any]]:
    return render("overlays/production")


def of_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d.get("kind") == kind}


def test_every_custom_resource_is_valid_against_its_crd_schema(docs: list[dict[str, Any]]) -> None:
    kinds = {(d["apiVersion"], d["kind"]) for d in crd_schemas.custom_resources(docs)}
    assert kinds == {
        ("kafka.strimzi.io/v1", "Kafka"),
        ("kafka.strimzi.io/v1", "KafkaNodePool"),
        ("kafka.strimzi.io/v1", "KafkaTopic"),
        ("kafka.strimzi.io/v1", "KafkaUser"),
        ("postgresql.cnpg.io/v1", "Cluster"),
        ("postgresql.cnpg.io/v1", "Pooler"),
        ("postgresql.cnpg.io/v1", "ScheduledBackup"),
        ("monitoring.coreos.com/v1", "ServiceMonitor"),
        ("monitoring.coreos.com/v1", "PodMonitor"),
        ("monitoring.coreos.com/v1", "PrometheusRule"),
        ("cert-manager.io/v1", "Certificate"),
        ("cert-manager.io/v1", "Issuer"),
    }
    assert crd_schemas.check(docs) == []


def _broken(docs: list[dict[str, Any]], kind: str, name: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    docs = copy.deepcopy(docs)
    return docs, of_kind(docs, kind)[name]


@pytest.mark.parametrize(
    ("kind", "name", "breaks", "expected"),
    [
        ("KafkaTopic", "niuniu.wallet.events", lambda d: d["spec"].update(replicas="three"), "spec.replicas"),
        ("KafkaTopic", "niuniu.wallet.events", lambda d: d["spec"].update(replica=3), "'replica' was unexpected"),
        (
            "KafkaUser",
            "niuniu-ledger",
            lambda d: d["spec"]["authorization"]["acls"][0].update(operations=["Writ"]),
            "spec.authorization.acls.0.operations.0",
        ),
        ("Kafka", "niuniu", lambda d: d["spec"]["kafka"].pop("listeners"), "'listeners' is a required property"),
        (
            "Cluster",
            "niuniu-wallet-pg",
            lambda d: d["spec"]["bootstrap"]["initdb"].update(db="x"),
            "'db' was unexpected",
        ),
        ("KafkaNodePool", "dual-role", lambda d: d["spec"].update(roles=["leader"]), "spec.roles.0"),
        ("ScheduledBackup", "niuniu-wallet-pg-daily", lambda d: d["spec"].update(method="tape"), "spec.method"),
        (
            "Cluster",
            "niuniu-ledger-pg",
            lambda d: d["spec"]["postgresql"]["synchronous"].update(dataDurability="always"),
            "spec.postgresql.synchronous.dataDurability",
        ),
        ("Certificate", "niuniu-wallet-tls", lambda d: d["spec"].update(dnsName=["wallet"]), "dnsName"),
        ("Certificate", "niuniu-table-tls", lambda d: d["spec"]["privateKey"].update(algorithm="DSA"), "algorithm"),
        ("Issuer", "niuniu-ca", lambda d: d["spec"]["ca"].pop("secretName"), "'secretName' is a required property"),
    ],
)
def test_a_broken_resource_fails_with_where(
    docs: list[dict[str, Any]], kind: str, name: str, breaks: Any, expected: str
) -> None:
    broken, doc = _broken(docs, kind, name)
    breaks(doc)
    problems = crd_schemas.check(broken)
    assert problems and all(p.startswith(f"{kind}/{name}: ") for p in problems), problems
    assert any(expected in p for p in problems), problems


def test_a_kind_with_no_schema_fails(docs: list[dict[str, Any]]) -> None:
    broken, doc = _broken(docs, "KafkaTopic", "niuniu.rng.events")
    doc["apiVersion"] = "kafka.strimzi.io/v1beta1"
    assert crd_schemas.check(broken) == [
        "KafkaTopic/niuniu.rng.events: no schema for kafka.strimzi.io/v1beta1 KafkaTopic"
    ]


def test_the_operators_overlay_is_valid_against_its_crd_schemas() -> None:
    docs = render("overlays/operators")
    kinds = {(d["apiVersion"], d["kind"]) for d in crd_schemas.custom_resources(docs)}
    assert kinds == {
        ("kafka.strimzi.io/v1beta2", "Kafka"),
        ("kafka.strimzi.io/v1beta2", "KafkaNodePool"),
        ("kafka.strimzi.io/v1beta2", "KafkaTopic"),
        ("kafka.strimzi.io/v1beta2", "KafkaUser"),
        ("postgresql.cnpg.io/v1", "Cluster"),
        ("monitoring.coreos.com/v1", "ServiceMonitor"),
        ("monitoring.coreos.com/v1", "PrometheusRule"),
    }
    assert crd_schemas.check(docs) == []
    # The v1beta2 schemas are strict as well: a misspelt field fails.
    broken, doc = _broken(docs, "KafkaTopic", "niuniu.wallet.events")
    doc["spec"]["replica"] = 3
    assert crd_schemas.check(broken) == [
        "KafkaTopic/niuniu.wallet.events: spec: Additional properties are not allowed ('replica' was unexpected)"
    ]


def test_every_topic_has_three_replicas_two_in_sync_and_the_codes_partitions(docs: list[dict[str, Any]]) -> None:
    topics = of_kind(docs, "KafkaTopic")
    assert set(topics) == set(DEFAULT_PARTITIONS)
    for name, topic in topics.items():
        spec = topic["spec"]
        assert spec["replicas"] == 3 and str(spec["config"]["min.insync.replicas"]) == "2", name
        assert spec["partitions"] == DEFAULT_PARTITIONS[name], name
        # Compressed, and kept 30 days: the sealed archive holds what is older (docs/decisions/0014).
        assert str(spec["config"]["retention.ms"]) == str(RETENTION_MS) == "2592000000", name
        assert spec["config"]["compression.type"] == "zstd", name
        assert str(spec["config"]["max.message.bytes"]) == str(MAX_RECORD_BYTES), name
    kafka = of_kind(docs, "Kafka")["niuniu"]["spec"]["kafka"]
    assert kafka["config"]["auto.create.topics.enable"] is False and kafka["authorization"]["type"] == "simple"
    assert of_kind(docs, "KafkaNodePool")["dual-role"]["spec"]["replicas"] == 3
    common = of_kind(docs, "ConfigMap")["niuniu-common"]["data"]
    assert common["NIUNIU_TOPIC_REPLICATION_FACTOR"] == "3" and common["NIUNIU_TOPIC_MIN_INSYNC_REPLICAS"] == "2"


def _acls(user: dict[str, Any]) -> set[tuple[str, str, str, str]]:
    return {
        (acl["resource"]["type"], acl["resource"]["name"], acl["resource"].get("patternType", "literal"), op)
        for acl in user["spec"]["authorization"]["acls"]
        for op in acl["operations"]
    }


def test_kafka_users_have_the_acls_of_the_local_broker(docs: list[dict[str, Any]]) -> None:
    """The same grants as deploy/local/kafka/provision.py, Strimzi-spelled (users niuniu-<svc>, Read/Write...)."""
    users = of_kind(docs, "KafkaUser")
    assert set(users) == {*(f"niuniu-{s}" for s in SERVICES), "niuniu-auditor"}
    pattern = {"PREFIXED": "prefix", "LITERAL": "literal"}
    want: dict[str, set[tuple[str, str, str, str]]] = {name: set() for name in users}
    for grant in provision.desired_acls():
        user = grant.principal.replace("_", "-")
        if user not in users or grant.name == provision.AUDITED_TEST_PREFIX:  # local test topics only
            continue
        want[user].add(
            (grant.resource.name.lower(), grant.name, pattern[grant.pattern.name], grant.operation.name.title())
        )
    assert {name: _acls(user) for name, user in users.items()} == want
    assert not any(op in ("Write", "Create", "All") for *_, op in _acls(users["niuniu-auditor"]))


def test_one_postgres_cluster_database_and_owner_per_service(docs: list[dict[str, Any]]) -> None:
    clusters = of_kind(docs, "Cluster")
    assert set(clusters) == {f"niuniu-{s}-pg" for s in SERVICES}
    for service in SERVICES:
        spec = clusters[f"niuniu-{service}-pg"]["spec"]
        initdb = spec["bootstrap"]["initdb"]
        assert (initdb["database"], initdb["owner"]) == (f"niuniu_{service}", f"niuniu_{service}")
        assert spec["instances"] >= 3
    deployments = of_kind(docs, "Deployment")
    for service in SERVICES:
        (container,) = deployments[f"niuniu-{service}"]["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e for e in container["env"]}
        dsn = env[f"NIUNIU_{service.upper()}_DSN"]["value"]  # through the database's pooler
        assert f"host=niuniu-{service}-pooler-rw" in dsn and f"dbname=niuniu_{service}" in dsn
        user = env[f"NIUNIU_{service.upper()}_DB_USER"]["valueFrom"]["secretKeyRef"]
        assert user["name"] == f"niuniu-{service}-pg-app"


def test_every_database_is_backed_up_archived_and_synchronously_replicated(docs: list[dict[str, Any]]) -> None:
    """Backups and WAL to an object store (credentials by Secret reference, a retention), a daily
    ScheduledBackup per cluster, and a commit acknowledged only once a standby has it."""
    clusters = of_kind(docs, "Cluster")
    scheduled = {d["spec"]["cluster"]["name"]: d["spec"] for d in of_kind(docs, "ScheduledBackup").values()}
    secrets = {d["metadata"]["name"] for d in docs if d["kind"] == "Secret"}
    for service in SERVICES:
        name = f"niuniu-{service}-pg"
        spec = clusters[name]["spec"]
        backup = spec["backup"]
        assert backup["retentionPolicy"].endswith("d")
        store = backup["barmanObjectStore"]
        assert store["destinationPath"].startswith("s3://") and store["wal"]["compression"]
        credentials = store["s3Credentials"]
        for ref in (credentials["accessKeyId"], credentials["secretAccessKey"]):
            assert set(ref) == {"name", "key"} and ref["name"] not in secrets  # by reference, never rendered
        sync = spec["postgresql"]["synchronous"]
        assert sync == {"method": "any", "number": 1, "dataDurability": "required"}
        assert sync["number"] < spec["instances"]
        assert spec["postgresql"]["parameters"]["archive_timeout"]
        assert scheduled[name]["method"] == "barmanObjectStore" and scheduled[name]["schedule"]


def test_redis_is_a_managed_service_over_tls(docs: list[dict[str, Any]]) -> None:
    assert not [d for d in docs if d["metadata"]["name"] == "redis" and d["kind"] in ("StatefulSet", "Service")]
    # Its endpoint is the operator's Secret niuniu-redis (test_k8s_secrets.py), documented as rediss://.
    readme = (ROOT / "deploy" / "k8s" / "README.md").read_text()
    assert "| Secret `niuniu-redis` | `REDIS_URL` (`rediss://" in readme


def test_every_deployment_has_a_budget_probes_requests_and_limits(docs: list[dict[str, Any]]) -> None:
    budgets = of_kind(docs, "PodDisruptionBudget")
    for name, deployment in of_kind(docs, "Deployment").items():
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert any(
            all(labels.get(k) == v for k, v in b["spec"]["selector"]["matchLabels"].items()) for b in budgets.values()
        ), f"{name}: no PodDisruptionBudget"
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            assert {"readinessProbe", "livenessProbe"} <= set(container), name
            assert {"cpu", "memory"} <= set(container["resources"]["requests"]), name
            assert {"cpu", "memory"} <= set(container["resources"]["limits"]), name


def test_frontends_reach_the_table_and_the_wallet(docs: list[dict[str, Any]]) -> None:
    policies = of_kind(docs, "NetworkPolicy")
    for service, port in (("table", 50052), ("wallet", 50053)):
        (policy,) = [
            p
            for p in policies.values()
            if p["spec"]["podSelector"].get("matchLabels") == {"app.kubernetes.io/name": service}
            and any(
                {"podSelector": {"matchLabels": {"niuniu.io/frontend": "true"}}} in r["from"]
                for r in p["spec"]["ingress"]
            )
        ]
        assert [p["port"] for r in policy["spec"]["ingress"] for p in r["ports"]] == [port]
