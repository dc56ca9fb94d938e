"""The niuniu-verify command line: output, checks and exit status."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bull import fairness as fair
from tools.verify import EXIT_BAD_INPUT, EXIT_CHECK_FAILED, EXIT_OK, main

ROOT = Path(__file__).resolve().parents[2]
SEED_A = bytes(range(32)).hex()
COMMIT_A = "630dcd2966c4336691125448bbb25b4ff412a49c732db2c8abc1b8581bd710dd"
D1_TOP = "4C QD AS 5C 7D TH QC 7S 8C AH"
BASE = ["--commitment", COMMIT_A, "--seed", SEED_A, "--round", "round-0001"]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main([*BASE, *args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_everything_matches_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(
        capsys,
        *("--deck", "52", "--dealt", D1_TOP),
        *("--envelope", "1000:5:1", "--split", "361,79,186,260,114", "--grab-order", "0, 4, 2, 1, 3"),
    )
    assert status == EXIT_OK
    assert "deck (52)    4C QD AS 5C 7D TH" in out
    assert "amounts    361 79 186 260 114" in out
    assert "received   361 260 186 114 79" in out
    for name in ("commitment", "deck", "split", "grab_order"):
        assert f"ok    {name}" in out
    assert out.rstrip().endswith("result: PASS")


def test_commitment_only_prints_the_check(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys)
    assert status == EXIT_OK
    assert "ok    commitment" in out
    assert "deck" not in out


def test_tampered_deck_exits_1_with_reason(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "--deck", "52", "--dealt", "4C QD AS 7D 5C")
    assert status == EXIT_CHECK_FAILED
    assert "FAIL  deck        position 3: the table dealt 7D but the seed gives 5C" in out
    assert "result: FAIL (1 of 2 checks failed)" in out


def test_duplicate_dealt_card_is_a_failed_check_not_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "--deck", "52", "--dealt", "4C QD 4C")
    assert status == EXIT_CHECK_FAILED
    assert "position 2: the table dealt 4C but the seed gives AS" in out


def test_tampered_split_exits_1_with_reason(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "--envelope", "1000:5:1", "--split", "361,79,186,261,113")
    assert status == EXIT_CHECK_FAILED
    assert "FAIL  split       share 3: the table recorded 261 but the seed gives 260" in out


def test_tampered_seed_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    other = "01" + SEED_A[2:]
    status = main(["--commitment", COMMIT_A, "--seed", other, "--round", "round-0001", "--deck", "52"])
    out = capsys.readouterr().out
    assert status == EXIT_CHECK_FAILED
    assert f"FAIL  commitment  SHA-256(seed) = {fair.commit(bytes.fromhex(other))}" in out


def test_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(
        capsys, "--client-seed", "lucky7", "--deck", "54", "--envelope", "10000:12:1", "--split", "1,2", "--json"
    )
    result = json.loads(out)
    assert status == EXIT_CHECK_FAILED
    assert result["ok"] is False
    assert result["client_seed"] == "lucky7"
    assert result["deck"][:3] == ["4H", "3C", "9S"]
    assert len(result["deck"]) == 54
    assert result["split"]["amounts"][:3] == [764, 1002, 511]
    assert result["split"]["grab_order"][:3] == [9, 8, 6]
    assert [(c["name"], c["ok"]) for c in result["checks"]] == [("commitment", True), ("split", False)]
    assert "recorded 2 values but the seed gives 12" in result["checks"][1]["detail"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seed", "abc"], "server seed must be hex"),
        (["--seed", SEED_A + "00"], "exactly 32 bytes, got 33"),
        (["--commitment", "xyz"], "commitment must be 64 hex digits"),
        (["--dealt", "AS KS"], "--dealt needs --deck 52|54"),
        (["--deck", "52", "--dealt", "AS ZZ"], "not a card: 'ZZ'"),
        (["--envelope", "1000:5"], "--envelope must be 3 integers"),
        (["--envelope", "5:10:1"], "cannot give 10 shares"),
        (["--envelope", "1000:5:1", "--split", "1,x"], "--split must be integers"),
        (["--split", "1,2"], "--split and --grab-order need --envelope"),
        (["--round", ""], "round id must not be empty"),
    ],
)
def test_bad_input_exits_2_with_a_message(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    status, out, err = run(capsys, *args)  # later options override BASE's
    assert status == EXIT_BAD_INPUT
    assert message in err
    assert "Traceback" not in err
    assert out == ""


def test_argparse_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--seed", SEED_A]) == EXIT_BAD_INPUT
    assert "required" in capsys.readouterr().err
    assert main([*BASE, "--deck", "53"]) == EXIT_BAD_INPUT
    assert "invalid choice" in capsys.readouterr().err


def test_runs_as_a_program_without_traceback() -> None:
    ok = subprocess.run(
        [sys.executable, "-m", "tools.verify", *BASE, "--deck", "52", "--dealt", D1_TOP],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert ok.returncode == EXIT_OK, ok.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "tools.verify", *BASE, "--envelope", "1:2:3"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == EXIT_BAD_INPUT
    assert bad.stderr.startswith("niuniu-verify: error: total_minor 1 cannot give 2 shares")
    assert "Traceback" not in bad.stderr


# --------------------------------------------------------------------------- client seeds and sealed records

CLIENT_SEEDS = "lucky7, b0b alice-42"  # commas and/or spaces, any order
COMBINED = "da6f7886da2cabb6022effd91aa9303a527911f064ac3cecdc4bbc3d74d0025d"
COMBINED_TOP = "8D 9C 6C QH QC 6D 3S TC"
NONCE = bytes(range(12))


def _sealed_e1() -> str:
    split = fair.split_envelope(bytes(range(32)), "round-0001", "", 1000, 5, 1)
    record = fair.envelope_record("round-0001", COMMIT_A, 1000, 5, 1, "", [], split)
    return f"{NONCE.hex()}:{fair.seal(bytes(range(32)), 'envelope', 'round-0001', record, NONCE).hex()}"


def _sealed_deck(cards: list[str]) -> str:
    record = fair.deck_record("round-0001", COMMIT_A, 52, COMBINED, ["lucky7", "b0b", "alice-42"], cards)
    return f"{NONCE.hex()}:{fair.seal(bytes(range(32)), 'deck', 'round-0001', record, NONCE).hex()}"


def test_client_seeds_give_the_round_client_seed(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "--client-seeds", CLIENT_SEEDS, "--deck", "52", "--dealt", COMBINED_TOP, "--json")
    result = json.loads(out)
    assert status == EXIT_OK, out
    assert result["client_seed"] == COMBINED
    assert result["client_seeds"] == ["alice-42", "b0b", "lucky7"]
    assert [c["name"] for c in result["checks"]] == ["commitment", "client_seed", "deck"]
    assert result["checks"][1]["detail"] == f"the 3 client seeds combine into {COMBINED}"


def test_client_seeds_checked_against_the_published_client_seed(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "--client-seed", COMBINED, "--client-seeds", CLIENT_SEEDS, "--deck", "52")
    assert status == EXIT_OK, out
    status, out, _ = run(capsys, "--client-seed", COMBINED, "--client-seeds", "lucky7,b0b", "--deck", "52")
    assert status == EXIT_CHECK_FAILED
    assert "FAIL  client_seed  the 2 client seeds combine into " in out
    assert f"but the round used {COMBINED}" in out


def test_sealed_envelope_opens_and_matches(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "--envelope", "1000:5:1", "--sealed-envelope", _sealed_e1())
    assert status == EXIT_OK, out
    assert "ok    sealed_envelope  opens with the revealed seed and matches the derived envelope record" in out


def test_sealed_deck_opens_and_matches_then_tampering_fails(capsys: pytest.CaptureFixture[str]) -> None:
    cards = [c.code for c in fair.shuffle(bytes(range(32)), "round-0001", COMBINED, 52)]
    args = ("--client-seeds", CLIENT_SEEDS, "--deck", "52", "--dealt", COMBINED_TOP)
    status, out, _ = run(capsys, *args, "--sealed-deck", _sealed_deck(cards))
    assert status == EXIT_OK, out
    assert "ok    sealed_deck" in out
    swapped = [cards[5], *cards[1:5], cards[0], *cards[6:]]
    status, out, _ = run(capsys, *args, "--sealed-deck", _sealed_deck(swapped))
    assert status == EXIT_CHECK_FAILED
    assert "FAIL  sealed_deck  the sealed record differs from the derived deal in: cards" in out
    nonce, ciphertext = _sealed_deck(cards).split(":")
    altered = f"{nonce}:{ciphertext[:-2]}{int(ciphertext[-2:], 16) ^ 1:02x}"
    status, out, _ = run(capsys, *args, "--sealed-deck", altered)
    assert status == EXIT_CHECK_FAILED
    assert "FAIL  sealed_deck  the sealed deck record of round 'round-0001' does not open with this seed" in out


def test_sealed_record_does_not_open_with_another_seed(capsys: pytest.CaptureFixture[str]) -> None:
    other = "01" + SEED_A[2:]
    status = main(
        [
            *("--commitment", COMMIT_A, "--seed", other, "--round", "round-0001"),
            *("--envelope", "1000:5:1", "--sealed-envelope", _sealed_e1()),
        ]
    )
    out = capsys.readouterr().out
    assert status == EXIT_CHECK_FAILED
    assert "FAIL  sealed_envelope  the sealed envelope record of round 'round-0001' does not open" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--client-seeds", "ok,bad!"], "character 3 is U+0021"),
        (["--client-seeds", "x" * 65], "at most 64 characters, got 65"),
        (["--sealed-deck", "00:00"], "--sealed-deck needs --deck"),
        (["--sealed-envelope", "00:00"], "--sealed-envelope needs --envelope"),
        (["--deck", "52", "--sealed-deck", "zz:00"], "--sealed-deck must be NONCE_HEX:CIPHERTEXT_HEX"),
        (["--deck", "52", "--sealed-deck", "00" * 12], "with a 12-byte nonce"),
        (["--deck", "52", "--sealed-deck", "00" * 11 + ":00"], "with a 12-byte nonce"),
    ],
)
def test_bad_client_seeds_and_sealed_input_exit_2(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    status, out, err = run(capsys, *args)
    assert status == EXIT_BAD_INPUT
    assert message in err
    assert out == ""
