// Login and token refresh against an in-process Wallet/Table (Connect router transport).
import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createRouterTransport } from "@connectrpc/connect";

import { NiuniuClient } from "../../src/client.js";
import { Table, TableInfoSchema } from "../../src/gen/niuniu/table/v1/table_pb.js";
import { LoginResponseSchema, Wallet } from "../../src/gen/niuniu/wallet/v1/wallet_pb.js";

function fixture(ttlMs: number) {
  let issued = 0;
  const valid = new Set<string>();
  const seen: string[] = [];
  const state = { refuseAll: false };
  const client = new NiuniuClient({
    refreshMarginMs: 1000,
    transport: (interceptors) =>
      createRouterTransport(
        (router) => {
          router.service(Wallet, {
            login(req) {
              if (req.password !== "secret-pw") throw new ConnectError("INVALID_CREDENTIALS", Code.Unauthenticated);
              const token = `tok-${++issued}`;
              valid.add(token);
              return create(LoginResponseSchema, { token, role: "player", account: "player:1", expiresAtUnixMs: BigInt(Date.now() + ttlMs) });
            },
          });
          router.service(Table, {
            getTable(req, ctx) {
              const auth = ctx.requestHeader.get("authorization") ?? "";
              seen.push(auth);
              if (state.refuseAll || !valid.has(auth.replace("Bearer ", ""))) throw new ConnectError("TOKEN_EXPIRED", Code.Unauthenticated);
              return create(TableInfoSchema, { tableId: req.tableId });
            },
          });
        },
        { transport: { interceptors } },
      ),
  });
  return { client, seen, valid, state, issued: () => issued };
}

describe("session", () => {
  it("login puts the bearer token on later calls", async () => {
    const f = fixture(3_600_000);
    const session = await f.client.login("alice", "secret-pw");
    assert.equal(session.account, "player:1");
    await f.client.table.getTable({ tableId: "t" });
    assert.deepEqual(f.seen, ["Bearer tok-1"]);
    assert.equal(f.client.refreshes, 0);
  });

  it("a wrong password is UNAUTHENTICATED and leaves no session", async () => {
    const f = fixture(3_600_000);
    await assert.rejects(f.client.login("alice", "wrong"), (e: unknown) => e instanceof ConnectError && e.code === Code.Unauthenticated);
    assert.equal(f.client.session, undefined);
  });

  it("a token about to expire is renewed before the call", async () => {
    const f = fixture(500); // inside the 1 s margin
    await f.client.login("alice", "secret-pw");
    await f.client.table.getTable({ tableId: "t" });
    assert.deepEqual(f.seen, ["Bearer tok-2"]);
    assert.equal(f.client.refreshes, 1);
  });

  it("a token the server refuses is renewed once and the call sent again", async () => {
    const f = fixture(3_600_000);
    await f.client.login("alice", "secret-pw");
    f.valid.clear(); // e.g. the server's keys rotated
    await f.client.table.getTable({ tableId: "t" });
    assert.deepEqual(f.seen, ["Bearer tok-1", "Bearer tok-2"]);
    f.state.refuseAll = true;
    // still refused after one renewal: the error reaches the caller, no loop
    await assert.rejects(f.client.table.getTable({ tableId: "t" }), (e: unknown) => e instanceof ConnectError && e.code === Code.Unauthenticated);
    assert.equal(f.issued(), 3);
  });

  it("concurrent calls share one renewal", async () => {
    const f = fixture(500);
    await f.client.login("alice", "secret-pw");
    await Promise.all([1, 2, 3, 4].map(() => f.client.table.getTable({ tableId: "t" })));
    assert.equal(f.issued(), 2);
  });
});

describe("ServerClock", () => {
  it("estimates the server's clock from stamped messages (the least delayed sample wins)", async () => {
    const { ServerClock } = await import("../../src/client.js");
    const clock = new ServerClock();
    assert.equal(clock.synced, false);
    const local = 1_000_000;
    // The server is 5 s ahead; messages took 300, 40 and 120 ms to arrive.
    clock.observe(BigInt(local + 5000 - 300), local);
    clock.observe(BigInt(local + 5000 - 40), local);
    clock.observe(BigInt(local + 5000 - 120), local);
    assert.equal(clock.synced, true);
    assert.equal(clock.offset, 4960);
    const deadline = Date.now() + clock.offset + 2000;
    const left = clock.remainingMs(deadline);
    assert.ok(left > 1900 && left <= 2000, `${left}`);
    assert.equal(clock.remainingMs(0), 0);
    clock.observe(0n, local); // no server time: ignored
    assert.equal(clock.offset, 4960);
  });
});
