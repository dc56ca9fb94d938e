// A Node program that watches a table with the built SDK and stops watching in one of the
// ways a consumer does, then does nothing more: it must exit on its own (no process.exit),
// which it can only do once the watch's fetch is aborted. Run by
// tests/clients/test_sdk_watch_exit.py, which times it.
//
// Input (environment): NIUNIU_SDK_GATEWAY, NIUNIU_SDK_TABLE, NIUNIU_SDK_USERNAME,
// NIUNIU_SDK_PASSWORD, NIUNIU_SDK_STOP ("break": leave a for-await loop; "return": call
// the iterator's return() while its next() is still waiting for an update; "abort": abort
// the signal while the next() waits).
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const { NiuniuClient, watchTable } = await import(path.join(here, "../../../clients/typescript/dist/src/index.js"));

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
};
const tableId = env("NIUNIU_SDK_TABLE");
const how = env("NIUNIU_SDK_STOP");
const client = new NiuniuClient({ baseUrl: env("NIUNIU_SDK_GATEWAY") });
await client.login(env("NIUNIU_SDK_USERNAME"), env("NIUNIU_SDK_PASSWORD"));

const stop = new AbortController();
const watch = watchTable(client, tableId, { signal: stop.signal });
let first = "";
if (how === "break") {
  for await (const update of watch) {
    first = update.update.case ?? "";
    break;
  }
} else {
  // Up to the betting window's opening: after it the stream is quiet but for heartbeats.
  for (let u = await watch.next(); !u.done; u = await watch.next()) {
    first ||= u.value.update.case ?? "";
    if (u.value.update.case === "phaseChanged" && u.value.update.value.phase === "betting") break;
  }
  const waiting = watch.next();
  await new Promise((resolve) => setTimeout(resolve, 300));
  if (how === "return") await watch.return(undefined);
  else stop.abort(new Error("the consumer stopped"));
  const last = await waiting;
  if (!last.done) throw new Error(`an update came while the window was open: ${last.value.update.case}`);
}
client.logout?.();
console.log(JSON.stringify({ how, first, stopped: Date.now() }));
