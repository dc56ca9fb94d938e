import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { formatMoney, MoneyError, parseMoney, toChips } from "../../src/money.js";

describe("formatMoney", () => {
  it("formats minor units exactly, with grouping and sign", () => {
    assert.equal(formatMoney(0n), "0.00");
    assert.equal(formatMoney(5n), "0.05");
    assert.equal(formatMoney(100n), "1.00");
    assert.equal(formatMoney(123456n), "1,234.56");
    assert.equal(formatMoney(-123456789n), "-1,234,567.89");
    assert.equal(formatMoney(-5n), "-0.05");
    assert.equal(formatMoney(250, { signed: true }), "+2.50");
    assert.equal(formatMoney(0n, { signed: true }), "0.00");
    assert.equal(formatMoney(-250n, { signed: true, symbol: "¥" }), "-¥2.50");
    assert.equal(formatMoney(1234567n, { group: " ", point: ",", decimals: 3 }), "1 234,567");
    assert.equal(formatMoney(42n, { decimals: 0 }), "42");
  });

  it("is exact beyond the range of doubles (10^15 and int64 extremes)", () => {
    assert.equal(formatMoney(10n ** 15n), "10,000,000,000,000.00");
    assert.equal(formatMoney(9007199254740993n), "90,071,992,547,409.93");
    assert.equal(formatMoney(-(2n ** 63n)), "-92,233,720,368,547,758.08");
  });

  it("refuses non-integer numbers", () => {
    assert.throws(() => formatMoney(1.5), MoneyError);
    assert.throws(() => formatMoney(Number.MAX_SAFE_INTEGER + 2), MoneyError);
  });
});

describe("parseMoney", () => {
  it("parses what formatMoney prints, back to the same minor units", () => {
    for (const v of [0n, 5n, 100n, 123456n, -123456789n, 10n ** 15n]) assert.equal(parseMoney(formatMoney(v)), v);
    assert.equal(parseMoney("12"), 1200n);
    assert.equal(parseMoney("12.3"), 1230n);
    assert.equal(parseMoney(" +0.07 "), 7n);
  });

  it("refuses garbage and too many decimals", () => {
    assert.throws(() => parseMoney("1.234"), MoneyError);
    assert.throws(() => parseMoney("abc"), MoneyError);
    assert.throws(() => parseMoney("1e3"), MoneyError);
  });
});

describe("toChips", () => {
  it("makes a stake from chips, largest first, or says it cannot", () => {
    assert.deepEqual(toChips(1600n, [100n, 500n, 1000n]), [1000n, 500n, 100n]);
    assert.deepEqual(toChips(0n, [100n]), []);
    assert.equal(toChips(150n, [100n, 500n]), null);
  });
});
