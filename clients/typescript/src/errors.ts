/**
 * Refusals: every error the services or the gateway answer keeps its gRPC code and carries a
 * stable reason code (BETTING_CLOSED, INSUFFICIENT_FUNDS, METHOD_NOT_EXPOSED ...) in the
 * `niuniu-reason` metadata, which connect-web puts in `ConnectError.metadata` whatever the
 * protocol (a Connect error's headers, a Connect stream's end message, gRPC-web trailers).
 * The message starts with the same code ("BETTING_CLOSED: ..."), the fallback used here.
 */
import { ConnectError } from "@connectrpc/connect";

export const REASON_KEY = "niuniu-reason";

/** The stable reason code of an error ("" for an error that carries none, such as a network failure). */
export function reasonOf(error: unknown): string {
  if (!(error instanceof ConnectError)) return "";
  const sent = error.metadata.get(REASON_KEY) ?? error.metadata.get(`trailer-${REASON_KEY}`);
  if (sent) return sent;
  return /^([A-Z][A-Z0-9_]+)(?::|$)/.exec(error.rawMessage)?.[1] ?? "";
}
