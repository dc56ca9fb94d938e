"""What an operator relies on in the renders: services declared once, reflection off in
production, dashboards for Grafana's sidecar, restarts on a Secret change, the daily audit,
and the README's NetworkPolicy table matching the policies."""

from __future__ import annotations

import re
import tomllib
from typing import Any

import pytest
from ops_support import ROOT, SERVICES, kubectl, render, yaml

kubectl()

Doc = dict[str, Any]
WHERE = ("base", "local", "operators", "production")
DASHBOARDS = sorted((ROOT / "deploy" / "observability" / "dashboards").glob("*.json"))
SERVICE_DIRS = ROOT / "deploy" / "k8s" / "base" / "services"


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Doc]]:
    return {w: render(w if w == "base" else f"overlays/{w}") for w in WHERE}


def of_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def named(docs: list[Doc], kind: str, name: str) -> Doc:
    (found,) = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name]
    return found


def test_a_service_is_declared_once() -> None:
    """The workload objects live in the template only; a service's directory holds its values
    and what differs by key."""
    template = (SERVICE_DIRS / "template" / "service.yaml").read_text()
    for kind in ("Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler", "ServiceAccount"):
        assert f"\nkind: {kind}\n" in template, kind
    for service in SERVICES:
        text = "".join(p.read_text() for p in (SERVICE_DIRS / service).glob("*.yaml"))
        kinds = re.findall(r"^kind: (\w+)$", text, re.M)
        assert set(kinds) <= {"Kustomization", "ServiceValues", "ConfigMap", "Secret", "Deployment"}, service
        # Only the wallet patches its Deployment (the issuer key).
        assert ("Deployment" in kinds) == (service == "wallet"), service
    assert not list((ROOT / "deploy" / "k8s" / "base").glob("rng.yaml"))


def test_reflection_is_off_in_production(rendered: dict[str, list[Doc]]) -> None:
    docs = rendered["production"]
    assert named(docs, "ConfigMap", "niuniu-common")["data"]["NIUNIU_GRPC_REFLECTION"] == "0"
    for service in SERVICES:
        (container,) = named(docs, "Deployment", f"niuniu-{service}")["spec"]["template"]["spec"]["containers"]
        assert {"configMapRef": {"name": "niuniu-common"}} in container["envFrom"], service
        assert "NIUNIU_GRPC_REFLECTION" not in {e["name"] for e in container.get("env", [])}, service


@pytest.mark.parametrize("where", ["operators", "production"])
def test_every_dashboard_is_a_configmap_for_grafanas_sidecar(rendered: dict[str, list[Doc]], where: str) -> None:
    assert DASHBOARDS
    shipped: dict[str, str] = {}
    for config in of_kind(rendered[where], "ConfigMap"):
        if config["metadata"].get("labels", {}).get("grafana_dashboard") == "1":
            assert not set(config["data"]) & set(shipped), "one ConfigMap per dashboard"
            shipped.update(config["data"])
    assert shipped == {path.name: path.read_text() for path in DASHBOARDS}


@pytest.mark.parametrize("where", WHERE)
def test_every_workload_restarts_on_a_secret_change(rendered: dict[str, list[Doc]], where: str) -> None:
    # overlays/local's single-node Kafka and PostgreSQL are development fixtures: not watched.
    workloads = of_kind(rendered[where], "Deployment") + [
        s for s in of_kind(rendered[where], "StatefulSet") if s["metadata"]["name"] not in ("kafka", "postgres")
    ]
    assert len(of_kind(rendered[where], "Deployment")) >= len(SERVICES) + 1
    for workload in workloads:
        annotations = workload["metadata"].get("annotations", {})
        assert annotations.get("reloader.stakater.com/auto") == "true", workload["metadata"]["name"]
    readme = (ROOT / "deploy" / "k8s" / "README.md").read_text()
    assert "reloader.stakater.com/auto" in readme and "Reloader" in readme


def _selects(selector: dict[str, str] | None, labels: dict[str, str]) -> bool:
    return selector is not None and all(labels.get(k) == v for k, v in selector.items())


def _admits(policy: Doc, labels: dict[str, str]) -> bool:
    """Whether one of the policy's ingress rules admits a pod of this namespace with these labels."""
    for rule in policy["spec"].get("ingress", []):
        for peer in rule.get("from", []):
            if "namespaceSelector" not in peer and _selects(peer.get("podSelector", {}).get("matchLabels"), labels):
                return True
    return False


def test_the_auditor_runs_daily_with_its_own_identity_and_reach(rendered: dict[str, list[Doc]]) -> None:
    docs = rendered["production"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    (cron,) = of_kind(docs, "CronJob")
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    assert len(cron["spec"]["schedule"].split()) == 5 and cron["spec"]["schedule"].split()[2:] == ["*", "*", "*"]
    pod_template = cron["spec"]["jobTemplate"]["spec"]["template"]
    pod, labels = pod_template["spec"], pod_template["metadata"]["labels"]
    (container,) = pod["containers"]
    assert container["command"][:2] == ["niuniu-audit", "replay"] and "niuniu-audit" in scripts
    account = named(docs, "ServiceAccount", pod["serviceAccountName"])
    assert account["metadata"]["name"] == "niuniu-auditor" and account["automountServiceAccountToken"] is False
    assert pod["automountServiceAccountToken"] is False
    env = {e["name"]: e for e in container["env"]}
    assert env["NIUNIU_AUDITOR_KAFKA_USER"]["value"] == "niuniu-auditor"
    password = env["NIUNIU_AUDITOR_KAFKA_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert password == {"name": "niuniu-auditor", "key": "password"}
    assert "niuniu-auditor" in {u["metadata"]["name"] for u in of_kind(docs, "KafkaUser")}
    assert env["NIUNIU_AUDITOR_DB_USER"]["valueFrom"]["secretKeyRef"]["name"] == "niuniu-auditor-pg"
    assert "host=niuniu-ledger-pg-rw " in env["NIUNIU_AUDITOR_DSN"]["value"]
    assert "sslmode=verify-full" in env["NIUNIU_AUDITOR_DSN"]["value"]
    roles = {
        c["metadata"]["name"]: [r["name"] for r in c["spec"].get("managed", {}).get("roles", [])]
        for c in of_kind(docs, "Cluster")
    }
    assert {name for name, names in roles.items() if "niuniu_auditor" in names} == {"niuniu-ledger-pg"}
    policies = of_kind(docs, "NetworkPolicy")
    # In: only the ledger's database admits it, and no service does.
    reached = {
        p["spec"]["podSelector"].get("matchLabels", {}).get("cnpg.io/cluster", p["metadata"]["name"])
        for p in policies
        if _admits(p, labels)
    }
    assert reached == {"niuniu-ledger-pg"}
    # Out: its egress names the ledger's database, Kafka and DNS, nothing else.
    (egress,) = [p for p in policies if _selects(p["spec"]["podSelector"].get("matchLabels"), labels)]
    assert egress["spec"]["policyTypes"] == ["Egress"]
    peers = [peer for rule in egress["spec"]["egress"] for peer in rule["to"]]
    targets = [peer.get("podSelector", {}).get("matchLabels") for peer in peers]
    assert targets == [
        {"cnpg.io/cluster": "niuniu-ledger-pg"},
        {"strimzi.io/cluster": "niuniu", "strimzi.io/kind": "Kafka"},
        {"k8s-app": "kube-dns"},
    ]


# The README's NetworkPolicy table -------------------------------------------------------------

Row = tuple[str, str, str, str]  # name, direction, pods, allowed


def _labels(selector: dict[str, str] | None) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted((selector or {}).items()))


def _peer(peer: Doc) -> str:
    parts = []
    if "namespaceSelector" in peer:
        parts.append(f"namespaces `{_labels(peer['namespaceSelector'].get('matchLabels'))}`")
    if "podSelector" in peer:
        parts.append(f"pods `{_labels(peer['podSelector'].get('matchLabels'))}`")
    return " ".join(parts)


def _port(port: Doc) -> str:
    protocol = port.get("protocol", "TCP")
    return str(port["port"]) + ("" if protocol == "TCP" else f"/{protocol}")


def described(policy: Doc) -> Row:
    """A rendered NetworkPolicy the way the README's table writes it."""
    spec = policy["spec"]
    out = spec.get("policyTypes") == ["Egress"]
    rules = [
        " or ".join(_peer(p) for p in rule.get("to" if out else "from", []))
        + " on "
        + ", ".join(_port(p) for p in rule.get("ports", []))
        for rule in spec.get("egress" if out else "ingress", [])
    ]
    pods = spec["podSelector"].get("matchLabels")
    return (
        policy["metadata"]["name"],
        "out" if out else "in",
        f"`{_labels(pods)}`" if pods else "every pod",
        "; ".join(rules) or "nothing",
    )


def readme_policies() -> dict[str, set[Row]]:
    """The README's table: overlay -> its rows, `<service>` rows once per service."""
    readme = (ROOT / "deploy" / "k8s" / "README.md").read_text()
    section = readme.split("## Network policies", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| ([a-z, ]+) \| (in|out) \| (.+?) \| (.+?) \|$", section, re.M)
    assert len(rows) > 10, "the table's rows"
    table: dict[str, set[Row]] = {w: set() for w in WHERE}
    for name, where, direction, pods, allowed in rows:
        overlays = WHERE if where == "base" else tuple(w.strip() for w in where.split(","))
        for service in SERVICES if "<service>" in name else ("",):
            row = tuple(cell.replace("<service>", service) for cell in (name, direction, pods, allowed))
            for overlay in overlays:
                table[overlay].add(row)
    return table


@pytest.mark.parametrize("where", WHERE)
def test_the_readmes_network_policy_table_is_the_render(rendered: dict[str, list[Doc]], where: str) -> None:
    table = readme_policies()[where]
    actual = {described(p) for p in of_kind(rendered[where], "NetworkPolicy")}
    assert sorted(actual - table) == [], "rendered but not in deploy/k8s/README.md's table"
    assert sorted(table - actual) == [], "in deploy/k8s/README.md's table but not rendered"


def test_the_table_parser_sees_a_drift() -> None:
    """A policy whose port changed no longer matches its row."""
    policy = yaml.safe_load(
        "metadata: {name: rng-grpc-from-table}\n"
        "spec: {podSelector: {matchLabels: {app.kubernetes.io/name: rng}}, policyTypes: [Ingress],\n"
        "  ingress: [{from: [{podSelector: {matchLabels: {app.kubernetes.io/name: table}}}], ports: [{port: 50051}]}]}"
    )
    assert described(policy) in readme_policies()["base"]
    policy["spec"]["ingress"][0]["ports"][0]["port"] = 50052
    assert described(policy) not in readme_policies()["base"]
