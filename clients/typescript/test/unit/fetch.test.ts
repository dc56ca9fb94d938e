// The transports' fetch: aborting a streaming response's signal closes its connection even
// after a garbage collection (Node's own fetch then loses the abort of a `redirect: "error"`
// request, and the open socket keeps the process alive).
import assert from "node:assert/strict";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { describe, it } from "node:test";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";

import { abortableFetch } from "../../src/fetch.js";

setFlagsFromString("--expose-gc");
const gc = runInNewContext("gc") as () => void;

/** A server that streams a chunk now and then forever; `closed` settles when the client's connection goes. */
async function streamingServer(): Promise<{ url: string; closed: Promise<void>; stop: () => void }> {
  let closed!: () => void;
  const done = new Promise<void>((resolve) => (closed = resolve));
  const server = http.createServer((req, res) => {
    req.resume();
    res.writeHead(200, { "content-type": "application/connect+json" });
    res.write("first");
    const beat = setInterval(() => res.write("beat"), 50);
    res.on("close", () => {
      clearInterval(beat);
      closed();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return { url: `http://127.0.0.1:${port}/`, closed: done, stop: () => server.close() };
}

/** What `promise` came to, or `pending` if it has not settled within 10 s (a bound, not a timing). */
async function outcome(promise: Promise<unknown>, pending: string): Promise<string> {
  let wait: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<string>((resolve) => (wait = setTimeout(() => resolve(pending), 10_000)));
  const settled = promise.then(
    (value) => String(value),
    (error: unknown) => `rejected: ${(error as Error).message}`,
  );
  try {
    return await Promise.race([settled, timeout]);
  } finally {
    clearTimeout(wait);
  }
}

describe("abortableFetch", () => {
  it("closes a streaming response's connection when its signal aborts after a garbage collection", async () => {
    const server = await streamingServer();
    const fetch = abortableFetch(() => globalThis.fetch);
    const stop = new AbortController();
    const response = await fetch(server.url, { method: "POST", body: "watch", redirect: "error", signal: stop.signal });
    const reader = response.body!.getReader();
    assert.equal((await reader.read()).done, false);
    const rest = (async () => {
      while (!(await reader.read()).done);
      return "ended";
    })();
    for (let i = 0; i < 5; i++) {
      gc();
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    stop.abort(new Error("the consumer stopped"));
    try {
      assert.equal(await outcome(rest, "still reading"), "rejected: the consumer stopped");
      assert.equal(await outcome(server.closed.then(() => "closed"), "still open"), "closed");
    } finally {
      await reader.cancel().catch(() => undefined);
      server.stop();
    }
  });

  it("hands a response that ends, and one without a signal, through unchanged", async () => {
    const server = http.createServer((req, res) => {
      req.resume();
      res.end("whole");
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/`;
    const fetch = abortableFetch(() => globalThis.fetch);
    const signalled = await fetch(url, { signal: new AbortController().signal, headers: { connection: "close" } });
    assert.equal(signalled.status, 200);
    assert.equal(await signalled.text(), "whole");
    const plain = await fetch(url, { headers: { connection: "close" } });
    assert.equal(await plain.text(), "whole");
    server.close();
  });
});
