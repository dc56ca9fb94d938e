"""Secrets by reference: the production render carries no secret value and overwrites none.

overlays/production drops the base's placeholder Secrets and JWKS (secrets-by-reference.yaml);
the objects a pod reads are either made by an operator in the render (CloudNativePG's app
Secrets, Strimzi's KafkaUser Secrets) or listed in deploy/k8s/README.md ("Production: what
you create") for the operator to create. Applying the render, twice, over a namespace that
holds the real ones leaves them as they were, as kubectl's three-way merge sees it. The
bundled Redis refuses to start on the placeholder password, and the services refuse a
placeholder in any credential.
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from ops_support import ROOT, render, yaml

from backbone.auth import SigningKey, Tokens
from backbone.config import PLACEHOLDER, ConfigError, Settings, refuse_placeholders

Doc = dict[str, Any]
Key = tuple[str, str]  # (kind, name): one namespace
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
PRODUCTION = ROOT / "deploy" / "k8s" / "overlays" / "production"


@pytest.fixture(scope="module")
def docs() -> list[Doc]:
    return render("overlays/production")


def documented() -> dict[Key, set[str]]:
    """What the operator creates (overlays/production/operator-created.yaml): (kind, name) -> its keys."""
    listing = yaml.safe_load((PRODUCTION / "operator-created.yaml").read_text())
    return {(o["kind"], o["name"]): set(o["keys"]) for o in listing}


def readme_table() -> dict[Key, set[str]]:
    readme = (ROOT / "deploy" / "k8s" / "README.md").read_text()
    section = readme.split("### Production: what you create", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| (ConfigMap|Secret) `([^`]+)` \| (.+?) \|", section, re.MULTILINE)
    return {(kind, name): set(re.findall(r"`([A-Za-z_.]+)`", keys)) for kind, name, keys in rows}


def made_by_operators(docs: list[Doc]) -> set[Key]:
    """The Secrets the operators generate for resources in the render: Strimzi's (a KafkaUser's
    password, the cluster CA's public certificate), CloudNativePG's (a Cluster's app credentials
    and CA) and cert-manager's (a Certificate's key pair)."""
    made: set[Key] = set()
    for d in docs:
        name = d["metadata"]["name"]
        made |= {
            "KafkaUser": {("Secret", name)},
            "Kafka": {("Secret", f"{name}-cluster-ca-cert")},
            "Cluster": {("Secret", f"{name}-app"), ("Secret", f"{name}-ca")},
            "Certificate": {("Secret", d.get("spec", {}).get("secretName", ""))},
        }.get(d["kind"], set())
    return made


def pod_spec(doc: Doc) -> Doc | None:
    """The pod a Deployment, a Job or a CronJob runs; None for any other kind."""
    if doc["kind"] in ("Deployment", "Job"):
        return doc["spec"]["template"]["spec"]  # type: ignore[no-any-return]
    if doc["kind"] == "CronJob":
        return doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]  # type: ignore[no-any-return]
    return None


def referenced(docs: list[Doc]) -> dict[Key, set[str]]:
    """Every Secret and ConfigMap a pod of the render (a Deployment's, a Job's, a CronJob's) reads
    -> the keys it reads by name (and the object store's credentials a CloudNativePG Cluster's
    backups read, and its managed roles' password Secrets)."""
    refs: dict[Key, set[str]] = {}
    for d in docs:
        store = d["spec"].get("backup", {}).get("barmanObjectStore", {}) if d["kind"] == "Cluster" else {}
        for ref in store.get("s3Credentials", {}).values():
            refs.setdefault(("Secret", ref["name"]), set()).add(ref["key"])
        if d["kind"] == "Issuer":  # a CA Issuer signs with the key pair of its Secret
            refs[("Secret", d["spec"]["ca"]["secretName"])] = {"tls.crt", "tls.key"}
        for role in d["spec"].get("managed", {}).get("roles", []) if d["kind"] == "Cluster" else []:
            if "passwordSecret" in role:  # a managed role's basic-auth Secret
                refs.setdefault(("Secret", role["passwordSecret"]["name"]), set()).update({"username", "password"})
        pod = pod_spec(d)
        if pod is None:
            continue
        mounts: dict[str, Key] = {}
        for volume in pod.get("volumes", []):
            if "secret" in volume:
                mounts[volume["name"]] = ("Secret", volume["secret"]["secretName"])
            elif "configMap" in volume:
                mounts[volume["name"]] = ("ConfigMap", volume["configMap"]["name"])
        for key in mounts.values():
            refs.setdefault(key, set())
        for container in pod["containers"]:
            for source in container.get("envFrom", []):
                kind, ref = (
                    ("Secret", source["secretRef"]) if "secretRef" in source else ("ConfigMap", source["configMapRef"])
                )
                refs.setdefault((kind, ref["name"]), set())
            paths = {
                m["mountPath"]: mounts[m["name"]] for m in container.get("volumeMounts", []) if m["name"] in mounts
            }
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    refs.setdefault(("Secret", ref["name"]), set()).add(ref["key"])
                # A key file named by a setting (NIUNIU_JWKS_FILE=/etc/niuniu/jwks/jwks.json): its key.
                mounted, _, file = env.get("value", "").rpartition("/")
                if mounted in paths:
                    refs[paths[mounted]].add(file)
    return refs


def test_the_render_holds_no_secret_value_and_no_placeholder(docs: list[Doc]) -> None:
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "Secret"] == []
    assert PLACEHOLDER not in yaml.safe_dump_all(docs)
    assert [
        d["metadata"]["name"] for d in docs if "niuniu.io/placeholder" in d["metadata"].get("annotations", {})
    ] == []


def test_every_object_a_pod_reads_is_rendered_made_by_an_operator_or_documented(docs: list[Doc]) -> None:
    rendered = {(d["kind"], d["metadata"]["name"]) for d in docs}
    external = {k: keys for k, keys in referenced(docs).items() if k not in rendered | made_by_operators(docs)}
    table = documented()
    assert set(external) == set(table), "overlays/production/operator-created.yaml"
    for key, keys in external.items():
        assert keys <= table[key], f"{key}: a pod reads {sorted(keys - table[key])}, not in the README's table"
    # What the operator creates is never in the render (else an apply would overwrite it).
    assert not set(table) & rendered


def test_the_readme_lists_what_the_operator_creates() -> None:
    assert readme_table() == documented()


def apply(namespace: dict[Key, Doc], render: list[Doc]) -> None:
    """``kubectl apply`` of ``render`` over ``namespace``, as its three-way merge computes it.

    A rendered object that is not live is created; one that is live is patched: every field
    of the new configuration set, every field of the last applied one that the new one
    dropped removed (maps merged, lists replaced, as a JSON merge patch does). An object
    absent from the render is not touched (no --prune).
    """
    for doc in render:
        key = (doc["kind"], doc["metadata"]["name"])
        desired = copy.deepcopy(doc)
        desired.setdefault("metadata", {}).setdefault("annotations", {})[LAST_APPLIED] = yaml.safe_dump(doc)
        live = namespace.get(key)
        if live is None:
            namespace[key] = desired
            continue
        last = yaml.safe_load(live["metadata"].get("annotations", {}).get(LAST_APPLIED, "{}"))
        namespace[key] = _merge(live, last, desired)


def _merge(live: Any, last: Any, desired: Any) -> Any:
    if not (isinstance(live, dict) and isinstance(desired, dict)):
        return copy.deepcopy(desired)
    last = last if isinstance(last, dict) else {}
    merged = {k: v for k, v in live.items() if not (k in last and k not in desired)}
    for k, v in desired.items():
        merged[k] = _merge(live.get(k), last.get(k), v) if k in live else copy.deepcopy(v)
    return merged


def real_objects() -> dict[Key, Doc]:
    """What an operator created from the README's table: real values, as a secret manager writes them."""
    objects: dict[Key, Doc] = {}
    for (kind, name), keys in documented().items():
        values = {k: f"real {k} of {name}" for k in keys}
        objects[(kind, name)] = {"apiVersion": "v1", "kind": kind, "metadata": {"name": name}, "data": values}
    return objects


def test_applying_the_render_twice_leaves_the_real_secrets_as_they_were(docs: list[Doc]) -> None:
    namespace = real_objects()
    apply(namespace, docs)
    after_first = copy.deepcopy(namespace)
    apply(namespace, docs)
    assert namespace == after_first, "a second apply changed something"
    for key, real in real_objects().items():
        assert namespace[key] == real, key


def test_a_render_with_the_placeholders_would_overwrite_them() -> None:
    """The check above has teeth: the base still renders placeholders, and applying it clobbers the real keys."""
    namespace = real_objects()
    apply(namespace, render("base"))
    assert namespace[("Secret", "niuniu-redis")]["stringData"]["REDIS_PASSWORD"] == PLACEHOLDER
    assert "REPLACE_ME" in namespace[("Secret", "niuniu-issuer-key")]["stringData"]["issuer.pem"]


def redis_script(overlay: str) -> str:
    (redis,) = [d for d in render(overlay) if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "redis"]
    (container,) = redis["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["sh", "-c"]
    script: str = container["args"][0]
    return script


@pytest.mark.parametrize("password", ["", PLACEHOLDER, f"niuniu:{PLACEHOLDER}"])
def test_redis_does_not_start_on_the_placeholder_password(tmp_path: Path, password: str) -> None:
    started = _run_redis_script(tmp_path, password)
    assert started.returncode == 1
    assert "placeholder" in started.stderr
    assert not (tmp_path / "data" / "users.acl").exists()
    assert not (tmp_path / "started").exists()


def test_redis_starts_on_a_real_password(tmp_path: Path) -> None:
    started = _run_redis_script(tmp_path, "a real one")
    assert started.returncode == 0, started.stderr
    assert (tmp_path / "started").read_text().startswith("--save")
    assert "user niuniu on #" in (tmp_path / "data" / "users.acl").read_text()


def _run_redis_script(tmp_path: Path, password: str) -> subprocess.CompletedProcess[str]:
    """The operators overlay's Redis start script, with /data and redis-server in tmp_path."""
    (tmp_path / "data").mkdir()
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "redis-server"
    fake.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/started\n')
    fake.chmod(0o755)
    script = redis_script("overlays/operators").replace("/data/", f"{tmp_path}/data/")
    env = {"PATH": f"{tmp_path}/bin:{os.environ['PATH']}", "REDIS_PASSWORD": password}
    return subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=10)


@pytest.mark.parametrize(
    "name",
    ["REDIS_URL", "REDIS_PASSWORD", "NIUNIU_TABLE_DSN", "NIUNIU_TABLE_KAFKA_PASSWORD", "KAFKA_SASL_PASSWORD"],
)
def test_a_service_refuses_a_placeholder_credential(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv(name, f"redis://niuniu:{PLACEHOLDER}@redis:6379/0")
    with pytest.raises(ConfigError, match=name) as refused:
        Settings.from_env("table", grpc_port=0, metrics_port=0)
    assert "redis://" not in str(refused.value), "the value is never echoed"


def test_real_credentials_pass() -> None:
    refuse_placeholders({"REDIS_URL": "rediss://niuniu:s3cret@redis:6379/0", "HOME": PLACEHOLDER})


def test_a_placeholder_key_or_jwks_stops_a_service_in_every_mode(tmp_path: Path) -> None:
    (tmp_path / "jwks.json").write_text('{"keys": []}')
    (tmp_path / "key.pem").write_text(PLACEHOLDER)
    env = {"NIUNIU_JWKS_FILE": str(tmp_path / "jwks.json"), "NIUNIU_TABLE_KEY_FILE": str(tmp_path / "key.pem")}
    for mode in ("", "development"):
        with pytest.raises(ConfigError, match=r"NIUNIU_TABLE_KEY_FILE: .* holds the placeholder"):
            Tokens.from_env("table", env={**env, "NIUNIU_ENV": mode})
    (tmp_path / "key.pem").write_bytes(SigningKey.generate("service:table").pem())
    with pytest.raises(ConfigError, match="trusts no key"):
        Tokens.from_env("table", env=env)
