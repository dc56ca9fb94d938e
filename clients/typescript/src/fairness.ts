/**
 * `niuniu-fair-v1` in TypeScript: recompute a round's deck order and red-envelope split
 * from its revealed server seed and check them against what the table published
 * (docs/fairness.md, sections 1-6 and 10). Runs in browsers and in Node 20 on WebCrypto
 * (`globalThis.crypto.subtle`), so every function that hashes is async.
 *
 * The reference implementation is bull/fairness.py; test/unit/fairness.test.ts checks this
 * one against the test vectors of docs/fairness.md section 7 and section 10.
 */

import type { RoundView } from "./gen/niuniu/table/v1/table_pb.js";

export const VERSION = "niuniu-fair-v1";
export const CLIENT_SEEDS_VERSION = "niuniu-client-seeds-v1";
export const PURPOSE_DECK = "deck";
export const PURPOSE_ENVELOPE = "envelope";
export const SEED_BYTES = 32;
const MAX_REJECTIONS = 1024;
const MAX_FIELD_BYTES = 1024;
const MAX_ENVELOPE_TOTAL = 10n ** 15n;
const MAX_SHARES = 10_000;

/** Malformed input (not a failed check): a bad seed, round id, deck size or envelope. */
export class FairInputError extends Error {
  override name = "FairInputError";
}

const SUITS = ["S", "H", "C", "D"] as const;
const RANKS = ["A", "2", "3", "4", "5", "6", "7", "8", "9", "T", "J", "Q", "K"] as const;

/** The canonical deck by card index (bull/cards.py): S, H, C, D, each A..K; then SJ, BJ. */
export function canonicalDeck(size: 52 | 54): string[] {
  const deck: string[] = [];
  for (const suit of SUITS) for (const rank of RANKS) deck.push(rank + suit);
  if (size === 54) deck.push("SJ", "BJ");
  return deck;
}

const utf8 = new TextEncoder();

function subtle(): SubtleCrypto {
  const c = globalThis.crypto;
  if (!c?.subtle) throw new Error("WebCrypto (crypto.subtle) is not available: use a secure context (https or localhost)");
  return c.subtle;
}

export function toHex(bytes: Uint8Array): string {
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

export function fromHex(hex: string): Uint8Array {
  if (!/^(?:[0-9a-fA-F]{2})*$/.test(hex)) throw new FairInputError("not an even-length hex string");
  const out = new Uint8Array(hex.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = parseInt(hex.slice(2 * i, 2 * i + 2), 16);
  return out;
}

function concat(parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

function u32be(n: number): Uint8Array {
  const out = new Uint8Array(4);
  new DataView(out.buffer).setUint32(0, n, false);
  return out;
}

function u64be(n: number): Uint8Array {
  const out = new Uint8Array(8);
  new DataView(out.buffer).setBigUint64(0, BigInt(n), false);
  return out;
}

/** `field(s) = u32be(len(utf8(s))) || utf8(s)` (section 2). */
export function field(s: string): Uint8Array {
  const bytes = utf8.encode(s);
  return concat([u32be(bytes.length), bytes]);
}

export async function sha256(data: Uint8Array): Promise<Uint8Array> {
  return new Uint8Array(await subtle().digest("SHA-256", data as BufferSource));
}

/** `hex(SHA-256(server_seed))`, the commitment published before betting opens (section 1). */
export async function commit(serverSeed: Uint8Array): Promise<string> {
  checkSeed(serverSeed);
  return toHex(await sha256(serverSeed));
}

function checkSeed(seed: Uint8Array): void {
  if (seed.length !== SEED_BYTES) throw new FairInputError(`a server seed is ${SEED_BYTES} bytes, got ${seed.length}`);
}

function checkField(value: string, what: string, allowEmpty: boolean): void {
  const n = utf8.encode(value).length;
  if (!allowEmpty && n === 0) throw new FairInputError(`the ${what} must not be empty`);
  if (n > MAX_FIELD_BYTES) throw new FairInputError(`the ${what} is at most ${MAX_FIELD_BYTES} bytes of UTF-8, got ${n}`);
}

/** `message(i)` of a stream (section 2). */
export function streamMessage(purpose: string, roundId: string, clientSeed: string, block: number): Uint8Array {
  checkField(roundId, "round id", false);
  checkField(clientSeed, "client seed", true);
  return concat([field(VERSION), field(purpose), field(roundId), field(clientSeed), u64be(block)]);
}

/** The stream `block(0) || block(1) || ...` read as bits, most significant first (section 2). */
export class BitStream {
  private key: Promise<CryptoKey>;
  private bytes: Uint8Array = new Uint8Array(0);
  private bitPos = 0;
  private nextBlock = 0;

  constructor(
    serverSeed: Uint8Array,
    private readonly purpose: string,
    private readonly roundId: string,
    private readonly clientSeed: string,
  ) {
    checkSeed(serverSeed);
    streamMessage(purpose, roundId, clientSeed, 0); // validates the fields now
    this.key = subtle().importKey("raw", serverSeed as BufferSource, { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  }

  /** `block(i) = HMAC-SHA256(server_seed, message(i))`. */
  async block(i: number): Promise<Uint8Array> {
    const msg = streamMessage(this.purpose, this.roundId, this.clientSeed, i);
    return new Uint8Array(await subtle().sign("HMAC", await this.key, msg as BufferSource));
  }

  /** The next `k` bits as an unsigned integer (k <= 52, so it stays an exact JS number). */
  async bits(k: number): Promise<number> {
    if (k > 52) throw new FairInputError("at most 52 bits per draw");
    while (this.bitPos + k > this.bytes.length * 8) {
      this.bytes = concat([this.bytes, await this.block(this.nextBlock++)]);
    }
    let x = 0;
    for (let n = 0; n < k; n++) {
      const byte = this.bytes[this.bitPos >> 3] ?? 0;
      x = x * 2 + ((byte >> (7 - (this.bitPos & 7))) & 1);
      this.bitPos++;
    }
    return x;
  }

  /** `uniform(n)`, unbiased in [0, n) by rejection on bit_length(n - 1) bits (section 3). */
  async uniform(n: number): Promise<number> {
    if (!Number.isSafeInteger(n) || n < 1) throw new FairInputError(`uniform(n) needs an integer n >= 1, got ${n}`);
    if (n === 1) return 0;
    const k = (n - 1).toString(2).length;
    for (let attempt = 0; attempt < MAX_REJECTIONS; attempt++) {
      const x = await this.bits(k);
      if (x < n) return x;
    }
    throw new Error(`uniform(${n}): ${MAX_REJECTIONS} rejections in a row`);
  }
}

/** The round's deck order (section 4): Fisher–Yates from the back on the `deck` stream. */
export async function shuffle(serverSeed: Uint8Array, roundId: string, clientSeed: string, deckSize: number): Promise<string[]> {
  if (deckSize !== 52 && deckSize !== 54) throw new FairInputError(`the deck has 52 or 54 cards, got ${deckSize}`);
  const stream = new BitStream(serverSeed, PURPOSE_DECK, roundId, clientSeed);
  const deck = canonicalDeck(deckSize);
  await fisherYates(stream, deck);
  return deck;
}

async function fisherYates<T>(stream: BitStream, items: T[]): Promise<void> {
  for (let i = items.length - 1; i >= 1; i--) {
    const j = await stream.uniform(i + 1);
    const t = items[i] as T;
    items[i] = items[j] as T;
    items[j] = t;
  }
}

export interface Split {
  /** `amount[s]`: what the s-th grab receives, in minor units. */
  amounts: bigint[];
  /** `grab_order[s]`: the participant position that grabs s-th. */
  grabOrder: number[];
}

/** The red-envelope split ("double mean") and grab order (section 5); amounts in minor units. */
export async function splitEnvelope(
  serverSeed: Uint8Array,
  roundId: string,
  clientSeed: string,
  totalMinor: bigint,
  shares: number,
  minMinor: bigint,
): Promise<Split> {
  if (!Number.isSafeInteger(shares)) throw new FairInputError(`the envelope's shares must be an integer, got ${shares}`);
  if (shares < 1 || shares > MAX_SHARES) throw new FairInputError(`1..${MAX_SHARES} shares, got ${shares}`);
  if (minMinor < 1n) throw new FairInputError(`the smallest share is at least 1, got ${minMinor}`);
  if (totalMinor > MAX_ENVELOPE_TOTAL) throw new FairInputError(`the envelope is at most 10^15, got ${totalMinor}`);
  const n = BigInt(shares);
  if (totalMinor < n * minMinor) {
    throw new FairInputError(`${totalMinor} cannot give ${shares} shares of at least ${minMinor}`);
  }
  const stream = new BitStream(serverSeed, PURPOSE_ENVELOPE, roundId, clientSeed);
  const amounts: bigint[] = [];
  let remaining = totalMinor;
  for (let s = 0n; s < n - 1n; s++) {
    const left = n - s;
    const high = min((2n * remaining) / left, remaining - (left - 1n) * minMinor);
    // high - min + 1 <= 10^15 < 2^53: an exact number for uniform().
    const amount = minMinor + BigInt(await stream.uniform(Number(high - minMinor + 1n)));
    amounts.push(amount);
    remaining -= amount;
  }
  amounts.push(remaining);
  const grabOrder = Array.from({ length: shares }, (_, i) => i);
  await fisherYates(stream, grabOrder);
  return { amounts, grabOrder };
}

const min = (a: bigint, b: bigint): bigint => (a < b ? a : b);

const CONTRIBUTION = /^[A-Za-z0-9._~+/=-]{1,64}$/;

/** The round's client seed from the players' contributions, whatever their order (section 10). */
export async function combineClientSeeds(contributions: readonly string[]): Promise<string> {
  contributions.forEach((c, i) => {
    if (!CONTRIBUTION.test(c)) throw new FairInputError(`client seed ${i} is not 1-64 of [A-Za-z0-9._~+/=-]`);
  });
  if (contributions.length === 0) return "";
  // ASCII only, so sorting by UTF-16 code units is sorting by bytes.
  const ordered = [...contributions].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
  return toHex(await sha256(concat([field(CLIENT_SEEDS_VERSION), u32be(ordered.length), ...ordered.map(field)])));
}

export interface Check {
  name: "commitment" | "deck" | "split" | "grab_order" | "client_seed";
  ok: boolean;
  detail: string;
}

export interface VerifyInput {
  commitment: string;
  /** The revealed server seed, 64 hex digits. */
  serverSeed: string;
  roundId: string;
  clientSeed?: string;
  /** With `dealt`: the deck the round was dealt from (52 or 54). */
  deckSize?: number;
  /** The cards the table dealt, in deck order (a prefix of the deck). */
  dealt?: readonly string[];
  envelope?: { totalMinor: bigint; shares: number; minMinor: bigint; amounts?: readonly bigint[]; grabOrder?: readonly number[] };
  /** The players' contributions, checked to combine into `clientSeed`. */
  clientSeeds?: readonly string[];
}

export interface Verification {
  ok: boolean;
  checks: Check[];
  deck?: string[];
  split?: Split;
}

/**
 * Recompute a round from its revealed seed and check it (section 6). Takes what
 * `client.table.getRound(...)` answers (a settled round's `RoundView`: every variant's deal
 * or envelope is rebuilt from it, and the contributions it lists as counted are checked to
 * combine into its client seed), or the facts spelled out as a `VerifyInput`.
 */
export async function verifyRound(input: VerifyInput | RoundView): Promise<Verification> {
  if (!isRoundView(input)) return verifyInput(input);
  const result = await verifyInput(roundViewInput(input));
  const seats = baibianHands(input);
  if (seats && result.deck) {
    // 百變牛牛's deal starts from the drawn card, deck[0] of the derived deck, so it is checked after the shuffle.
    result.checks.push(checkDealt(result.deck, baibianPrefix(result.deck, seats, input.config["deal.card_value"] === "rank")));
    result.ok = result.checks.every((c) => c.ok);
  }
  return result;
}

function isRoundView(input: VerifyInput | RoundView): input is RoundView {
  return (input as { $typeName?: string }).$typeName === "niuniu.table.v1.RoundView";
}

/**
 * What a `RoundView` lets a verifier check: the commitment always; the contributions it lists
 * as counted combine into its client seed, when it lists any; the dealt cards once every
 * hand is revealed (docs/api/frontend/stream.md, "Card-to-seat order"); the envelope's split
 * and grab order once every grab is. Throws FairInputError before the seed is revealed.
 */
export function roundViewInput(view: RoundView): VerifyInput {
  if (!view.serverSeed) throw new FairInputError(`round ${view.roundId} has no revealed seed yet (phase ${view.phase || "unknown"})`);
  const base: VerifyInput = { commitment: view.commitment, serverSeed: view.serverSeed, roundId: view.roundId, clientSeed: view.clientSeed };
  if (view.clientSeeds.length > 0) base.clientSeeds = view.clientSeeds.filter((c) => c.counted).map((c) => c.clientSeed);
  if (view.variant === "red_envelope_bull") {
    if (view.grabs.length === 0) return base;
    const grabs = [...view.grabs].sort((a, b) => a.grabNo - b.grabNo);
    const envelope = {
      totalMinor: view.envelopeTotalMinor,
      shares: grabs.length,
      minMinor: view.envelopeMinMinor,
      amounts: grabs.map((g) => g.amountMinor),
      grabOrder: grabs.map((g) => g.position),
    };
    return { ...base, envelope };
  }
  const deal = dealtCards(view);
  return deal ? { ...base, ...deal } : base;
}

/** The deck's dealt prefix rebuilt from the revealed hands; undefined until every hand is revealed. */
function dealtCards(view: RoundView): { deckSize: number; dealt?: string[] } | undefined {
  const cardsOf = (hands: RoundView["hands"]): string[] => hands.flatMap((h) => h.cards);
  switch (view.variant) {
    case "golden_bull": // deck[0:5] dealer, then area_1..area_3: GetRound's order
      return view.hands.length === 4 ? { deckSize: 52, dealt: cardsOf(view.hands) } : undefined;
    case "bai_buu": // four cards a seat, banker first; each seat listed as its head, then its last
      return view.hands.length === 8 ? { deckSize: 52, dealt: cardsOf(view.hands) } : undefined;
    case "baibian_bull": // the dealt cards are checked once the deck is derived (verifyRound)
      return baibianHands(view) ? { deckSize: 54 } : undefined;
    default:
      return undefined;
  }
}

/** 百變牛牛's seats clockwise from the banker. */
const BAIBIAN_SEATS = ["banker", "heaven", "earth", "mystic", "yellow"] as const;

/** Each seat's five cards in the order dealt (its "open" part); undefined until all five are revealed. */
function baibianHands(view: RoundView): Map<string, readonly string[]> | undefined {
  if (view.variant !== "baibian_bull") return undefined;
  const open = new Map(view.hands.filter((h) => h.group === "open").map((h) => [h.seat, h.cards] as const));
  return BAIBIAN_SEATS.every((seat) => open.get(seat)?.length === 5) ? open : undefined;
}

/**
 * 百變牛牛's deal (docs/rules/baibian_bull.md): deck[0] is drawn face up and burned; its value
 * picks the first seat, (value - 1) mod 5; then deck[1 + i] goes to seat (first + i) mod 5.
 * The value is the card's points (A 1, 2..9, T J Q K 10, jokers 10) or, with
 * `deal.card_value = rank`, its rank (A 1 .. K 13, SJ 14, BJ 15).
 */
function baibianPrefix(deck: readonly string[], hands: Map<string, readonly string[]>, byRank: boolean): string[] {
  const drawn = deck[0] ?? "";
  const rank = drawn === "SJ" ? 14 : drawn === "BJ" ? 15 : RANKS.indexOf(drawn[0] as (typeof RANKS)[number]) + 1;
  const value = byRank ? rank : Math.min(rank, 10);
  const first = (value - 1) % BAIBIAN_SEATS.length;
  const prefix = [drawn];
  for (let i = 0; i < 5 * BAIBIAN_SEATS.length; i++) {
    const seat = BAIBIAN_SEATS[(first + i) % BAIBIAN_SEATS.length] ?? "banker";
    prefix.push(hands.get(seat)?.[Math.floor(i / BAIBIAN_SEATS.length)] ?? "?");
  }
  return prefix;
}

async function verifyInput(input: VerifyInput): Promise<Verification> {
  const seed = fromHex(input.serverSeed);
  checkSeed(seed);
  const clientSeed = input.clientSeed ?? "";
  streamMessage(PURPOSE_DECK, input.roundId, clientSeed, 0); // rejects a malformed round id even with nothing to derive
  const published = input.commitment.toLowerCase();
  if (!/^[0-9a-f]{64}$/.test(published)) throw new FairInputError("a commitment is 64 hex digits");
  const derived = await commit(seed);
  const checks: Check[] = [
    derived === published
      ? { name: "commitment", ok: true, detail: `SHA-256(seed) = ${derived}` }
      : { name: "commitment", ok: false, detail: `SHA-256(seed) = ${derived} but the published commitment is ${published}` },
  ];
  const result: Verification = { ok: false, checks };
  if (input.clientSeeds !== undefined) {
    const combined = await combineClientSeeds(input.clientSeeds);
    checks.push({
      name: "client_seed",
      ok: combined === clientSeed,
      detail: `the ${input.clientSeeds.length} client seeds combine into ${combined || "(empty)"}` +
        (combined === clientSeed ? "" : `, but the round used ${clientSeed || "(empty)"}`),
    });
  }
  if (input.dealt !== undefined && input.deckSize === undefined) throw new FairInputError("deckSize is required to check dealt cards");
  if (input.deckSize !== undefined) {
    result.deck = await shuffle(seed, input.roundId, clientSeed, input.deckSize);
    if (input.dealt !== undefined) checks.push(checkDealt(result.deck, input.dealt));
  }
  if (input.envelope !== undefined) {
    const e = input.envelope;
    result.split = await splitEnvelope(seed, input.roundId, clientSeed, e.totalMinor, e.shares, e.minMinor);
    if (e.amounts !== undefined) checks.push(checkSequence("split", "share", result.split.amounts, e.amounts));
    if (e.grabOrder !== undefined) checks.push(checkSequence("grab_order", "grab", result.split.grabOrder, e.grabOrder));
  }
  result.ok = checks.every((c) => c.ok);
  return result;
}

function checkDealt(deck: readonly string[], dealt: readonly string[]): Check {
  if (dealt.length > deck.length) return { name: "deck", ok: false, detail: `the table dealt ${dealt.length} cards from a ${deck.length}-card deck` };
  const wrong = dealt.filter((card, i) => card !== deck[i]).length;
  const first = dealt.findIndex((card, i) => card !== deck[i]);
  if (first >= 0) {
    return {
      name: "deck",
      ok: false,
      detail: `position ${first}: the table dealt ${dealt[first]} but the seed gives ${deck[first]} (${wrong} of ${dealt.length} dealt cards differ)`,
    };
  }
  return { name: "deck", ok: true, detail: `the ${dealt.length} dealt cards are the top of the derived ${deck.length}-card deck` };
}

function checkSequence<T extends bigint | number>(name: "split" | "grab_order", noun: string, derived: readonly T[], recorded: readonly T[]): Check {
  if (derived.length !== recorded.length) {
    return { name, ok: false, detail: `the table recorded ${recorded.length} values but the seed gives ${derived.length}` };
  }
  const i = derived.findIndex((v, k) => v !== recorded[k]);
  if (i >= 0) return { name, ok: false, detail: `${noun} ${i}: the table recorded ${recorded[i]} but the seed gives ${derived[i]}` };
  return { name, ok: true, detail: `all ${recorded.length} values match` };
}
