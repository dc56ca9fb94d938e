"""The static check that every variable a service reads is set by its manifests (deploy/k8s/check_env.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = str(ROOT / ".venv" / "bin" / "kubectl")


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_env", ROOT / "deploy" / "k8s" / "check_env.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_env"] = module
    spec.loader.exec_module(module)
    return module


check_env = _load()


def test_the_table_reads_where_the_rng_and_the_wallet_are() -> None:
    read = check_env.variables_read(check_env.imported_modules("services.table.server"), "table")
    assert {"NIUNIU_RNG_ADDR", "NIUNIU_WALLET_ADDR", "NIUNIU_TABLE_GRPC_PORT", "KAFKA_BOOTSTRAP_SERVERS"} <= read


def _complete(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rendered overlay plus one ConfigMap with whatever it still lacks, so the check passes."""
    extra: dict[str, str] = {}
    for _, container in check_env.deployments(docs):
        service = container["command"][0].removeprefix("niuniu-")
        read = check_env.variables_read(check_env.imported_modules(f"services.{service}.server"), service)
        extra |= {v: "x" for v in read - check_env.variables_set(container, docs)}
    docs = [*docs, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "test-extra"}, "data": extra}]
    for _, container in check_env.deployments(docs):
        container.setdefault("envFrom", []).append({"configMapRef": {"name": "test-extra"}})
    return docs


@pytest.mark.skipif(not Path(KUBECTL).exists(), reason="kubectl comes with scripts/check-deploy tools")
def test_a_variable_removed_from_the_manifests_fails_the_check(tmp_path: Path) -> None:
    docs = _complete(check_env.render(ROOT / "deploy" / "k8s" / "overlays" / "local", KUBECTL))
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(yaml.safe_dump_all(docs))
    assert check_env.check(rendered, KUBECTL) == []

    for doc in docs:
        if doc.get("kind") == "ConfigMap" and doc["metadata"]["name"] == "niuniu-common":
            del doc["data"]["NIUNIU_WALLET_ADDR"]
    rendered.write_text(yaml.safe_dump_all(docs))
    gaps = check_env.check(rendered, KUBECTL)
    # The table and the browser gateway call the wallet: both would dial 127.0.0.1.
    assert sorted((g.deployment, g.variable) for g in gaps) == [
        ("niuniu-gateway", "NIUNIU_WALLET_ADDR"),
        ("niuniu-table", "NIUNIU_WALLET_ADDR"),
    ]
    assert check_env.main(["--kubectl", KUBECTL, str(rendered)]) == 1


@pytest.mark.skipif(not Path(KUBECTL).exists(), reason="kubectl comes with scripts/check-deploy tools")
@pytest.mark.parametrize("overlay", sorted(p.name for p in check_env.OVERLAYS.iterdir() if p.is_dir()))
def test_every_real_overlay_sets_what_the_services_read(overlay: str) -> None:
    gaps = check_env.check(check_env.OVERLAYS / overlay, KUBECTL)
    assert gaps == [], [f"{g.deployment}: {g.variable}" for g in gaps]


@pytest.mark.skipif(not Path(KUBECTL).exists(), reason="kubectl comes with scripts/check-deploy tools")
def test_key_files_may_be_unset_only_in_development_mode(tmp_path: Path) -> None:
    """overlays/local leaves the key files unset because it runs in development mode; without it, that is a gap."""
    docs = check_env.render(ROOT / "deploy" / "k8s" / "overlays" / "local", KUBECTL)
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(yaml.safe_dump_all(docs))
    assert check_env.check(rendered, KUBECTL) == []

    for doc in docs:
        if doc.get("kind") == "ConfigMap" and doc["metadata"]["name"] == "niuniu-common":
            assert doc["data"].pop("NIUNIU_ENV") == "development"
    rendered.write_text(yaml.safe_dump_all(docs))
    gaps = {(g.deployment, g.variable) for g in check_env.check(rendered, KUBECTL)}
    assert gaps == {
        *((f"niuniu-{s}", "NIUNIU_JWKS_FILE") for s in check_env.SERVICES),
        *((f"niuniu-{s}", f"NIUNIU_{s.upper()}_KEY_FILE") for s in check_env.SERVICES),
        ("niuniu-wallet", "NIUNIU_ISSUER_KEY_FILE"),
    }
