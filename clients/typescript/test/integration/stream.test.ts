// The SDK against the real stack through the browser gateway (run by
// tests/clients/test_typescript_sdk.py, which starts the services and the gateway, creates a
// fast Golden Bull table and funded players, and passes them in the environment).
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { clone, toBinary } from "@bufbuild/protobuf";

import { Code, ConnectError, NiuniuClient, watchTable, type TableUpdate } from "../../src/index.js";
import { TableUpdateSchema } from "../../src/gen/niuniu/table/v1/table_pb.js";
import { CuttableProxy } from "./proxy.js";

const GATEWAY = process.env.NIUNIU_SDK_GATEWAY ?? "";
const TABLE = process.env.NIUNIU_SDK_TABLE ?? "";
const PLAYERS = JSON.parse(process.env.NIUNIU_SDK_PLAYERS ?? "[]") as { username: string; password: string }[];
const PROTOCOL = process.env.NIUNIU_SDK_PROTOCOL === "grpc-web" ? "grpc-web" : "connect";
const missing = !GATEWAY || !TABLE || PLAYERS.length < 2;
const ROUND_TIMEOUT_MS = 90_000;

/** What an update says, without the server time of its delivery (a resumed delivery is sent later). */
function content(u: TableUpdate): string {
  const c = clone(TableUpdateSchema, u);
  Reflect.set(c, "serverTimeUnixMs", 0n);
  return Buffer.from(toBinary(TableUpdateSchema, c)).toString("hex");
}

const kind = (u: TableUpdate): string => u.update.case ?? "(none)";

async function login(baseUrl: string, who = 0): Promise<NiuniuClient> {
  const player = PLAYERS[who];
  assert.ok(player);
  const client = new NiuniuClient({ baseUrl, protocol: PROTOCOL });
  await client.login(player.username, player.password);
  return client;
}

function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let t: ReturnType<typeof setTimeout> | undefined;
  return Promise.race([p, new Promise<never>((_, reject) => (t = setTimeout(() => reject(new Error(`timed out: ${what}`)), ms)))]).finally(() =>
    clearTimeout(t),
  );
}

/**
 * The reference: an uncut watch from the current round on, until one whole round (opened
 * after we started) has revealed its seed. The player bets in that round, so the stream
 * also carries their own bet and result. Returns the update before the round's opening and
 * the round's updates.
 */
async function referenceRound(
  client: NiuniuClient,
  picked: (before: bigint) => void,
): Promise<{ before: bigint; roundId: string; updates: TableUpdate[]; deadLinks: number }> {
  const seen: TableUpdate[] = [];
  let roundId = "";
  let before = -1n;
  const watch = watchTable(client, TABLE);
  for await (const u of watch) {
    if (!roundId && kind(u) === "roundOpened" && seen.length > 0) {
      roundId = u.roundId;
      before = seen[seen.length - 1]?.position ?? -1n;
      picked(before);
      const area = "area_1";
      await client.table.placeBet({ commandId: `sdk-ref-${roundId}`, tableId: TABLE, area, amountMinor: 100n, roundId });
    }
    seen.push(u);
    if (roundId && u.roundId === roundId && kind(u) === "seedRevealed") break;
  }
  return { before, roundId, updates: seen.filter((u) => u.position > before), deadLinks: watch.state.deadLinks };
}

describe("WatchTable through the gateway", { skip: missing ? "needs NIUNIU_SDK_GATEWAY, NIUNIU_SDK_TABLE, NIUNIU_SDK_PLAYERS" : false }, () => {
  let proxy: CuttableProxy;
  let proxyUrl: string;

  before(async () => {
    proxy = CuttableProxy.forUrl(GATEWAY);
    proxyUrl = await proxy.listen();
  });
  after(async () => {
    await proxy.close();
  });

  it("logs in through the gateway (Connect and gRPC-web) and refuses a wrong password with UNAUTHENTICATED", async () => {
    const client = await login(GATEWAY);
    assert.match(client.session?.account ?? "", /^player:/);
    const balance = await client.wallet.getBalance({});
    assert.ok(balance.availableMinor > 0n, "the test player is funded");
    // The other wire protocol the gateway speaks reaches the same account.
    const other = new NiuniuClient({ baseUrl: GATEWAY, protocol: PROTOCOL === "connect" ? "grpc-web" : "connect" });
    const again = await other.login(PLAYERS[0]?.username ?? "", PLAYERS[0]?.password ?? "");
    assert.equal(again.account, client.session?.account);
    assert.equal((await other.wallet.getBalance({})).availableMinor, balance.availableMinor);
    const stranger = new NiuniuClient({ baseUrl: GATEWAY, protocol: PROTOCOL });
    await assert.rejects(stranger.login(PLAYERS[0]?.username ?? "", "not-the-password"), (e: unknown) => e instanceof ConnectError && e.code === Code.Unauthenticated);
  });

  it("resume after a forced disconnect at every update of a round loses nothing and duplicates nothing", async () => {
    const reference = await login(GATEWAY, 0);
    const cut = await login(proxyUrl, 0);
    // The reference picks a round as it opens; the cut watch follows the same stretch live.
    let picked: (before: bigint) => void = () => undefined;
    const start = new Promise<bigint>((resolve) => (picked = resolve));
    const refDone = withTimeout(referenceRound(reference, picked), ROUND_TIMEOUT_MS, "the reference round");
    const startAfter = await withTimeout(start, ROUND_TIMEOUT_MS, "a round opening");
    const got: TableUpdate[] = [];
    const reasons: string[] = [];
    const t0 = Date.now();
    const watch = watchTable(cut, TABLE, {
      afterPosition: startAfter,
      backoffInitialMs: 50,
      backoffMaxMs: 500,
      onReconnect: (info) => reasons.push(`${info.reason}@${Date.now() - t0}ms`),
    });
    let roundOfInterest = "";
    await withTimeout(
      (async () => {
        for await (const u of watch) {
          got.push(u);
          proxy.cut(); // drop the link right after every update
          if (!roundOfInterest && kind(u) === "roundOpened") roundOfInterest = u.roundId;
          if (u.roundId === roundOfInterest && kind(u) === "seedRevealed") break;
        }
      })(),
      ROUND_TIMEOUT_MS,
      "the cut watch",
    );
    const ref = await refDone;
    assert.ok(ref.roundId, "the reference saw a whole round");
    const kinds = ref.updates.map(kind);
    for (const k of ["roundOpened", "myBetPlaced", "handRevealed", "result", "seedRevealed"]) assert.ok(kinds.includes(k), `the round has ${k}: ${kinds.join(",")}`);
    const positions = ref.updates.map((u) => u.position);
    for (let i = 1; i < positions.length; i++) assert.ok((positions[i] ?? 0n) > (positions[i - 1] ?? 0n), `positions strictly increase: ${positions.join(",")}`);
    assert.equal(ref.deadLinks, 0, "no dead link on a healthy connection (keepalives arrive)");
    assert.equal(roundOfInterest, ref.roundId);
    assert.deepEqual(got.map((u) => u.position), positions, "the same positions, in order, none missing, none twice");
    assert.deepEqual(got.map(content), ref.updates.map(content), "the same updates");
    console.log(`# resume: reconnects ${reasons.join(" ")}`);
    // A cut after every update; two updates that reached the client in one read are both
    // delivered before the cut shows, so there can be fewer reconnects than updates.
    assert.ok(watch.state.reconnects >= Math.ceil(got.length / 2), `reconnected after most updates (${watch.state.reconnects} for ${got.length})`);
    assert.equal(watch.state.deadLinks, 0, "a cut is seen as a broken link at once, not by the keepalive");
    console.log(`# resume: ${got.length} updates of round ${ref.roundId}, ${watch.state.reconnects} forced reconnects, ${watch.state.duplicatesDropped} duplicates dropped, ${proxy.cuts} cuts`);
  });

  it("keepalive: a link that goes silent is detected within 10 s and the watch resumes without a gap", async () => {
    const reference = await login(GATEWAY, 1);
    const client = await login(proxyUrl, 1);
    let frozenAt = 0;
    let detectedAfterMs = -1;
    const watch = watchTable(client, TABLE, {
      onReconnect: (info) => {
        if (info.reason === "dead_link" && detectedAfterMs < 0) detectedAfterMs = Date.now() - frozenAt;
      },
    });
    const got: TableUpdate[] = [];
    let refWatch: ReturnType<typeof watchTable> | undefined;
    let from = 0n;
    await withTimeout(
      (async () => {
        for await (const u of watch) {
          got.push(u);
          if (got.length === 2) {
            from = u.position;
            refWatch = watchTable(reference, TABLE, { afterPosition: from });
            proxy.freeze(); // the open connection stays open but carries nothing more
            frozenAt = Date.now();
          }
          if (detectedAfterMs >= 0 && got.length >= 8) break;
        }
      })(),
      60_000,
      "the frozen watch",
    );
    assert.ok(detectedAfterMs >= 0, "the dead link was detected");
    assert.ok(detectedAfterMs <= 10_000, `detected ${detectedAfterMs} ms after the link went silent (at most 10 s)`);
    assert.equal(watch.state.deadLinks, 1);
    const after = got.filter((u) => u.position > from);
    const want: TableUpdate[] = [];
    assert.ok(refWatch);
    for await (const u of refWatch) {
      want.push(u);
      if (want.length === after.length) break;
    }
    assert.deepEqual(after.map((u) => u.position), want.map((u) => u.position), "nothing lost or repeated across the dead link");
    console.log(`# keepalive: dead link detected after ${detectedAfterMs} ms; ${after.length} updates after it match the uncut stream`);
  });
});
