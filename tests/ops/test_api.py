"""Protos: buf lint, no breaking change against the released contracts (protos/baseline/),
and the API reference is current."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from ops_support import ROOT, buf, run_check_deploy

BASELINE = ROOT / "protos" / "baseline" / "niuniu.binpb"


def test_buf_lint() -> None:
    done = subprocess.run([buf(), "lint"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_no_breaking_change_against_the_released_contracts() -> None:
    buf()
    done = run_check_deploy("protos")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"ok: buf breaking against {BASELINE.relative_to(ROOT)}" in done.stdout, done.stdout + done.stderr
    assert "SKIP" not in done.stdout + done.stderr


def released_messages() -> list[tuple[str, descriptor_pb2.DescriptorProto]]:
    """(proto file, message) for every top-level message of ours in the baseline image."""
    image = descriptor_pb2.FileDescriptorSet.FromString(BASELINE.read_bytes())
    return [(f.name, m) for f in image.file if f.name.startswith("niuniu/") for m in f.message_type]


def a_released_field() -> tuple[str, str, descriptor_pb2.FieldDescriptorProto]:
    """(proto file, message, field): a released scalar field declared on one line of its message."""
    for name, message in released_messages():
        text = (ROOT / "protos" / name).read_text()
        for field in message.field:
            if field.type != descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE and field_span(text, message.name, field):
                return name, message.name, field
    raise AssertionError("no released scalar field found in the baseline")


def field_span(text: str, message: str, field: descriptor_pb2.FieldDescriptorProto) -> re.Match[str] | None:
    """The line declaring ``field`` inside ``message { ... }`` (a top-level message), if it is one line."""
    opening = re.search(rf"^message {message} {{$", text, re.MULTILINE)
    if opening is None:
        return None
    closing = text.index("\n}", opening.end())
    declaration = re.compile(rf"^(\s+)((?:repeated |optional )?\w+) {field.name} = {field.number};$", re.MULTILINE)
    return declaration.search(text, opening.end(), closing)


@pytest.fixture
def contracts_copy(tmp_path: Path) -> Path:
    """scripts/check-deploy, buf.yaml and protos/ (with the baseline) in a scratch tree using our .venv."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "check-deploy", tmp_path / "scripts" / "check-deploy")
    shutil.copy(ROOT / "buf.yaml", tmp_path / "buf.yaml")
    shutil.copytree(ROOT / "protos", tmp_path / "protos")
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    return tmp_path


def check_protos(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NIUNIU_CHECK_DEPLOY_NO_INSTALL": "1"}
    return subprocess.run(
        [str(tree / "scripts" / "check-deploy"), "protos"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def edit_field(tree: Path, change: str) -> tuple[str, str, str]:
    """Remove, renumber or rename a released field in the copy; (file, message, field) changed."""
    name, message, field = a_released_field()
    path = tree / "protos" / name
    text = path.read_text()
    line = field_span(text, message, field)
    assert line is not None
    indent, type_ = line.group(1), line.group(2)
    replacement = {
        "remove": "",
        "renumber": f"{indent}{type_} {field.name} = 9999;",
        "rename": f"{indent}{type_} {field.name}_renamed = {field.number};",
    }[change]
    path.write_text(text[: line.start()] + replacement + text[line.end() :])
    return name, message, field.name


def test_the_untouched_copy_passes_the_breaking_check(contracts_copy: Path) -> None:
    done = check_protos(contracts_copy)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok: buf breaking against protos/baseline/niuniu.binpb" in done.stdout


def test_an_added_field_is_not_breaking(contracts_copy: Path) -> None:
    name, message = released_messages()[0]
    path = contracts_copy / "protos" / name
    opening = re.compile(rf"^message {message.name} {{$", re.MULTILINE)
    text, count = opening.subn(f"message {message.name} {{\n  string added_by_a_test = 9999;", path.read_text(), 1)
    assert count == 1
    path.write_text(text)
    done = check_protos(contracts_copy)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("change", "reported"),
    [("remove", "was deleted"), ("renumber", "was deleted"), ("rename", "changed name")],
)
def test_a_breaking_change_to_a_released_field_fails(contracts_copy: Path, change: str, reported: str) -> None:
    name, message, _ = edit_field(contracts_copy, change)
    done = check_protos(contracts_copy)
    assert done.returncode != 0, done.stdout + done.stderr
    assert "FAIL: buf breaking against protos/baseline/niuniu.binpb" in done.stderr, done.stderr
    assert name in done.stderr and f'"{message}"' in done.stderr and reported in done.stderr, done.stderr


def test_without_its_baseline_the_breaking_check_fails(contracts_copy: Path) -> None:
    (contracts_copy / "protos" / "baseline" / "niuniu.binpb").unlink()
    done = check_protos(contracts_copy)
    assert done.returncode != 0
    assert "no baseline protos/baseline/niuniu.binpb" in done.stderr


def test_api_reference_matches_the_protos() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "apidocs.py"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, f"run scripts/gen-api-docs\n{done.stderr}"


def test_api_reference_covers_every_service() -> None:
    index = (ROOT / "docs" / "api" / "README.md").read_text()
    for proto in sorted((ROOT / "protos").rglob("*.proto")):
        assert f"`{proto.relative_to(ROOT / 'protos')}`" in index
        for line in proto.read_text().splitlines():
            if line.startswith("service "):
                assert f"[{line.split()[1]}]" in index
