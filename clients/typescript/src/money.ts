/**
 * Money is integer minor units everywhere in the API (int64, a `bigint` in the generated
 * code). These helpers format and parse it exactly, with bigint arithmetic only: no
 * floating point ever touches an amount.
 */

export type Minor = bigint | number;

export interface MoneyFormat {
  /** Digits after the decimal point: 2 (the default) for cents. */
  decimals?: number;
  /** Thousands separator, "," by default ("" for none). */
  group?: string;
  /** Decimal point, "." by default. */
  point?: string;
  /** Prefix such as "¥" or "USD " (after the sign). */
  symbol?: string;
  /** Always show the sign ("+12.00", "-3.50", "0.00"): for a round's net result. */
  signed?: boolean;
}

export class MoneyError extends Error {
  override name = "MoneyError";
}

function toBigInt(minor: Minor): bigint {
  if (typeof minor === "bigint") return minor;
  if (!Number.isSafeInteger(minor)) throw new MoneyError(`an amount in minor units is an integer, got ${minor}`);
  return BigInt(minor);
}

/** `formatMoney(123456n)` = "1,234.56"; `formatMoney(-5n)` = "-0.05"; `formatMoney(250n, {signed: true})` = "+2.50". */
export function formatMoney(minor: Minor, format: MoneyFormat = {}): string {
  const decimals = format.decimals ?? 2;
  if (!Number.isInteger(decimals) || decimals < 0 || decimals > 18) throw new MoneyError(`decimals is 0..18, got ${decimals}`);
  const group = format.group ?? ",";
  const point = format.point ?? ".";
  const value = toBigInt(minor);
  const negative = value < 0n;
  const digits = (negative ? -value : value).toString().padStart(decimals + 1, "0");
  const whole = digits.slice(0, digits.length - decimals);
  const fraction = digits.slice(digits.length - decimals);
  const grouped = group ? whole.replace(/\B(?=(\d{3})+(?!\d))/g, group) : whole;
  const sign = negative ? "-" : format.signed && value > 0n ? "+" : "";
  return `${sign}${format.symbol ?? ""}${grouped}${decimals > 0 ? point + fraction : ""}`;
}

/** The inverse for user input: "1,234.5" -> 123450n. Refuses more decimals than the currency has. */
export function parseMoney(text: string, decimals = 2): bigint {
  const cleaned = text.trim().replace(/,/g, "");
  const m = /^([+-]?)(\d+)(?:\.(\d*))?$/.exec(cleaned);
  if (!m) throw new MoneyError(`not an amount: ${JSON.stringify(text)}`);
  const fraction = m[3] ?? "";
  if (fraction.length > decimals) throw new MoneyError(`at most ${decimals} decimals: ${JSON.stringify(text)}`);
  const value = BigInt((m[2] ?? "0") + fraction.padEnd(decimals, "0"));
  return m[1] === "-" ? -value : value;
}

/**
 * A stake as chips, largest first (`[1000n, 500n, 100n]` make 1600n as 1000+500+100).
 * Returns null when the chips cannot make the amount exactly.
 */
export function toChips(amount: Minor, chips: readonly Minor[]): bigint[] | null {
  let left = toBigInt(amount);
  const sorted = chips.map(toBigInt).filter((c) => c > 0n).sort((a, b) => (a > b ? -1 : a < b ? 1 : 0));
  const out: bigint[] = [];
  for (const chip of sorted) {
    while (left >= chip) {
      out.push(chip);
      left -= chip;
    }
  }
  return left === 0n ? out : null;
}
