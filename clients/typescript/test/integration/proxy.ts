// A TCP proxy the tests can cut (close every connection at once) or freeze (keep the
// connections open but forward nothing more, as a dead link or a silent NAT drop does).
import net from "node:net";

interface Pair {
  client: net.Socket;
  upstream: net.Socket;
  frozen: boolean;
}

export class CuttableProxy {
  private server = net.createServer((client) => this.accept(client));
  private pairs = new Set<Pair>();
  connections = 0;
  cuts = 0;

  constructor(
    private readonly upstreamHost: string,
    private readonly upstreamPort: number,
  ) {}

  static forUrl(url: string): CuttableProxy {
    const u = new URL(url);
    return new CuttableProxy(u.hostname, Number(u.port || 80));
  }

  async listen(): Promise<string> {
    await new Promise<void>((resolve) => this.server.listen(0, "127.0.0.1", resolve));
    const address = this.server.address() as net.AddressInfo;
    return `http://127.0.0.1:${address.port}`;
  }

  private accept(client: net.Socket): void {
    this.connections++;
    const upstream = net.connect(this.upstreamPort, this.upstreamHost);
    const pair: Pair = { client, upstream, frozen: false };
    this.pairs.add(pair);
    const forward = (from: net.Socket, to: net.Socket): void => {
      from.on("data", (chunk) => {
        if (!pair.frozen && !to.destroyed) to.write(chunk);
      });
      from.on("end", () => {
        if (!pair.frozen) to.end();
      });
      from.on("error", () => to.destroy());
      from.on("close", () => {
        if (pair.frozen) return; // a frozen link stays half dead until close()
        to.destroy();
        this.pairs.delete(pair);
      });
    };
    forward(client, upstream);
    forward(upstream, client);
  }

  /** Close every open connection now (both sides see a reset). */
  cut(): void {
    this.cuts++;
    for (const p of this.pairs) {
      if (p.frozen) continue;
      p.client.resetAndDestroy();
      p.upstream.destroy();
    }
    for (const p of this.pairs) if (!p.frozen) this.pairs.delete(p);
  }

  /** Stop forwarding on every open connection without closing it; new connections still work. */
  freeze(): void {
    for (const p of this.pairs) p.frozen = true;
  }

  async close(): Promise<void> {
    for (const p of this.pairs) {
      p.client.destroy();
      p.upstream.destroy();
    }
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}
