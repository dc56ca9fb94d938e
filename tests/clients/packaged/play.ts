// A Node program written against the packed SDK alone (tests/clients/test_sdk_package.py
// installs `npm pack`'s tarball next to it in an empty folder, type-checks it with tsc and
// runs it): log in, bet with a client seed, watch the round, read the result and verify the
// round from GetRound and from the stream alone. One JSON line on stdout says what happened.
//
// Input (environment): NIUNIU_SDK_GATEWAY, NIUNIU_SDK_TABLE, NIUNIU_SDK_USERNAME,
// NIUNIU_SDK_PASSWORD, NIUNIU_SDK_CLIENT_SEED.
import { Code, ConnectError, NiuniuClient, formatMoney, reasonOf, verifyRound, watchTable, type RoundView } from "@niuniu/sdk";

const env = (name: string): string => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
};
const tableId = env("NIUNIU_SDK_TABLE");
const clientSeed = env("NIUNIU_SDK_CLIENT_SEED");

const client = new NiuniuClient({ baseUrl: env("NIUNIU_SDK_GATEWAY") });
await client.login(env("NIUNIU_SDK_USERNAME"), env("NIUNIU_SDK_PASSWORD"));
const before = await client.wallet.getBalance({});

// A refusal carries its reason code: a stake under the table minimum.
let refusal = "";
try {
  await client.table.placeBet({ commandId: `tiny-${crypto.randomUUID()}`, tableId, area: "area_1", amountMinor: 1n });
} catch (error) {
  refusal = `${Code[ConnectError.from(error).code]} ${reasonOf(error)}`;
}

const stop = new AbortController();
const timer = setTimeout(() => stop.abort(new Error("no verified round within 90 s")), 90_000);
let roundId = "";
let holdMinor = 0n;
let stakeMinor = 0n;
let contributed = "";
// What the stream alone tells of the round: the commitment at its opening, the hands, the seed.
const commitments = new Map<string, string>();
const hands = new Map<string, string[]>();
let revealed: { serverSeed: string; clientSeed: string; clientSeeds: string[] } | undefined;
let netMinor: bigint | undefined;
let balanceAfter: bigint | undefined;
for await (const u of watchTable(client, tableId, { signal: stop.signal })) {
  const update = u.update;
  if (update.case === "phaseChanged" && update.value.phase === "betting" && !roundId) {
    if (client.clock.remainingMs(update.value.deadlineUnixMs) < 1_500) continue; // too late: next round
    const receipt = await client.table.placeBet({
      commandId: `sdk-${crypto.randomUUID()}`,
      tableId,
      area: "area_1",
      amountMinor: 500n,
      roundId: u.roundId,
      clientSeed,
    });
    [roundId, holdMinor, stakeMinor, contributed] = [receipt.roundId, receipt.holdMinor, receipt.stakeMinor, receipt.clientSeed];
  } else if (update.case === "roundOpened") {
    commitments.set(u.roundId, update.value.commitment);
  } else if (u.roundId !== roundId) {
    continue;
  } else if (update.case === "handRevealed") {
    hands.set(update.value.seat, [...update.value.cards]);
  } else if (update.case === "result") {
    netMinor = update.value.myNetMinor;
  } else if (update.case === "balance") {
    balanceAfter = update.value.availableMinor;
  } else if (update.case === "seedRevealed") {
    revealed = update.value;
    break;
  }
}
clearTimeout(timer);

const view: RoundView = await client.table.getRound({ tableId, roundId });
const verification = await verifyRound(view);
if (!revealed) throw new Error("the stream ended before the seed was revealed");
// Golden Bull deals the dealer's five cards first, then area_1..area_3's (the stream reveals the dealer last).
const fromStream = await verifyRound({
  commitment: commitments.get(roundId) ?? "",
  serverSeed: revealed.serverSeed,
  roundId,
  clientSeed: revealed.clientSeed,
  clientSeeds: revealed.clientSeeds,
  deckSize: 52,
  dealt: ["dealer", "area_1", "area_2", "area_3"].flatMap((seat) => hands.get(seat) ?? []),
});
console.log(
  JSON.stringify({
    roundId,
    refusal,
    stakeMinor: stakeMinor.toString(),
    holdMinor: holdMinor.toString(),
    netMinor: netMinor?.toString() ?? null,
    balanceBefore: before.availableMinor.toString(),
    balanceAfter: balanceAfter?.toString() ?? null,
    net: netMinor === undefined ? "" : formatMoney(netMinor, { signed: true }),
    clientSeed: view.clientSeed,
    contributed,
    counted: view.clientSeeds.filter((c) => c.mine && c.counted).map((c) => c.clientSeed),
    ok: verification.ok,
    checks: verification.checks.map((c) => c.name),
    streamOk: fromStream.ok,
    streamChecks: fromStream.checks.map((c) => c.name),
    streamSeeds: revealed.clientSeeds,
  }),
);
