"""overlays/production watches its stateful tier: every exporter the niuniu-stateful alerts read is
scraped by a PodMonitor, and a NetworkPolicy lets Prometheus reach it on exactly that port.

Pods of the operators (CloudNativePG instances, Strimzi brokers and Kafka exporter) are not in
the render: the test holds the PodMonitors and policies to the labels and ports those operators
give their pods, written out below.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from ops_support import ROOT, render

Doc = dict[str, Any]
MONITORING_NAMESPACE = {"kubernetes.io/metadata.name": "prometheus", "niuniu.io/monitoring": "true"}
OTHER_NAMESPACE = {"kubernetes.io/metadata.name": "frontends"}

# metric prefix of the alerts -> (labels of the pods that export it, their metrics port name, number)
EXPORTERS = {
    "cnpg_": ({"cnpg.io/cluster": "niuniu-wallet-pg", "cnpg.io/podRole": "instance"}, "metrics", 9187),
    "kafka_topic_": (
        {"strimzi.io/cluster": "niuniu", "strimzi.io/kind": "Kafka", "strimzi.io/name": "niuniu-kafka-exporter"},
        "tcp-prometheus",
        9404,
    ),
    "redis_": ({"app.kubernetes.io/name": "redis-exporter"}, "metrics", 9121),
}


@pytest.fixture(scope="module")
def docs() -> list[Doc]:
    return render("overlays/production")


def of_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def selects(selector: Doc, labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In", "this check only understands In"
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


def stateful_metrics() -> set[str]:
    groups = yaml.safe_load((ROOT / "deploy" / "observability" / "alerts.rules.yml").read_text())["groups"]
    (group,) = [g for g in groups if g["name"] == "niuniu-stateful"]
    exprs = " ".join(r["expr"] for r in group["rules"])
    return {word for word in exprs.replace("(", " ").replace("{", " ").split() if word.startswith(tuple(EXPORTERS))}


def admitted(docs: list[Doc], pod: dict[str, str], port: int, namespace: dict[str, str]) -> bool:
    for policy in of_kind(docs, "NetworkPolicy"):
        if not selects(policy["spec"]["podSelector"], pod):
            continue
        for rule in policy["spec"].get("ingress", []):
            ports = [p["port"] for p in rule.get("ports", [])]
            if ports and port not in ports:
                continue
            peers = [peer["namespaceSelector"] for peer in rule["from"] if "namespaceSelector" in peer]
            if any(selects(peer, namespace) for peer in peers):
                return True
    return False


def test_the_stateful_alerts_read_every_exporter() -> None:
    metrics = stateful_metrics()
    assert {prefix for prefix in EXPORTERS if any(m.startswith(prefix) for m in metrics)} == set(EXPORTERS)


@pytest.mark.parametrize("prefix", sorted(EXPORTERS))
def test_a_podmonitor_scrapes_each_exporter_and_prometheus_may_reach_it(docs: list[Doc], prefix: str) -> None:
    pod, port_name, port = EXPORTERS[prefix]
    monitors = [m for m in of_kind(docs, "PodMonitor") if selects(m["spec"]["selector"], pod)]
    assert len(monitors) == 1, prefix
    assert [e["port"] for e in monitors[0]["spec"]["podMetricsEndpoints"]] == [port_name]
    assert admitted(docs, pod, port, MONITORING_NAMESPACE)
    assert not admitted(docs, pod, port, OTHER_NAMESPACE)


def test_postgres_series_carry_their_cluster(docs: list[Doc]) -> None:
    pod = EXPORTERS["cnpg_"][0]
    (monitor,) = [m for m in of_kind(docs, "PodMonitor") if selects(m["spec"]["selector"], pod)]
    pooler = {"cnpg.io/cluster": "niuniu-wallet-pg", "cnpg.io/podRole": "pooler"}
    assert not selects(monitor["spec"]["selector"], pooler)
    (relabel,) = monitor["spec"]["podMetricsEndpoints"][0]["relabelings"]
    assert relabel == {"sourceLabels": ["__meta_kubernetes_pod_label_cnpg_io_cluster"], "targetLabel": "cluster"}


def test_strimzi_runs_the_kafka_exporter_and_broker_metrics(docs: list[Doc]) -> None:
    (kafka,) = of_kind(docs, "Kafka")
    assert kafka["spec"]["kafkaExporter"]["topicRegex"] == "niuniu\\..*"
    assert kafka["spec"]["kafka"]["metricsConfig"]["type"] == "strimziMetricsReporter"


def test_the_redis_exporter_reads_its_own_least_privilege_user(docs: list[Doc]) -> None:
    (deployment,) = [d for d in of_kind(docs, "Deployment") if d["metadata"]["name"] == "redis-exporter"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    secrets = {e["name"]: e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"]}
    assert secrets == {n: "niuniu-redis-exporter" for n in ("REDIS_ADDR", "REDIS_USER", "REDIS_PASSWORD")}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
