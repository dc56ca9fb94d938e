/**
 * The hand-written layer over the generated clients: one object holding the transport,
 * the player's session (login, token refresh before expiry and once on UNAUTHENTICATED)
 * and a clock synchronised with the server's.
 */
import { Code, ConnectError, createClient, type Client, type Interceptor, type Transport } from "@connectrpc/connect";
import { createConnectTransport, createGrpcWebTransport } from "@connectrpc/connect-web";

import { abortableFetch } from "./fetch.js";
import { Table } from "./gen/niuniu/table/v1/table_pb.js";
import { Wallet, type LoginResponse } from "./gen/niuniu/wallet/v1/wallet_pb.js";

export type Protocol = "connect" | "grpc-web";

export interface ClientOptions {
  /**
   * The browser gateway's base URL: "http://127.0.0.1:8080" for `scripts/up`. Empty (the
   * default) calls the page's own origin, for a page the gateway serves.
   */
  baseUrl?: string;
  /** Wire protocol the gateway speaks; "connect" by default. */
  protocol?: Protocol;
  /** Renew the token this long before it expires (default 60 s). */
  refreshMarginMs?: number;
  /** A custom fetch (tests route it through a proxy or count calls). */
  fetch?: typeof globalThis.fetch;
  /**
   * A transport of your own instead of one built from baseUrl/protocol; it must install
   * the interceptors it is given (they add the token) and close a response whose request
   * is aborted (see fetch.ts: the SDK's own transports do).
   */
  transport?: (interceptors: Interceptor[]) => Transport;
  /**
   * How to get a fresh token when the current one is near expiry or refused. Default: log
   * in again with the credentials given to `login` (kept in memory only).
   */
  refresh?: () => Promise<{ token: string; expiresAtUnixMs: bigint }>;
}

export interface Session {
  token: string;
  role: string;
  accountId: string;
  /** "player:<id>" for players. */
  account: string;
  expiresAtUnixMs: bigint;
}

/** The server's clock as seen from here: `now()` = local time + the offset the server's timestamps give. */
export class ServerClock {
  private recent: number[] = [];

  /**
   * Feed a server timestamp received just now (each stream update carries one). A message
   * is stamped before it travels, so `server - local` underestimates the true offset by the
   * delay: the largest of the recent samples is the best estimate.
   */
  observe(serverUnixMs: bigint | number, localUnixMs = Date.now()): void {
    const server = Number(serverUnixMs);
    if (!Number.isFinite(server) || server <= 0) return;
    this.recent.push(server - localUnixMs);
    if (this.recent.length > 20) this.recent.shift();
  }

  private get offsetMs(): number {
    return this.recent.length === 0 ? 0 : Math.max(...this.recent);
  }

  get synced(): boolean {
    return this.recent.length > 0;
  }

  get offset(): number {
    return this.offsetMs;
  }

  now(): number {
    return Date.now() + this.offsetMs;
  }

  /** Milliseconds left until a server deadline (never negative). */
  remainingMs(deadlineUnixMs: bigint | number): number {
    return Math.max(0, Number(deadlineUnixMs) - this.now());
  }
}

export class NiuniuClient {
  readonly transport: Transport;
  readonly table: Client<typeof Table>;
  readonly wallet: Client<typeof Wallet>;
  readonly clock = new ServerClock();
  /** Token renewals so far (tests and UIs may show it). */
  refreshes = 0;
  private current: Session | undefined;
  private credentials: { username: string; password: string } | undefined;
  private inflight: Promise<void> | undefined;
  private readonly refreshMarginMs: number;
  private readonly customRefresh: ClientOptions["refresh"];

  constructor(options: ClientOptions) {
    this.refreshMarginMs = options.refreshMarginMs ?? 60_000;
    this.customRefresh = options.refresh;
    const interceptors = [this.authInterceptor()];
    // Looked up at each call, as the transports do, so a fetch installed later is used.
    const fetch = abortableFetch(() => options.fetch ?? globalThis.fetch);
    this.transport =
      options.transport?.(interceptors) ??
      (options.protocol === "grpc-web"
        ? createGrpcWebTransport({ baseUrl: options.baseUrl ?? "", interceptors, fetch, useBinaryFormat: true })
        : createConnectTransport({ baseUrl: options.baseUrl ?? "", interceptors, fetch }));
    this.table = createClient(Table, this.transport);
    this.wallet = createClient(Wallet, this.transport);
  }

  get session(): Session | undefined {
    return this.current;
  }

  /** Log in with a username and password; later calls carry the token, renewed before it expires. */
  async login(username: string, password: string): Promise<Session> {
    const reply = await this.wallet.login({ username, password });
    this.credentials = { username, password };
    this.current = sessionOf(reply);
    return this.current;
  }

  logout(): void {
    this.current = undefined;
    this.credentials = undefined;
  }

  /** Renew the token now (single flight: concurrent callers share one renewal). */
  async refresh(): Promise<void> {
    this.inflight ??= (async () => {
      try {
        if (this.customRefresh) {
          const fresh = await this.customRefresh();
          if (!this.current) throw new ConnectError("not logged in", Code.Unauthenticated);
          this.current = { ...this.current, token: fresh.token, expiresAtUnixMs: fresh.expiresAtUnixMs };
        } else {
          if (!this.credentials) throw new ConnectError("not logged in", Code.Unauthenticated);
          this.current = sessionOf(await this.wallet.login(this.credentials));
        }
        this.refreshes++;
      } finally {
        this.inflight = undefined;
      }
    })();
    return this.inflight;
  }

  private needsRefresh(): boolean {
    const s = this.current;
    return s !== undefined && Number(s.expiresAtUnixMs) - Date.now() < this.refreshMarginMs;
  }

  private authInterceptor(): Interceptor {
    return (next) => async (req) => {
      if (req.service.typeName === Wallet.typeName && (req.method.name === "Login" || req.method.name === "Register")) {
        return next(req);
      }
      if (this.needsRefresh()) await this.refresh();
      const sent = this.current?.token;
      if (sent) req.header.set("authorization", `Bearer ${sent}`);
      try {
        return await next(req);
      } catch (error) {
        const refusedToken = ConnectError.from(error).code === Code.Unauthenticated && sent !== undefined;
        // A unary request can be sent again; a stream's caller (watchTable) retries by itself.
        if (!refusedToken || req.stream || (!this.credentials && !this.customRefresh)) throw error;
        if (this.current?.token === sent) await this.refresh();
        req.header.set("authorization", `Bearer ${this.current?.token ?? ""}`);
        return await next(req);
      }
    };
  }
}

function sessionOf(reply: LoginResponse): Session {
  return {
    token: reply.token,
    role: reply.role,
    accountId: reply.accountId,
    account: reply.account,
    expiresAtUnixMs: reply.expiresAtUnixMs,
  };
}
