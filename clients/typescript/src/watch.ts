/**
 * WatchTable with automatic resume and a keepalive.
 *
 * The stream contract (docs/api/frontend/stream.md): every update has its own strictly
 * increasing `position`; a resume with `after_position = p` delivers everything after p, or
 * fails at once with OUT_OF_RANGE when p is unknown; every update carries the server time
 * and the server sends a keepalive when nothing else happens. This module:
 *
 * - remembers the last position delivered and, when the link drops (an error, the server
 *   closing, or silence longer than `keepaliveTimeoutMs`), reconnects with that position,
 *   backing off 0.2 s .. 3 s;
 * - never delivers a position twice or out of order (an update at or below the last one is
 *   dropped), so a consumer sees each update exactly once across reconnects;
 * - feeds every update's server time to the client's clock (countdowns);
 * - surfaces OUT_OF_RANGE as a `ResumeGapError` (reload the table with GetTable/GetRound
 *   and watch again from 0), and other refusals (NOT_FOUND, PERMISSION_DENIED...) as is.
 */
import { clone, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";

import type { NiuniuClient } from "./client.js";
import { TableUpdateSchema, type TableUpdate } from "./gen/niuniu/table/v1/table_pb.js";

export interface WatchOptions {
  /** Resume after this position (0n: from the current round's opening). */
  afterPosition?: bigint;
  /** Silence (no update, no keepalive) after which the link is declared dead. Default 8000 ms. */
  keepaliveTimeoutMs?: number;
  /** Stop watching. */
  signal?: AbortSignal;
  /** Called before each reconnect with the position it resumes after and why. */
  onReconnect?: (info: ReconnectInfo) => void;
  /** Called for every keepalive (updates that carry no game event). */
  onKeepalive?: (update: TableUpdate) => void;
  /** Deliver keepalives to the iterator too (default false). */
  yieldKeepalives?: boolean;
  backoffInitialMs?: number;
  backoffMaxMs?: number;
}

export interface ReconnectInfo {
  afterPosition: bigint;
  attempt: number;
  reason: "dead_link" | "error" | "ended";
  error?: ConnectError;
}

/** The stream's silence exceeded the keepalive timeout: the link is treated as dead. */
export class DeadLinkError extends Error {
  override name = "DeadLinkError";
}

/** The server no longer has the position we resume after (OUT_OF_RANGE): reload and watch again from 0. */
export class ResumeGapError extends Error {
  override name = "ResumeGapError";
  constructor(
    readonly afterPosition: bigint,
    readonly cause: ConnectError,
  ) {
    super(`cannot resume after position ${afterPosition}: ${cause.rawMessage}`);
  }
}

/** Codes that a reconnect cannot fix. */
const PERMANENT = new Set<Code>([
  Code.InvalidArgument,
  Code.NotFound,
  Code.PermissionDenied,
  Code.Unimplemented,
  Code.FailedPrecondition,
  Code.OutOfRange,
]);

/** A keepalive: an update without a game event (no member of the `update` oneof, or `heartbeat`). */
export function isKeepalive(update: TableUpdate): boolean {
  const kind = update.update.case as string | undefined;
  return kind === undefined || kind === "heartbeat" || kind === "keepalive";
}

/** The server time an update carries, when the server sends one. */
export function serverTimeOf(update: TableUpdate): bigint | undefined {
  const t = (update as { serverTimeUnixMs?: bigint }).serverTimeUnixMs;
  return t !== undefined && t > 0n ? t : undefined;
}

/**
 * Whether an update is new given the last position delivered: pure, so unit-testable.
 * Strictly after `last` is new; before it is a duplicate. At `last` itself (a server that
 * gives several updates one position, as before the stream contract) it is new unless the
 * same update was already delivered there (`seenAtLast`: their `updateKey`s).
 */
export function isNew(update: TableUpdate, last: bigint, seenAtLast: ReadonlySet<string> = new Set()): boolean {
  if (update.position !== last) return update.position > last;
  return last > 0n && seenAtLast.size > 0 && !seenAtLast.has(updateKey(update));
}

/** An update's content without its delivery time: equal for two deliveries of one update. */
export function updateKey(update: TableUpdate): string {
  const c = clone(TableUpdateSchema, update);
  Reflect.set(c, "serverTimeUnixMs", 0n);
  return Array.from(toBinary(TableUpdateSchema, c), (b) => b.toString(16).padStart(2, "0")).join("");
}

export interface WatchState {
  /** The last position delivered: where the next reconnect resumes. */
  lastPosition: bigint;
  reconnects: number;
  deadLinks: number;
  duplicatesDropped: number;
}

/**
 * Watch a table: an async iterator of its updates that survives dropped links. Break out
 * of the loop, call `return()` or abort `signal` to stop: the stream's fetch is aborted at
 * once, even while a `next()` still waits for an update (which then ends the iteration),
 * so nothing of the watch keeps a Node process alive.
 */
export function watchTable(client: NiuniuClient, tableId: string, options: WatchOptions = {}): AsyncGenerator<TableUpdate> & { state: WatchState } {
  const state: WatchState = { lastPosition: options.afterPosition ?? 0n, reconnects: 0, deadLinks: 0, duplicatesDropped: 0 };
  // The watch's own signal: the caller's, or the consumer's return(). A generator's return()
  // waits for a pending next(), which may wait for minutes of heartbeats: abort first.
  const halt = new AbortController();
  const follow = (): void => halt.abort(options.signal?.reason);
  if (options.signal?.aborted) follow();
  else options.signal?.addEventListener("abort", follow, { once: true });
  const generator = run(client, tableId, { ...options, signal: halt.signal }, state) as AsyncGenerator<TableUpdate> & { state: WatchState };
  const finish = generator.return.bind(generator);
  generator.return = (value) => {
    options.signal?.removeEventListener("abort", follow);
    halt.abort(new Error("the consumer stopped watching"));
    return finish(value);
  };
  generator.state = state;
  return generator;
}

async function* run(client: NiuniuClient, tableId: string, options: WatchOptions, state: WatchState): AsyncGenerator<TableUpdate> {
  const timeoutMs = options.keepaliveTimeoutMs ?? 8000;
  const initialBackoff = options.backoffInitialMs ?? 200;
  const maxBackoff = options.backoffMaxMs ?? 3000;
  let failures = 0;
  const seenAtLast = new Set<string>();
  while (!options.signal?.aborted) {
    const attempt = new AbortController();
    const stop = (): void => attempt.abort(options.signal?.reason);
    options.signal?.addEventListener("abort", stop, { once: true });
    let timer: ReturnType<typeof setTimeout> | undefined;
    let dead = false;
    const arm = (): void => {
      clearTimeout(timer);
      timer = setTimeout(() => {
        dead = true;
        attempt.abort(new DeadLinkError(`no update or keepalive for ${timeoutMs} ms`));
      }, timeoutMs);
    };
    let reason: ReconnectInfo["reason"] = "ended";
    let failure: ConnectError | undefined;
    try {
      arm();
      const stream = client.table.watchTable({ tableId, afterPosition: state.lastPosition }, { signal: attempt.signal });
      for await (const update of stream) {
        arm();
        failures = 0;
        const serverTime = serverTimeOf(update);
        if (serverTime !== undefined) client.clock.observe(serverTime);
        if (isKeepalive(update)) {
          options.onKeepalive?.(update);
          if (options.yieldKeepalives) yield update;
          continue;
        }
        if (!isNew(update, state.lastPosition, seenAtLast)) {
          state.duplicatesDropped++;
          continue;
        }
        if (update.position !== state.lastPosition) seenAtLast.clear();
        seenAtLast.add(updateKey(update));
        state.lastPosition = update.position;
        yield update;
      }
    } catch (error) {
      if (options.signal?.aborted) return;
      const e = ConnectError.from(error);
      if (dead) {
        reason = "dead_link";
        state.deadLinks++;
      } else {
        reason = "error";
        failure = e;
        if (e.code === Code.OutOfRange) throw new ResumeGapError(state.lastPosition, e);
        if (PERMANENT.has(e.code)) throw e;
        if (e.code === Code.Unauthenticated) await client.refresh();
      }
    } finally {
      clearTimeout(timer);
      options.signal?.removeEventListener("abort", stop);
      attempt.abort();
    }
    if (options.signal?.aborted) return;
    failures++;
    state.reconnects++;
    options.onReconnect?.({ afterPosition: state.lastPosition, attempt: failures, reason, error: failure });
    const backoff = reason === "dead_link" && failures === 1 ? 0 : Math.min(maxBackoff, initialBackoff * 2 ** (failures - 1));
    await sleep(backoff, options.signal);
  }
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (ms <= 0 || signal?.aborted) return resolve();
    const t = setTimeout(done, ms);
    function done(): void {
      clearTimeout(t);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });
}
