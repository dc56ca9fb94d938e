"""Kubernetes manifests: schema-valid (strict) and shaped the way the services need them."""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterator
from typing import Any

import pytest
from ops_support import OVERLAYS, ROOT, SERVICES, kubectl, render, require, run_check_deploy, venv_tool, yaml

from backbone.kafka import RETENTION_MS
from backbone.topics import Topics
from services.gateway.server import metrics_port

kubectl()
require(venv_tool("kubernetes-validate"), "kubernetes-validate (PyPI)")

Doc = dict[str, Any]
ALL = ("base", *(f"overlays/{o}" for o in OVERLAYS))


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Doc]]:
    return {name: render(name) for name in ALL}


def of_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def named(docs: list[Doc], kind: str, name: str) -> Doc:
    (found,) = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name]
    return found


def ports_of(service: str) -> tuple[int, int]:
    text = (ROOT / "services" / service / "server.py").read_text()
    grpc, metrics = re.search(r"grpc_port=(\d+)", text), re.search(r"metrics_port=(\d+)", text)
    assert grpc and metrics, f"no ports in services/{service}/server.py"
    return int(grpc[1]), int(metrics[1])


def test_check_deploy_k8s_validates_every_overlay_strictly() -> None:
    done = run_check_deploy("k8s")
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ALL:
        assert f"ok: deploy/k8s/{name} " in done.stdout


@pytest.mark.parametrize("where", ALL)
@pytest.mark.parametrize("service", SERVICES)
def test_deployment_probes_security_resources_env(rendered: dict[str, list[Doc]], where: str, service: str) -> None:
    grpc_port, metrics_port = ports_of(service)
    deployment = named(rendered[where], "Deployment", f"niuniu-{service}")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts[container["command"][0]] == f"services.{service}.server:main"
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"grpc": grpc_port, "metrics": metrics_port}
    for probe in ("startupProbe", "readinessProbe"):  # readiness: the dependencies answer
        assert container[probe]["grpc"] == {"port": grpc_port}, probe
    # liveness: the process's event loop runs (an outage of a dependency restarts nothing)
    assert container["livenessProbe"]["grpc"] == {"port": grpc_port, "service": "liveness"}
    for kind in ("requests", "limits"):
        assert set(container["resources"][kind]) == {"cpu", "memory"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["automountServiceAccountToken"] is False
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    sources = {(next(iter(s)), next(iter(s.values()))["name"]) for s in container["envFrom"]}
    assert ("configMapRef", "niuniu-common") in sources
    assert ("configMapRef", f"niuniu-{service}") in sources
    assert not any(name == "niuniu-jwt" for _, name in sources), "the services read signing keys from files now"
    _signing_keys_are_mounted_files(rendered[where], where, service, pod, container)
    config = named(rendered[where], "ConfigMap", f"niuniu-{service}")["data"]
    pool = config.pop("NIUNIU_DB_POOL_MAX_SIZE")
    assert config == {
        f"NIUNIU_{service.upper()}_GRPC_PORT": str(grpc_port),
        f"NIUNIU_{service.upper()}_METRICS_PORT": str(metrics_port),
    }
    hpa = named(rendered[where], "HorizontalPodAutoscaler", f"niuniu-{service}")
    # The connection budget (docs/capacity.md): every pod at its pool's size fits in max_connections - reserve.
    assert hpa["spec"]["maxReplicas"] * int(pool) <= MAX_CONNECTIONS - RESERVED_CONNECTIONS
    dsn = f"NIUNIU_{service.upper()}_DSN"
    from_env = {e["name"]: e for e in container.get("env", [])}
    if dsn in from_env and "value" in from_env[dsn]:  # production: through the database's pooler
        assert f"host=niuniu-{service}-pooler-rw " in from_env[dsn]["value"]
        user = from_env[f"NIUNIU_{service.upper()}_DB_USER"]["valueFrom"]["secretKeyRef"]
        assert user == {"name": f"niuniu-{service}-pg-app", "key": "username"}
        _pooler_fits_the_budget(rendered[where], service)
    elif dsn in from_env:
        assert from_env[dsn]["valueFrom"]["secretKeyRef"] == {"name": f"niuniu-{service}-pg-app", "key": "uri"}
    else:
        assert ("secretRef", f"niuniu-{service}-db") in sources
        assert dsn in named(rendered[where], "Secret", f"niuniu-{service}-db")["stringData"]


MAX_CONNECTIONS = 200
RESERVED_CONNECTIONS = 30
"""PostgreSQL's max_connections in the manifests, and what is kept for the operator, replication and people."""


def _pooler_fits_the_budget(docs: list[Doc], service: str) -> None:
    """The pooler's server connections fit the budget, and it passes psycopg's prepared statements on."""
    pooler = named(docs, "Pooler", f"niuniu-{service}-pooler-rw")
    assert pooler["spec"]["cluster"]["name"] == f"niuniu-{service}-pg"
    bouncer = pooler["spec"]["pgbouncer"]
    assert bouncer["poolMode"] == "transaction"
    servers = pooler["spec"]["instances"] * int(bouncer["parameters"]["default_pool_size"])
    assert servers <= MAX_CONNECTIONS - RESERVED_CONNECTIONS
    assert int(bouncer["parameters"]["max_prepared_statements"]) > 0
    cluster = named(docs, "Cluster", f"niuniu-{service}-pg")
    assert cluster["spec"]["postgresql"]["parameters"]["max_connections"] == str(MAX_CONNECTIONS)


KEY_MOUNTS = {
    "jwks": "/etc/niuniu/jwks",
    "signing-key": "/etc/niuniu/signing-key",
    "issuer-key": "/etc/niuniu/issuer-key",
}


def _signing_keys_are_mounted_files(docs: list[Doc], where: str, service: str, pod: Doc, container: Doc) -> None:
    """The JWKS (ConfigMap) and the private keys (Secrets) are read-only files; env names them."""
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    wanted = ["jwks", "signing-key", *(["issuer-key"] if service == "wallet" else [])]
    assert volumes["jwks"]["configMap"]["name"] == "niuniu-jwks"
    assert volumes["signing-key"]["secret"]["secretName"] == f"niuniu-{service}-signing-key"
    assert ("issuer-key" in volumes) == (service == "wallet"), "only the wallet holds the issuer key"
    if service == "wallet":
        assert volumes["issuer-key"]["secret"]["secretName"] == "niuniu-issuer-key"
    for name in wanted:
        assert mounts[name]["mountPath"] == KEY_MOUNTS[name]
        assert mounts[name]["readOnly"] is True
        if "secret" in volumes[name]:
            assert volumes[name]["secret"]["defaultMode"] == 0o440
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    files = {
        "NIUNIU_JWKS_FILE": f"{KEY_MOUNTS['jwks']}/jwks.json",
        f"NIUNIU_{service.upper()}_KEY_FILE": f"{KEY_MOUNTS['signing-key']}/key.pem",
        **({"NIUNIU_ISSUER_KEY_FILE": f"{KEY_MOUNTS['issuer-key']}/issuer.pem"} if service == "wallet" else {}),
    }
    common = named(docs, "ConfigMap", "niuniu-common")["data"]
    if where == "overlays/local":
        # Development keys: NIUNIU_ENV=development and no key files (a placeholder would stop the service).
        assert common["NIUNIU_ENV"] == "development"
        assert not set(files) & set(env)
    else:
        assert "NIUNIU_ENV" not in common and "NIUNIU_ENV" not in env, "development keys only in overlays/local"
        assert {k: env.get(k) for k in files} == files
        if service != "wallet":
            assert "NIUNIU_ISSUER_KEY_FILE" not in env


@pytest.mark.parametrize("where", ALL)
@pytest.mark.parametrize("service", SERVICES)
def test_service_pdb_and_hpa(rendered: dict[str, list[Doc]], where: str, service: str) -> None:
    docs = rendered[where]
    grpc_port, metrics_port = ports_of(service)
    svc = named(docs, "Service", service)
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {"grpc": grpc_port, "metrics": metrics_port}
    assert svc["spec"]["selector"] == {"app.kubernetes.io/name": service}
    pdb = named(docs, "PodDisruptionBudget", f"niuniu-{service}")
    assert pdb["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": service}
    hpa = named(docs, "HorizontalPodAutoscaler", f"niuniu-{service}")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": f"niuniu-{service}"}
    assert "replicas" not in named(docs, "Deployment", f"niuniu-{service}")["spec"], "the HPA owns the replica count"


def _selects(selector: Doc, labels: dict[str, str]) -> bool:
    assert not selector.get("matchExpressions"), "this check only understands matchLabels"
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def allowed_peers(docs: list[Doc], pod_labels: dict[str, str], port: int | str) -> Iterator[Doc]:
    """Every `from` peer of every NetworkPolicy that lets traffic into these pods on this port."""
    for policy in of_kind(docs, "NetworkPolicy"):
        if not _selects(policy["spec"]["podSelector"], pod_labels):
            continue
        for rule in policy["spec"].get("ingress", []):
            ports = [p["port"] for p in rule.get("ports", [])]
            if not ports or port in ports:
                yield from rule["from"]


@pytest.mark.parametrize("where", ALL)
def test_network_policies(rendered: dict[str, list[Doc]], where: str) -> None:
    docs = rendered[where]
    deny = named(docs, "NetworkPolicy", "default-deny-ingress")["spec"]
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress"]}
    labels = {s: named(docs, "Deployment", f"niuniu-{s}")["spec"]["template"]["metadata"]["labels"] for s in SERVICES}
    only_table = [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "table"}}}]
    for service, expected in [
        ("rng", only_table),
        (
            "wallet",
            [
                # the operator's payment backend (cashier role), then the table and the browser gateway
                {"namespaceSelector": {"matchLabels": {"niuniu.io/access-cashier": "true"}}},
                *only_table,
                {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "gateway"}}},
            ],
        ),
        (
            "table",
            [
                {"namespaceSelector": {"matchLabels": {"niuniu.io/access-table": "true"}}},
                {"podSelector": {"matchLabels": {"niuniu.io/frontend": "true"}}},
            ],
        ),
        ("ledger", [{"namespaceSelector": {"matchLabels": {"niuniu.io/access-ledger": "true"}}}]),
    ]:
        grpc_port, _ = ports_of(service)
        assert list(allowed_peers(docs, labels[service], grpc_port)) == expected, service
    # Prometheus, and only Prometheus, reaches the metrics port: of the services and of the gateway.
    labels["gateway"] = named(docs, "Deployment", "niuniu-gateway")["spec"]["template"]["metadata"]["labels"]
    for service, pod_labels in labels.items():
        assert list(allowed_peers(docs, pod_labels, "metrics")) == [
            {"namespaceSelector": {"matchLabels": {"niuniu.io/monitoring": "true"}}}
        ], service


def test_base_secrets_are_marked_placeholders(rendered: dict[str, list[Doc]]) -> None:
    secrets = of_kind(rendered["base"], "Secret")
    assert {s["metadata"]["name"] for s in secrets} == {
        "niuniu-issuer-key",
        "niuniu-redis",
        *(f"niuniu-{s}-db" for s in SERVICES),
        *(f"niuniu-{s}-kafka" for s in SERVICES),
        *(f"niuniu-{s}-signing-key" for s in (*SERVICES, "gateway")),
    }
    for secret in secrets:
        assert "data" not in secret, "placeholders go in stringData"
        assert "niuniu.io/placeholder" in secret["metadata"]["annotations"]
        assert all("REPLACE_ME" in value for value in secret["stringData"].values()), secret["metadata"]["name"]
    assert named(secrets, "Secret", "niuniu-issuer-key")["stringData"] == {"issuer.pem": "REPLACE_ME"}
    for service in SERVICES:
        assert named(secrets, "Secret", f"niuniu-{service}-signing-key")["stringData"] == {"key.pem": "REPLACE_ME"}
    # A JWKS that trusts no key: a service started with it refuses to run (its own key is not trusted).
    jwks = named(rendered["base"], "ConfigMap", "niuniu-jwks")
    assert "niuniu.io/placeholder" in jwks["metadata"]["annotations"]
    assert json.loads(jwks["data"]["jwks.json"]) == {"keys": []}


def test_operators_overlay_drops_placeholder_dsns(rendered: dict[str, list[Doc]]) -> None:
    secrets = of_kind(rendered["overlays/operators"], "Secret")
    # The DSNs and Kafka passwords come from the operators' generated Secrets.
    assert sorted(s["metadata"]["name"] for s in secrets) == sorted(
        ["niuniu-issuer-key", "niuniu-redis", *(f"niuniu-{s}-signing-key" for s in (*SERVICES, "gateway"))]
    )


@pytest.mark.parametrize("where", ALL)
@pytest.mark.parametrize("service", SERVICES)
def test_each_service_is_its_own_kafka_user_and_redis_needs_a_password(
    rendered: dict[str, list[Doc]], where: str, service: str
) -> None:
    docs = rendered[where]
    (container,) = named(docs, "Deployment", f"niuniu-{service}")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container.get("env", [])}
    sources = {(next(iter(s)), next(iter(s.values()))["name"]) for s in container["envFrom"]}
    assert env[f"NIUNIU_{service.upper()}_KAFKA_USER"]["value"] == f"niuniu-{service}"
    password = f"NIUNIU_{service.upper()}_KAFKA_PASSWORD"
    if password in env:
        assert env[password]["valueFrom"]["secretKeyRef"] == {"name": f"niuniu-{service}", "key": "password"}
    else:
        assert ("secretRef", f"niuniu-{service}-kafka") in sources
    assert ("secretRef", "niuniu-redis") in sources
    common = named(docs, "ConfigMap", "niuniu-common")["data"]
    assert common["KAFKA_SECURITY_PROTOCOL"] == "SASL_PLAINTEXT" and "REDIS_URL" not in common


def test_strimzi_kafka_authenticates_and_only_the_auditor_reads_the_audit_topic(rendered: dict[str, list[Doc]]) -> None:
    docs = rendered["overlays/operators"]
    (kafka,) = of_kind(docs, "Kafka")
    assert kafka["spec"]["kafka"]["authorization"]["type"] == "simple"
    assert all(
        listener["authentication"]["type"] == "scram-sha-512" for listener in kafka["spec"]["kafka"]["listeners"]
    )
    users = {u["metadata"]["name"]: u["spec"]["authorization"]["acls"] for u in of_kind(docs, "KafkaUser")}
    assert set(users) == {*(f"niuniu-{s}" for s in SERVICES), "niuniu-auditor"}

    def allows(acls: list[Doc], operation: str, topic: str) -> bool:
        return any(
            a["resource"]["type"] == "topic"
            and operation in a["operations"]
            and (
                topic == a["resource"]["name"]
                if a["resource"]["patternType"] == "literal"
                else topic.startswith(a["resource"]["name"])
            )
            for a in acls
        )

    audit = "niuniu.rng.audit"
    assert [u for u, acls in users.items() if allows(acls, "Read", audit)] == ["niuniu-auditor"]
    assert [u for u, acls in users.items() if allows(acls, "Write", audit)] == ["niuniu-rng"]
    for service in SERVICES:
        writable = {t for t in (s.name for s in Topics().specs()) if allows(users[f"niuniu-{service}"], "Write", t)}
        assert writable == {s.name for s in Topics().specs() if s.name.startswith(f"niuniu.{service}.")}


def test_local_overlay_needs_no_operator(rendered: dict[str, list[Doc]]) -> None:
    docs = rendered["overlays/local"]
    assert {d["apiVersion"].split("/")[0] for d in docs} <= {
        "v1",
        "apps",
        "batch",
        "policy",
        "autoscaling",
        "networking.k8s.io",
    }
    assert {d["metadata"]["name"] for d in of_kind(docs, "StatefulSet")} == {"kafka", "postgres", "redis"}
    assert "niuniu_ledger" in named(docs, "ConfigMap", "postgres-init")["data"]["10-databases.sql"]


def test_kafka_topics_match_the_code(rendered: dict[str, list[Doc]]) -> None:
    docs = rendered["overlays/operators"]
    topics = {t["metadata"]["name"]: t["spec"] for t in of_kind(docs, "KafkaTopic")}
    specs = {s.name: s for s in Topics().specs()}
    assert set(topics) == set(specs)
    for name, spec in topics.items():
        assert spec["partitions"] == specs[name].partitions, name
        assert str(spec["config"]["retention.ms"]) == specs[name].config["retention.ms"] == str(RETENTION_MS)
        assert spec["config"]["compression.type"] == specs[name].config["compression.type"] == "zstd"
        assert spec["config"]["cleanup.policy"] == specs[name].config["cleanup.policy"] == "delete"
        assert str(spec["config"]["max.message.bytes"]) == specs[name].config["max.message.bytes"]
    (kafka,) = of_kind(docs, "Kafka")
    assert "zookeeper" not in kafka["spec"], "KRaft only"
    assert kafka["spec"]["kafka"]["config"]["auto.create.topics.enable"] is False
    (pool,) = of_kind(docs, "KafkaNodePool")
    assert set(pool["spec"]["roles"]) == {"controller", "broker"}
    assert pool["metadata"]["labels"]["strimzi.io/cluster"] == kafka["metadata"]["name"]
    bootstrap = named(docs, "ConfigMap", "niuniu-common")["data"]["KAFKA_BOOTSTRAP_SERVERS"]
    assert bootstrap == f"{kafka['metadata']['name']}-kafka-bootstrap:9092"


def test_one_cloudnativepg_cluster_per_service(rendered: dict[str, list[Doc]]) -> None:
    clusters = {c["metadata"]["name"]: c["spec"] for c in of_kind(rendered["overlays/operators"], "Cluster")}
    assert set(clusters) == {f"niuniu-{s}-pg" for s in SERVICES}
    for service in SERVICES:
        initdb = clusters[f"niuniu-{service}-pg"]["bootstrap"]["initdb"]
        assert initdb["database"] == f"niuniu_{service}"


def test_monitoring_scrapes_every_service_and_loads_the_tested_rules(rendered: dict[str, list[Doc]]) -> None:
    docs = rendered["overlays/operators"]
    (monitor,) = of_kind(docs, "ServiceMonitor")
    selected = [s for s in of_kind(docs, "Service") if _selects(monitor["spec"]["selector"], s["metadata"]["labels"])]
    assert sorted(s["metadata"]["name"] for s in selected) == sorted([*SERVICES, "gateway"])
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True
    (rule,) = of_kind(docs, "PrometheusRule")
    tested = yaml.safe_load((ROOT / "deploy" / "observability" / "alerts.rules.yml").read_text())
    assert rule["spec"]["groups"] == tested["groups"]


@pytest.mark.parametrize("where", ALL)
def test_the_gateway_serves_its_metrics_where_the_manifests_say(rendered: dict[str, list[Doc]], where: str) -> None:
    docs = rendered[where]
    config = named(docs, "ConfigMap", "niuniu-gateway")["data"]
    port = metrics_port(config)
    template = named(docs, "Deployment", "niuniu-gateway")["spec"]["template"]
    (container,) = template["spec"]["containers"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"http": 8080, "metrics": port}
    assert template["metadata"]["annotations"]["prometheus.io/port"] == str(port)
    svc = named(docs, "Service", "gateway")
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {"http": 8080, "metrics": port}
    assert svc["metadata"]["labels"]["niuniu.io/metrics"] == "true"


def test_services_run_one_image(rendered: dict[str, list[Doc]]) -> None:
    for where in ALL:
        images = {
            named(rendered[where], "Deployment", f"niuniu-{s}")["spec"]["template"]["spec"]["containers"][0]["image"]
            for s in SERVICES
        }
        assert len(images) == 1, where


@pytest.mark.parametrize("where", ALL)
@pytest.mark.parametrize("service", SERVICES)
def test_a_job_migrates_each_database_with_its_own_dsn(
    rendered: dict[str, list[Doc]], where: str, service: str
) -> None:
    """The services run no DDL: each release's niuniu-migrate Job brings each database to its schema."""
    job = named(rendered[where], "Job", f"niuniu-migrate-{service}")
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts[container["command"][0]] == "tools.migrate:main" and container["command"][1:] == [service]
    assert pod["restartPolicy"] == "Never" and job["spec"]["backoffLimit"] >= 1
    dsn = f"NIUNIU_{service.upper()}_DSN"
    if where.endswith(("operators", "production")):  # straight to the cluster, not through a pooler
        (env,) = container["env"]
        assert env == {"name": dsn, "valueFrom": {"secretKeyRef": {"name": f"niuniu-{service}-pg-app", "key": "uri"}}}
        assert not container.get("envFrom")
    else:
        assert container["envFrom"] == [{"secretRef": {"name": f"niuniu-{service}-db"}}]
        assert dsn in named(rendered[where], "Secret", f"niuniu-{service}-db")["stringData"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
