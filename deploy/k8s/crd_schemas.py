"""Validate custom resources against their CRDs' openAPIV3Schema, kubeconform-style.

kubernetes-validate knows the built-in kinds only; the operators' kinds (Strimzi,
CloudNativePG, Prometheus Operator) pass it unchecked. This checks them against the
schemas in deploy/k8s/schemas/ (``<group>_<version>_<kind>.json``: the CRD's
openAPIV3Schema for that version with the descriptions dropped; sources and licences in
deploy/k8s/schemas/README.md). As ``kubeconform -strict``: an object that lists its
properties admits no others (unless the CRD says ``x-kubernetes-preserve-unknown-fields``
or gives ``additionalProperties``), so a misspelt field fails instead of being pruned.

    python deploy/k8s/crd_schemas.py check [--kubectl PATH] OVERLAY_OR_RENDERED_YAML ...
    python deploy/k8s/crd_schemas.py extract CRD_YAML VERSION    (writes the schema file)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "deploy" / "k8s" / "schemas"
DROPPED = ("description",)


def schema_file(api_version: str, kind: str) -> Path:
    group, _, version = api_version.rpartition("/")
    return SCHEMAS / f"{group}_{version}_{kind.lower()}.json"


def _strip(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip(v) for k, v in node.items() if k not in DROPPED}
    if isinstance(node, list):
        return [_strip(v) for v in node]
    return node


def extract(crd_path: Path, version: str) -> Path:
    crd = yaml.safe_load(crd_path.read_text())
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    out = schema_file(f"{crd['spec']['group']}/{version}", crd["spec"]["names"]["kind"])
    schema = _strip(served["schema"]["openAPIV3Schema"])
    out.write_text(json.dumps(schema, sort_keys=True, separators=(",", ":")) + "\n")
    return out


def strict(node: Any) -> Any:
    """The OpenAPI schema as JSON Schema: closed objects, nullable, int-or-string."""
    if isinstance(node, list):
        return [strict(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: strict(v) for k, v in node.items() if not k.startswith("x-kubernetes-") and k != "nullable"}
    if (
        "properties" in node
        and "additionalProperties" not in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"] if isinstance(out["type"], str) else [*out["type"], "null"]
    return out


def known_kinds() -> set[tuple[str, str]]:
    kinds = set()
    for path in SCHEMAS.glob("*.json"):
        group, version, kind = path.stem.rsplit("_", 2)
        kinds.add((f"{group}/{version}", kind))
    return kinds


def errors(doc: dict[str, Any]) -> list[str]:
    """Every schema violation of one custom resource (metadata is the API server's: not checked here)."""
    path = schema_file(doc["apiVersion"], doc["kind"])
    schema = strict(json.loads(path.read_text()))
    schema.setdefault("properties", {})["metadata"] = {"type": "object"}
    validator = jsonschema.Draft7Validator(schema)
    name = f"{doc['kind']}/{doc.get('metadata', {}).get('name', '?')}"
    return [
        f"{name}: {'.'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"
        for e in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))
    ]


def custom_resources(docs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The documents whose group is not a built-in one (a dot in the group, not *.k8s.io)."""
    found = []
    for doc in docs:
        group = doc.get("apiVersion", "").rpartition("/")[0]
        if "." in group and not group.endswith(".k8s.io"):
            found.append(doc)
    return found


def check(docs: list[dict[str, Any]]) -> list[str]:
    """Schema errors of every custom resource; one with no schema shipped is an error too."""
    kinds = known_kinds()
    problems: list[str] = []
    for doc in custom_resources(docs):
        if (doc["apiVersion"], doc["kind"].lower()) not in kinds:
            problems.append(f"{doc['kind']}/{doc['metadata']['name']}: no schema for {doc['apiVersion']} {doc['kind']}")
        else:
            problems.extend(errors(doc))
    return problems


def load(target: str, kubectl: str) -> list[dict[str, Any]]:
    path = Path(target)
    if path.is_dir():
        text = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, check=True).stdout
    else:
        text = path.read_text()
    return [d for d in yaml.safe_load_all(text) if d]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="crd_schemas.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    chk = sub.add_parser("check")
    chk.add_argument("--kubectl", default=str(ROOT / ".venv" / "bin" / "kubectl"))
    chk.add_argument("targets", nargs="+")
    ext = sub.add_parser("extract")
    ext.add_argument("crd", type=Path)
    ext.add_argument("version")
    args = parser.parse_args(argv)
    if args.command == "extract":
        print(extract(args.crd, args.version).relative_to(ROOT))
        return 0
    bad = 0
    for target in args.targets:
        docs = load(target, args.kubectl)
        problems = check(docs)
        for problem in problems:
            print(f"crd-schemas: {target}: {problem}", file=sys.stderr)
        bad += len(problems)
        if not problems:
            print(f"crd-schemas: {target}: {len(custom_resources(docs))} custom resources valid")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
