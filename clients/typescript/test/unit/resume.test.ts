// The resume and keepalive logic of watchTable against an in-process Table service (a
// Connect router transport: no network, the server's behaviour scripted per test).
import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createRouterTransport, type HandlerContext } from "@connectrpc/connect";

import { NiuniuClient } from "../../src/client.js";
import { PhaseChangedSchema, Table, TableUpdateSchema, type TableUpdate, type WatchTableRequest } from "../../src/gen/niuniu/table/v1/table_pb.js";
import { isNew, ResumeGapError, updateKey, watchTable } from "../../src/watch.js";

const N = 12;
const LOG: TableUpdate[] = Array.from({ length: N }, (_, i) =>
  create(TableUpdateSchema, {
    position: BigInt(i + 1),
    tableId: "t1",
    roundId: "r1",
    update: { case: "phaseChanged", value: create(PhaseChangedSchema, { phase: `step-${i + 1}` }) },
  }),
);

type Behaviour = (req: WatchTableRequest, call: number, ctx: HandlerContext) => AsyncIterable<TableUpdate>;

function clientFor(behaviour: Behaviour): { client: NiuniuClient; calls: WatchTableRequest[] } {
  const calls: WatchTableRequest[] = [];
  const client = new NiuniuClient({
    transport: (interceptors) =>
      createRouterTransport(
        (router) => {
          router.service(Table, {
            watchTable(req, ctx) {
              calls.push(req);
              return behaviour(req, calls.length, ctx);
            },
          });
        },
        { transport: { interceptors } },
      ),
  });
  return { client, calls };
}

async function collect(iter: AsyncIterable<TableUpdate>, n: number): Promise<bigint[]> {
  const got: bigint[] = [];
  for await (const u of iter) {
    got.push(u.position);
    if (got.length === n) break;
  }
  return got;
}

const all = LOG.map((u) => u.position);
const after = (req: WatchTableRequest): TableUpdate[] => LOG.filter((u) => u.position > req.afterPosition);
const hang = (ctx: HandlerContext): Promise<void> => new Promise((resolve) => ctx.signal.addEventListener("abort", () => resolve()));

describe("watchTable resume", () => {
  it("a link dropped after every single update loses and duplicates nothing", async () => {
    const { client, calls } = clientFor(async function* (req) {
      const next = after(req)[0];
      if (next) yield next;
      throw new ConnectError("link dropped", Code.Unavailable);
    });
    const watch = watchTable(client, "t1", { backoffInitialMs: 1, backoffMaxMs: 1 });
    assert.deepEqual(await collect(watch, N), all);
    assert.deepEqual(calls.map((c) => c.afterPosition), all.map((p) => p - 1n));
    assert.equal(watch.state.reconnects, N - 1);
  });

  for (const cut of [0, 1, 5, N - 1]) {
    it(`a server that replays from an older position (at least once) after a drop at ${cut}: duplicates dropped`, async () => {
      const { client } = clientFor(async function* (req, call) {
        const from = call === 1 ? 0n : req.afterPosition - 2n; // resends two old updates
        for (const u of LOG.filter((x) => x.position > from)) {
          if (call === 1 && u.position > BigInt(cut)) throw new ConnectError("gone", Code.Unavailable);
          yield u;
        }
      });
      const watch = watchTable(client, "t1", { backoffInitialMs: 1 });
      assert.deepEqual(await collect(watch, N), all);
      assert.equal(watch.state.duplicatesDropped, Math.min(2, cut));
    });
  }

  it("a server that closes the stream cleanly is resumed too", async () => {
    const { client } = clientFor(async function* (req) {
      yield* after(req).slice(0, 3);
    });
    assert.deepEqual(await collect(watchTable(client, "t1", { backoffInitialMs: 1 }), N), all);
  });

  it("silence beyond the keepalive timeout is a dead link: reconnected from the last position", async () => {
    const reasons: string[] = [];
    const { client, calls } = clientFor(async function* (req, call, ctx) {
      for (const u of after(req)) {
        if (call === 1 && u.position === 4n) {
          await hang(ctx); // the link goes silent: no error, no close
          return;
        }
        yield u;
      }
    });
    const watch = watchTable(client, "t1", { keepaliveTimeoutMs: 150, onReconnect: (i) => reasons.push(i.reason) });
    assert.deepEqual(await collect(watch, N), all);
    assert.deepEqual(reasons, ["dead_link"]);
    assert.equal(calls[1]?.afterPosition, 3n);
    assert.equal(watch.state.deadLinks, 1);
  });

  it("keepalives keep a quiet link alive and are not delivered as updates", async () => {
    // 1.2 s of silence between updates, longer than the 1 s timeout: only the keepalives, every
    // 300 ms, keep the link alive. The margins are wide (a stall of 700 ms would be needed to
    // fail) because the test suite may share a busy machine: 60 ms against 150 ms did fail there.
    let keepalives = 0;
    const { client } = clientFor(async function* (req) {
      for (const u of after(req)) {
        for (let k = 0; k < 4; k++) {
          await new Promise((r) => setTimeout(r, 300));
          yield create(TableUpdateSchema, { position: 0n, tableId: "t1" }); // no event: a keepalive
        }
        yield u;
      }
    });
    const watch = watchTable(client, "t1", { keepaliveTimeoutMs: 1_000, onKeepalive: () => keepalives++ });
    assert.deepEqual(await collect(watch, 3), all.slice(0, 3));
    assert.equal(watch.state.deadLinks, 0);
    assert.equal(keepalives, 12);
  });

  it("OUT_OF_RANGE on resume is a ResumeGapError, not an endless retry", async () => {
    const { client, calls } = clientFor(async function* (req) {
      if (req.afterPosition > 0n) throw new ConnectError("position 2 is gone", Code.OutOfRange);
      yield* LOG.slice(0, 2);
      throw new ConnectError("drop", Code.Unavailable);
    });
    const watch = watchTable(client, "t1", { backoffInitialMs: 1 });
    await assert.rejects(collect(watch, N), (e: unknown) => e instanceof ResumeGapError && e.afterPosition === 2n);
    assert.equal(calls.length, 2);
  });

  it("a permanent refusal (NOT_FOUND) is thrown to the caller", async () => {
    const { client } = clientFor(async function* () {
      yield* [];
      throw new ConnectError("no such table", Code.NotFound);
    });
    await assert.rejects(collect(watchTable(client, "t1"), 1), (e: unknown) => e instanceof ConnectError && e.code === Code.NotFound);
  });

  it("aborting the signal ends the iteration and does not reconnect", async () => {
    const abort = new AbortController();
    const { client, calls } = clientFor(async function* (_req, _call, ctx) {
      yield LOG[0] as TableUpdate;
      await hang(ctx);
    });
    const got: bigint[] = [];
    for await (const u of watchTable(client, "t1", { signal: abort.signal, backoffInitialMs: 1 })) {
      got.push(u.position);
      abort.abort();
    }
    assert.deepEqual(got, [1n]);
    await new Promise((r) => setTimeout(r, 50));
    assert.equal(calls.length, 1);
  });

  it("isNew: after the last position, or another update at the last position", () => {
    const u = LOG[4] as TableUpdate;
    assert.equal(isNew(u, 4n), true);
    assert.equal(isNew(u, 6n), false);
    assert.equal(isNew(u, 5n), false, "nothing delivered at 5 yet is known: a resume after 5 excludes 5");
    assert.equal(isNew(u, 5n, new Set([updateKey(u)])), false, "the same update again");
    const other = create(TableUpdateSchema, { ...u, update: { case: "phaseChanged", value: create(PhaseChangedSchema, { phase: "other" }) } });
    assert.equal(isNew(other, 5n, new Set([updateKey(u)])), true, "a second update sharing position 5");
  });

  it("updates sharing a position (an older server) are all delivered, once each across a resume", async () => {
    const shared = [LOG[0], LOG[1], { ...LOG[1], update: { case: "phaseChanged" as const, value: create(PhaseChangedSchema, { phase: "x" }) } }, LOG[2]].map((u) =>
      create(TableUpdateSchema, u as TableUpdate),
    );
    const { client } = clientFor(async function* (req, call) {
      // the first link drops after the first update at position 2; the resume (after 2) repeats none of them
      for (const u of shared.filter((x) => x.position > req.afterPosition)) {
        yield u;
        if (call === 1 && u.position === 2n) throw new ConnectError("drop", Code.Unavailable);
      }
    });
    const got = await collect(watchTable(client, "t1", { backoffInitialMs: 1 }), 3);
    assert.deepEqual(got, [1n, 2n, 3n], "the second update at 2 is lost by the server's resume, but nothing is duplicated");
    const { client: again } = clientFor(async function* () {
      yield* shared;
    });
    const all4 = await collect(watchTable(again, "t1", { backoffInitialMs: 1 }), 4);
    assert.deepEqual(all4, [1n, 2n, 2n, 3n], "both updates at position 2 delivered on an unbroken stream");
  });
});
