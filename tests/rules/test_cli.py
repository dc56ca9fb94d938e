"""``niuniu-rules``: commands through the registry, JSON shapes, exit codes for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from math import comb
from pathlib import Path

import pytest

from bull import variants
from tools.rules import cli, registry


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_every_variant_of_bull_variants_has_its_adapter() -> None:
    """The CLI's variants are ``bull.variants``': each id finds the adapter of that same variant."""
    assert set(registry.ADAPTERS) == set(variants.VARIANTS)
    for variant_id in variants.VARIANTS:
        assert registry.get(variant_id).variant_id == variant_id
    with pytest.raises(variants.UnknownVariant):
        registry.get("nope")


def test_a_variant_added_without_its_analysis_stops_the_cli() -> None:
    """A game in ``bull.variants`` with no adapter (or an adapter with no game) fails the registry's import."""
    add = "from bull import variants; variants.VARIANTS['new_bull'] = variants.VARIANTS['golden_bull']"
    remove = "from bull import variants; del variants.VARIANTS['bai_buu']"
    for change, message in ((add, "without one ['new_bull']"), (remove, "unknown ['bai_buu']")):
        done = subprocess.run(
            [sys.executable, "-c", f"{change}; import tools.rules.cli"],
            capture_output=True,
            text=True,
            check=False,
            cwd=Path(__file__).resolve().parents[2],
        )
        assert done.returncode != 0 and "LookupError" in done.stderr and message in done.stderr, done.stderr


def test_eval_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "eval", "--variant", "golden_bull", "AS", "AH", "AC", "AD", "2S", "--json")
    data = json.loads(out)
    assert code == 0 and (data["category"], data["points"], data["multiplier"]) == ("five_small", 0, "5")
    code, out, _ = run(capsys, "eval", "--variant", "baibian_bull", "3S 7H KD 5C BJ", "--json")
    assert json.loads(out)["category"] == "bull_bull" and json.loads(out)["multiplier"] == "10"


def test_eval_text_and_settings(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "table.toml"
    config.write_text('[enabled]\nfive_small = false\n[multipliers]\nbomb = "4.5"\n', encoding="utf-8")
    code, out, _ = run(capsys, "eval", "--variant", "golden_bull", "--config", str(config), "AS AH AC AD 2S")
    assert code == 0 and "bomb" in out and "x9/2" in out
    code, out, _ = run(
        capsys,
        "eval",
        "--variant",
        "golden_bull",
        "--config",
        str(config),
        "--set",
        "enabled.bomb=false",
        "AS AH AC AD 2S",
        "--json",
    )
    assert json.loads(out)["category"] == "no_bull"


def test_compare(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "compare",
        "--variant",
        "golden_bull",
        "KS",
        "KH",
        "KD",
        "KC",
        "QS",
        "--",
        "AS",
        "AH",
        "AC",
        "AD",
        "2S",
        "--json",
    )
    data = json.loads(out)
    assert code == 0 and data["winner"] == "b" and "five_small" in data["reason"]
    code, out, _ = run(
        capsys,
        "compare",
        "--variant",
        "golden_bull",
        "--set",
        "suit_tiebreak=false",
        "KS 2S 8H 5C 4C",
        "--",
        "KH 3H 7D 6D 3C",
    )
    assert code == 0 and out.startswith("tie") and "exact_tie=dealer" in out
    code, out, _ = run(capsys, "compare", "--variant", "baibian_bull", "3S 7H KD 5C BJ", "--", "3H 7D KC 5S SJ")
    assert code == 0 and out.startswith("A wins") and "big joker" in out


def test_compare_takes_options_after_the_second_hand(capsys: pytest.CaptureFixture[str]) -> None:
    """``--set key=value`` (and ``--config FILE``) may follow the second hand."""
    hands = ("5S 5H 5C 5D KS", "--", "QS QH QC QD AS")
    code, out, _ = run(capsys, "compare", "--variant", "golden_bull", *hands, "--json")
    assert code == 0 and json.loads(out)["winner"] == "b"  # rank of the four
    code, out, _ = run(capsys, "compare", "--variant", "golden_bull", *hands, "--set", "bomb_order=general", "--json")
    assert code == 0 and json.loads(out)["winner"] == "a"  # bull points 10 vs 1
    code, out, _ = run(capsys, "compare", "--variant", "baibian_bull", "2S 2H 2C 2D KS", "--", "QS QH QC QD 3S")
    assert code == 0 and out.startswith("A wins")
    code, out, _ = run(
        capsys, "compare", "--variant", "baibian_bull", "2S 2H 2C 2D KS", "--", "QS QH QC QD 3S",
        "--set", "bomb_order=rank_of_four",
    )  # fmt: skip
    assert code == 0 and out.startswith("B wins") and "rank of the four" in out


@pytest.mark.parametrize(
    ("variant", "hand_a", "hand_b"),
    [
        ("golden_bull", "5S 5H 5C 5D KS", "QS QH QC QD KS"),
        ("baibian_bull", "2S 2H 2C 2D BJ", "QS QH QC QD BJ"),
        ("bai_buu", "2S 2H 2C 2D", "2S QH QC QD"),
    ],
)
def test_compare_refuses_a_card_in_both_hands(
    capsys: pytest.CaptureFixture[str], variant: str, hand_a: str, hand_b: str
) -> None:
    """two hands come from one deck."""
    code, out, err = run(capsys, "compare", "--variant", variant, hand_a, "--", hand_b)
    assert code == 2 and out == "" and "duplicate card" in err


def test_census_json(capsys: pytest.CaptureFixture[str]) -> None:
    for variant, total in (("golden_bull", comb(52, 5)), ("baibian_bull", comb(54, 5))):
        code, out, _ = run(capsys, "census", "--variant", variant, "--json")
        data = json.loads(out)
        assert code == 0 and data["total"] == total == sum(data["counts"].values())
        assert data["seconds"] >= 0


def test_rtp_exact_and_monte_carlo(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "rtp", "--variant", "golden_bull", "--json")
    data = json.loads(out)
    assert code == 0 and data["method"] == "exact" and data["rtp_fraction"] == "1"
    code, out, err = run(
        capsys, "rtp", "--variant", "baibian_bull", "--rounds", "50000", "--seed", "3", "--json", "--progress"
    )
    data = json.loads(out)
    assert code == 0 and data["method"] == "monte_carlo" and data["rounds"] == 50_000
    assert data["ci95"][0] < data["rtp"] < data["ci95"][1] and "100%" in err
    _, again, _ = run(capsys, "rtp", "--variant", "baibian_bull", "--rounds", "50000", "--seed", "3", "--json")
    assert json.loads(again)["rtp"] == data["rtp"]


def test_report_writes_markdown(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("bull.analysis.report.BAIBIAN_MC_ROUNDS", 20_000)
    target = tmp_path / "math" / "baibian.md"
    code, out, _ = run(capsys, "report", "--variant", "baibian_bull", "--out", str(target))
    text = target.read_text(encoding="utf-8")
    assert code == 0 and "wrote" in out and "3,162,510" in text and "95% CI" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["eval", "--variant", "golden_bull", "AS", "AH", "AC", "AD", "XX"], "not a card: 'XX'"),
        (["eval", "--variant", "golden_bull", "AS", "AH", "AC", "AD"], "5 cards"),
        (["eval", "--variant", "golden_bull", "AS", "AH", "AC", "AD", "BJ"], "joker"),
        (["eval", "--variant", "golden_bull", "--set", "bogus=1", "AS AH AC AD 2S"], "'bogus'"),
        (["eval", "--variant", "golden_bull", "--set", "multipliers.bomb=x", "AS AH AC AD 2S"], "multipliers.bomb"),
        (["eval", "--variant", "golden_bull", "--set", "novalue", "AS AH AC AD 2S"], "key=value"),
        (
            ["eval", "--variant", "golden_bull", "--config", "/nonexistent.toml", "AS AH AC AD 2S"],
            "config file '/nonexistent.toml': cannot read it",
        ),
        (["eval", "--variant", "golden_bull", "--set", "multipliers.bomb=1e400", "AS AH AC AD 2S"], "not '1e400'"),
        (["eval", "--variant", "red_envelope_bull", "1e400"], "not an amount: '1e400'"),
        (["eval", "--variant", "red_envelope_bull", "1e3"], "not an amount: '1e3'"),
        (["eval", "--variant", "nope", "AS"], "variant must be one of bai_buu, baibian_bull, golden_bull"),
        (["compare", "--variant", "golden_bull", "AS", "AH"], "HAND_A -- HAND_B"),
        (["rtp", "--variant", "golden_bull", "--rounds", "0"], "positive"),
    ],
)
def test_input_errors_exit_2_with_a_message(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and message in err and "Traceback" not in err
    assert "config key '/" not in err and "0" * 50 not in err  # a file is no key; no 401-digit echo


def test_baibian_rank_of_four_queens_beat_twos(capsys: pytest.CaptureFixture[str]) -> None:
    """Banker QQQQ3 against Heaven 2222K: the table's ``bomb_order`` decides, as the table settles it."""
    hands = ["QS", "QH", "QC", "QD", "3S", "--", "2S", "2H", "2C", "2D", "KS", "--json"]
    code, out, _ = run(capsys, "compare", "--variant", "baibian_bull", "--set", "bomb_order=rank_of_four", *hands)
    assert code == 0 and json.loads(out)["winner"] == "a"
    assert json.loads(out)["reason"] == "rank of the four (bomb_order=rank_of_four)"
    code, out, _ = run(capsys, "compare", "--variant", "baibian_bull", *hands)
    assert code == 0 and json.loads(out)["winner"] == "b"  # the default: the highest card, Heaven's king


def test_console_entry_point_has_no_traceback() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tools.rules.cli", "eval", "--variant", "golden_bull", "ZZ"],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 2 and "not a card" in done.stderr and "Traceback" not in done.stderr
