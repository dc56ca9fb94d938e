// The TypeScript verifier against the test vectors of docs/fairness.md (sections 7 and 10),
// the same vectors tests/rng/test_fair.py pins for bull/fairness.py.
import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { create, type MessageInitShape } from "@bufbuild/protobuf";

import {
  BitStream,
  combineClientSeeds,
  commit,
  FairInputError,
  fromHex,
  shuffle,
  splitEnvelope,
  streamMessage,
  toHex,
  verifyRound,
} from "../../src/fairness.js";
import { HandRevealedSchema } from "../../src/gen/niuniu/table/v1/events_pb.js";
import { RoundViewSchema, type RoundView } from "../../src/gen/niuniu/table/v1/table_pb.js";

const SEED_A = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const SEED_B = "fc8c2e460e09d6d0eb8793beeadfd10e099c9571ed7aa61ad1794a11d64fce01";
const COMMIT_A = "630dcd2966c4336691125448bbb25b4ff412a49c732db2c8abc1b8581bd710dd";
const COMMIT_B = "a1bdbd277c35e12013a1f0008f1a8cceca88b2eaa245653ab9b5291a479f1538";
const cards = (s: string): string[] => s.trim().split(/\s+/);

const D1 = cards(`4C QD AS 5C 7D TH QC 7S 8C AH 3S 4D 6S AC 6H JD 6C 4H 5S 9H QS 3C 4S 8H AD 5D
    JH JS 2S 3H 2H TC 7C 6D 2D 3D 2C 8D QH TS 7H KC KH KS TD 5H 9D JC KD 9S 9C 8S`);
const D2 = cards(`4H 3C 9S 3D 2D 9D 7H 6D 8H AH 8D JS 7S 3H AC JC 6S JH 2S QS 2H QH 3S 4S BJ 9C KS
    5H 8C AD 8S 6C 5D KH KC QD 4C TS 5S 4D AS 9H JD KD TC 7C 2C SJ 6H 7D QC TD 5C TH`);
const D3 = cards(`5D 2C 7S 4S QH 8S 4H 9C 9D 3H 3S KS JD KH 7H KD 8C 4C 6H 7D AS AH 9S 8H KC JS
    2H 6C 5H 5C QD 8D AD TD 5S QS 3D AC 6D JH 9H TC 2D 7C 2S 6S 3C TS 4D QC JC TH`);
const D_SEEDS = cards(`8D 9C 6C QH QC 6D 3S TC 2C 3H 5H JS 8H 5C 5S 6H 4S TD 5D 8C JD 8S 7H 7C 4C 3D
    TS TH 2H JH 4H AC AH KH JC 9S 3C 2S KD KS 2D 9H 9D 7S KC QD 6S AS 7D 4D QS AD`);

describe("niuniu-fair-v1 test vectors (docs/fairness.md section 7)", () => {
  it("commitments of seeds A and B", async () => {
    assert.equal(await commit(fromHex(SEED_A)), COMMIT_A);
    assert.equal(await commit(fromHex(SEED_B)), COMMIT_B);
  });

  it("stream internals: message(0), block(0), block(1) of the deck and envelope streams", async () => {
    assert.equal(
      toHex(streamMessage("deck", "round-0001", "", 0)),
      "0000000e6e69756e69752d666169722d7631000000046465636b0000000a726f756e642d30303031000000000000000000000000",
    );
    const deck = new BitStream(fromHex(SEED_A), "deck", "round-0001", "");
    assert.equal(toHex(await deck.block(0)), "1e2207d7dde4936e511ccfae66f9b14c9f7562bb646e6d18db2b13968d07bec8");
    assert.equal(toHex(await deck.block(1)), "30e78557626830affeb07e487e794c25aa92d4f3e4de417063aa28b82d143ebc");
    assert.equal(
      toHex(streamMessage("envelope", "round-0001", "", 0)),
      "0000000e6e69756e69752d666169722d763100000008656e76656c6f70650000000a726f756e642d30303031000000000000000000000000",
    );
    const envelope = new BitStream(fromHex(SEED_A), "envelope", "round-0001", "");
    assert.equal(toHex(await envelope.block(0)), "dfda09cb981f6dcaa0bf9f092edd0bf89d047d3412a4a33be3c92386da590a37");
  });

  it("the first draws of the shuffle, rejections included", async () => {
    const stream = new BitStream(fromHex(SEED_A), "deck", "round-0001", "");
    const draws = [];
    for (const i of [51, 50, 49, 48, 47, 46]) draws.push(await stream.uniform(i + 1));
    assert.deepEqual(draws, [7, 34, 8, 7, 36, 36]);
  });

  it("decks D1, D2 (54 cards, client seed) and D3 (Unicode round id and client seed)", async () => {
    assert.deepEqual(await shuffle(fromHex(SEED_A), "round-0001", "", 52), D1);
    assert.deepEqual(await shuffle(fromHex(SEED_A), "round-0001", "lucky7", 54), D2);
    assert.deepEqual(await shuffle(fromHex(SEED_B), "牛牛-42", "Ünïcode ✓", 52), D3);
  });

  const envelopes = [
    { id: "E1", seed: SEED_A, round: "round-0001", client: "", total: 1000n, shares: 5, min: 1n, amounts: [361n, 79n, 186n, 260n, 114n], grab: [0, 4, 2, 1, 3] },
    {
      id: "E2", seed: SEED_A, round: "round-0001", client: "lucky7", total: 10000n, shares: 12, min: 1n,
      amounts: [764n, 1002n, 511n, 320n, 1228n, 1215n, 963n, 979n, 1306n, 724n, 453n, 535n], grab: [9, 8, 6, 1, 4, 11, 7, 3, 0, 5, 2, 10],
    },
    { id: "E3", seed: SEED_B, round: "牛牛-42", client: "Ünïcode ✓", total: 500000n, shares: 3, min: 100n, amounts: [231426n, 121268n, 147306n], grab: [1, 2, 0] },
    { id: "E4", seed: SEED_A, round: "round-0001", client: "", total: 10n, shares: 10, min: 1n, amounts: Array<bigint>(10).fill(1n), grab: [5, 7, 3, 4, 2, 1, 6, 9, 8, 0] },
    { id: "E5", seed: SEED_A, round: "round-0001", client: "", total: 777n, shares: 1, min: 1n, amounts: [777n], grab: [0] },
  ];
  for (const e of envelopes) {
    it(`envelope ${e.id}`, async () => {
      const split = await splitEnvelope(fromHex(e.seed), e.round, e.client, e.total, e.shares, e.min);
      assert.deepEqual(split.amounts, e.amounts);
      assert.deepEqual(split.grabOrder, e.grab);
    });
  }
});

describe("client seeds (docs/fairness.md section 10)", () => {
  it("combine in any order into the documented seed, which deals the documented deck", async () => {
    const want = "da6f7886da2cabb6022effd91aa9303a527911f064ac3cecdc4bbc3d74d0025d";
    assert.equal(await combineClientSeeds(["lucky7", "alice-42", "b0b"]), want);
    assert.equal(await combineClientSeeds(["b0b", "lucky7", "alice-42"]), want);
    assert.deepEqual(await shuffle(fromHex(SEED_A), "round-0001", want, 52), D_SEEDS);
  });

  it("one contribution is hashed too; duplicates count; none gives the empty seed", async () => {
    assert.equal(await combineClientSeeds(["lucky7"]), "2a259f824bb0f6f5907e74ac1257045a1eb3abbf70ccf6e4569f13caba956d36");
    assert.equal(await combineClientSeeds(["b0b", "b0b"]), "774b10585bfa68ce93b424e7617ef2c5d66fbb60bc0b812ffc8b5fb8f00f574e");
    assert.equal(await combineClientSeeds([]), "");
  });

  it("refuses a malformed contribution", async () => {
    await assert.rejects(combineClientSeeds(["has space"]), FairInputError);
    await assert.rejects(combineClientSeeds([""]), FairInputError);
  });
});

describe("verifyRound", () => {
  it("passes the documented round: commitment, 5 dealt cards, envelope split and grab order", async () => {
    const result = await verifyRound({
      commitment: COMMIT_A.toUpperCase(),
      serverSeed: SEED_A,
      roundId: "round-0001",
      deckSize: 52,
      dealt: cards("4C QD AS 5C 7D"),
      envelope: { totalMinor: 1000n, shares: 5, minMinor: 1n, amounts: [361n, 79n, 186n, 260n, 114n], grabOrder: [0, 4, 2, 1, 3] },
    });
    assert.deepEqual(result.checks.map((c) => [c.name, c.ok]), [["commitment", true], ["deck", true], ["split", true], ["grab_order", true]]);
    assert.equal(result.ok, true);
  });

  it("fails a tampered seed, a swapped card, a changed share and a changed grab order", async () => {
    const otherSeed = SEED_A.slice(0, 63) + "e";
    const bad = await verifyRound({ commitment: COMMIT_A, serverSeed: otherSeed, roundId: "round-0001" });
    assert.equal(bad.ok, false);
    assert.equal(bad.checks[0]?.name, "commitment");
    const swapped = await verifyRound({ commitment: COMMIT_A, serverSeed: SEED_A, roundId: "round-0001", deckSize: 52, dealt: cards("4C QD AS 7D 5C") });
    assert.equal(swapped.ok, false);
    assert.match(swapped.checks[1]?.detail ?? "", /position 3: the table dealt 7D but the seed gives 5C/);
    const split = await verifyRound({
      commitment: COMMIT_A, serverSeed: SEED_A, roundId: "round-0001",
      envelope: { totalMinor: 1000n, shares: 5, minMinor: 1n, amounts: [361n, 80n, 185n, 260n, 114n], grabOrder: [0, 4, 2, 3, 1] },
    });
    assert.deepEqual(split.checks.map((c) => [c.name, c.ok]), [["commitment", true], ["split", false], ["grab_order", false]]);
    const otherRound = await verifyRound({ commitment: COMMIT_A, serverSeed: SEED_A, roundId: "round-0002", deckSize: 52, dealt: D1.slice(0, 20) });
    assert.equal(otherRound.ok, false);
  });

  it("checks the players' client seeds against the round's", async () => {
    const good = await verifyRound({
      commitment: COMMIT_A, serverSeed: SEED_A, roundId: "round-0001",
      clientSeed: "da6f7886da2cabb6022effd91aa9303a527911f064ac3cecdc4bbc3d74d0025d",
      clientSeeds: ["b0b", "alice-42", "lucky7"], deckSize: 52, dealt: D_SEEDS.slice(0, 20),
    });
    assert.equal(good.ok, true);
    const missing = await verifyRound({
      commitment: COMMIT_A, serverSeed: SEED_A, roundId: "round-0001",
      clientSeed: "da6f7886da2cabb6022effd91aa9303a527911f064ac3cecdc4bbc3d74d0025d", clientSeeds: ["b0b", "lucky7"],
    });
    assert.equal(missing.ok, false);
  });

  it("refuses bad input instead of failing a check", async () => {
    await assert.rejects(verifyRound({ commitment: COMMIT_A, serverSeed: "00", roundId: "r" }), FairInputError);
    await assert.rejects(verifyRound({ commitment: "xyz", serverSeed: SEED_A, roundId: "r" }), FairInputError);
    await assert.rejects(verifyRound({ commitment: COMMIT_A, serverSeed: SEED_A, roundId: "" }), FairInputError);
    await assert.rejects(verifyRound({ commitment: COMMIT_A, serverSeed: SEED_A, roundId: "r", deckSize: 53 }), FairInputError);
    await assert.rejects(splitEnvelope(fromHex(SEED_A), "r", "", 4n, 5, 1n), FairInputError);
  });
});

describe("verifyRound(roundView): what GetRound answers, every variant", () => {
  type ViewFields = Omit<MessageInitShape<typeof RoundViewSchema>, "$typeName">;
  const view = (variant: string, fields: ViewFields): RoundView =>
    create(RoundViewSchema, { roundId: "round-0001", commitment: COMMIT_A, serverSeed: SEED_A, phase: "settled", variant, ...fields } as ViewFields);
  const hand = (seat: string, cards: string[], group = ""): MessageInitShape<typeof HandRevealedSchema> => ({ seat, cards, group });
  const names = (r: { checks: { name: string; ok: boolean }[] }): [string, boolean][] => r.checks.map((c) => [c.name, c.ok]);

  it("Golden Bull: the hands in GetRound order are the top of the deck", async () => {
    const seats = ["dealer", "area_1", "area_2", "area_3"];
    const hands = seats.map((seat, i) => hand(seat, D1.slice(5 * i, 5 * i + 5)));
    assert.deepEqual(names(await verifyRound(view("golden_bull", { hands }))), [["commitment", true], ["deck", true]]);
    const swapped = [hands[1], hands[0], hands[2], hands[3]] as typeof hands;
    assert.equal((await verifyRound(view("golden_bull", { hands: swapped }))).ok, false);
  });

  it("Bai Buu: four cards a seat, each listed as its head then its last", async () => {
    const seats = ["banker", "player_01", "player_02", "player_03"];
    const hands = seats.flatMap((seat, i) => [hand(seat, D1.slice(4 * i, 4 * i + 2), "head"), hand(seat, D1.slice(4 * i + 2, 4 * i + 4), "last")]);
    assert.deepEqual(names(await verifyRound(view("bai_buu", { hands }))), [["commitment", true], ["deck", true]]);
  });

  it("百變牛牛: the drawn card picks the first seat, then one card a seat clockwise", async () => {
    // D2 (client seed lucky7, 54 cards) draws 4H: 4 points, so the first card goes to seat 3 (mystic).
    const seats = ["banker", "heaven", "earth", "mystic", "yellow"];
    const dealt = new Map(seats.map((s) => [s, [] as string[]]));
    for (let i = 0; i < 25; i++) dealt.get(seats[(3 + i) % 5] ?? "")?.push(D2[1 + i] ?? "");
    const hands = seats.flatMap((seat) => [hand(seat, (dealt.get(seat) ?? []).slice(0, 4), "face_up"), hand(seat, dealt.get(seat) ?? [], "open")]);
    const good = await verifyRound(view("baibian_bull", { hands, clientSeed: "lucky7" }));
    assert.deepEqual(names(good), [["commitment", true], ["deck", true]]);
    // The same hands under rank values (4H is still 4) pass; another first seat does not.
    const moved = hands.map((h) => ({ ...h, seat: seats[(seats.indexOf(h.seat ?? "") + 1) % 5] ?? "" }));
    assert.equal((await verifyRound(view("baibian_bull", { hands: moved, clientSeed: "lucky7" }))).ok, false);
  });

  it("68 NiuNiu: the grabs give the split and the grab order; money is bigint", async () => {
    const amounts = [361n, 79n, 186n, 260n, 114n];
    const order = [0, 4, 2, 1, 3];
    const grabs = amounts.map((amountMinor, grabNo) => ({ grabNo, position: order[grabNo] ?? 0, amountMinor })).reverse();
    const result = await verifyRound(view("red_envelope_bull", { grabs, envelopeTotalMinor: 1000n, envelopeMinMinor: 1n }));
    assert.deepEqual(names(result), [["commitment", true], ["split", true], ["grab_order", true]]);
    assert.deepEqual(result.split?.amounts, amounts);
  });

  it("the contributions GetRound lists as counted combine into the round's client seed", async () => {
    // docs/fairness.md, section 10, "Cancelled and changed bets": alice-42 and b0b count, c4r0l was cancelled.
    const combined = "a957abbc44428c00c405d6f59e65944b7416f82fc944ae5918a35d39323d6568";
    const clientSeeds = [
      { betId: "b1", clientSeed: "alice-42", counted: true },
      { betId: "b2", clientSeed: "b0b", counted: true, mine: true },
      { betId: "b3", clientSeed: "c4r0l", counted: false },
    ];
    const good = await verifyRound(view("golden_bull", { clientSeed: combined, clientSeeds }));
    assert.deepEqual(names(good), [["commitment", true], ["client_seed", true]]);
    const counted = clientSeeds.map((c) => ({ ...c, counted: true }));
    assert.deepEqual(names(await verifyRound(view("golden_bull", { clientSeed: combined, clientSeeds: counted }))), [["commitment", true], ["client_seed", false]]);
  });

  it("68 NiuNiu: the envelope's smallest share comes from the round view", async () => {
    const grabs = [{ grabNo: 0, position: 0, amountMinor: 500n }, { grabNo: 1, position: 1, amountMinor: 500n }];
    // 1000 in two shares of at least 500: the only split there is, whatever the seed.
    const result = await verifyRound(view("red_envelope_bull", { grabs, envelopeTotalMinor: 1000n, envelopeMinMinor: 500n }));
    assert.deepEqual(result.split?.amounts, [500n, 500n]);
    assert.equal(result.checks.find((c) => c.name === "split")?.ok, true);
  });

  it("a round whose seed is not revealed yet is refused, not failed", async () => {
    await assert.rejects(verifyRound(view("golden_bull", { serverSeed: "", phase: "betting" })), FairInputError);
  });
});
