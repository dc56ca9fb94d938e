// reasonOf: the stable reason code of a refusal, from its metadata or its message.
import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { Code, ConnectError } from "@connectrpc/connect";

import { reasonOf } from "../../src/errors.js";

describe("reasonOf", () => {
  it("reads niuniu-reason from the metadata first", () => {
    const error = new ConnectError("the hold needs 500", Code.FailedPrecondition, { "niuniu-reason": "INSUFFICIENT_FUNDS" });
    assert.equal(reasonOf(error), "INSUFFICIENT_FUNDS");
  });

  it("falls back to the code at the head of the message", () => {
    assert.equal(reasonOf(new ConnectError("BETTING_CLOSED: betting closed at 12:00", Code.FailedPrecondition)), "BETTING_CLOSED");
    assert.equal(reasonOf(new ConnectError("TABLE_CLOSED", Code.FailedPrecondition)), "TABLE_CLOSED");
  });

  it("is empty for an error without one", () => {
    assert.equal(reasonOf(new ConnectError("Failed to fetch", Code.Unknown)), "");
    assert.equal(reasonOf(new Error("boom")), "");
  });
});
