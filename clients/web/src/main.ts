// The reference web table: everything a player's page needs, on the SDK only.
// Log in, pick a table of any variant, follow the round (phase and a countdown from the
// server's clock), bet and cancel with chips, see hands (or envelope grabs) revealed in
// order, the result and the new balance, and verify the round from its revealed seed.
import {
  Code,
  ConnectError,
  fairness,
  formatMoney,
  NiuniuClient,
  parseMoney,
  ResumeGapError,
  watchTable,
  type TableInfo,
  type TableUpdate,
} from "@niuniu/sdk";

const params = new URLSearchParams(location.search);
const apiMeta = document.querySelector<HTMLMetaElement>('meta[name="niuniu-api"]')?.content;
/** The gateway: ?api=..., a <meta name="niuniu-api">, or the page's own origin (the gateway serving the page). */
const API = params.get("api") ?? apiMeta ?? location.origin;
const client = new NiuniuClient({ baseUrl: API, protocol: params.get("protocol") === "grpc-web" ? "grpc-web" : "connect" });

const $ = <T extends HTMLElement = HTMLElement>(id: string): T => {
  const el = document.getElementById(id);
  if (!el) throw new Error(`#${id} is missing`);
  return el as T;
};

function el<K extends keyof HTMLElementTagNameMap>(tag: K, attrs: Record<string, string> = {}, text = ""): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text) node.textContent = text;
  return node;
}

function describe(error: unknown): string {
  if (error instanceof ConnectError) return `${Code[error.code]}: ${error.rawMessage}`;
  return error instanceof Error ? error.message : String(error);
}

const money = (minor: bigint | number): string => formatMoney(minor);
const who = (account: string): string => (account === client.session?.account ? "you" : account.replace(/^player:/, "").slice(0, 8));

// ------------------------------------------------------------------ state

interface RoundUi {
  section: HTMLElement;
  hands: HTMLOListElement;
  grabs: HTMLOListElement;
  result: HTMLElement;
  balance: HTMLElement;
  verify: HTMLElement;
  balanceShown: boolean;
}

const state = {
  username: "",
  table: undefined as TableInfo | undefined,
  roundId: "",
  phase: "",
  deadline: 0n,
  chip: 0n,
  watch: undefined as AbortController | undefined,
  rounds: new Map<string, RoundUi>(),
  myBets: new Map<string, { area: string; stake: bigint }>(),
};

// ------------------------------------------------------------------ login

async function showBalance(): Promise<bigint | undefined> {
  try {
    const b = await client.wallet.getBalance({});
    $("who").textContent = `${state.username} · balance ${money(b.availableMinor)}` + (b.heldMinor > 0n ? ` (held ${money(b.heldMinor)})` : "");
    $("who").dataset.balance = b.availableMinor.toString();
    return b.availableMinor;
  } catch (error) {
    $("who").textContent = `balance unavailable: ${describe(error)}`;
    return undefined;
  }
}

$("login-form").addEventListener("submit", (event) => {
  event.preventDefault();
  void (async () => {
    $("login-error").textContent = "";
    try {
      state.username = $<HTMLInputElement>("username").value;
      await client.login(state.username, $<HTMLInputElement>("password").value);
      $("who").dataset.state = "logged-in";
      $("login-panel").hidden = true;
      $("tables-panel").hidden = false;
      await showBalance();
      await loadTables();
    } catch (error) {
      $("login-error").textContent = describe(error);
    }
  })();
});

$("register-btn").addEventListener("click", () => {
  void (async () => {
    const username = $<HTMLInputElement>("username").value;
    try {
      await client.wallet.register({
        requestId: `web-${crypto.randomUUID()}`,
        username,
        email: `${username}@example.org`,
        password: $<HTMLInputElement>("password").value,
      });
      $("login-error").textContent = "registered: log in now (a new account has no funds until the operator deposits)";
    } catch (error) {
      $("login-error").textContent = describe(error);
    }
  })();
});

// ------------------------------------------------------------------ tables

async function loadTables(): Promise<void> {
  const list = $("tables");
  list.replaceChildren();
  const { tables } = await client.table.listTables({});
  for (const t of tables) {
    const button = el("button", { type: "button", class: "table-pick", "data-table-id": t.tableId, "data-variant": t.variant }, "Play");
    button.addEventListener("click", () => void openTable(t.tableId));
    const li = el("li", {}, `${t.tableId} — ${t.variant} (phase ${t.phase || "–"}) `);
    li.append(button);
    list.append(li);
  }
}
$("refresh-tables").addEventListener("click", () => void loadTables());

async function openTable(tableId: string): Promise<void> {
  state.watch?.abort();
  const table = (await client.table.joinTable({ tableId })).table ?? (await client.table.getTable({ tableId }));
  state.table = table;
  state.rounds.clear();
  state.myBets.clear();
  $("rounds").replaceChildren();
  $("my-bets").replaceChildren();
  $("table-panel").hidden = false;
  $("table-panel").dataset.tableId = tableId;
  $("table-name").textContent = tableId;
  $("variant").textContent = table.variant;
  $("bid-box").hidden = table.variant !== "red_envelope_bull";
  setPhase(table.currentRoundId, table.phase, table.phase === "bidding" ? table.biddingClosesAtUnixMs : table.bettingClosesAtUnixMs);
  renderChips(table);
  renderAreas(table);
  void watch(tableId);
}

function renderChips(table: TableInfo): void {
  const chips = $("chips");
  chips.replaceChildren();
  const values = table.limits?.chipsMinor.length ? table.limits.chipsMinor : [table.limits?.minBetMinor ?? 100n];
  state.chip = values[0] ?? 100n;
  for (const value of values) {
    const chip = el("button", { type: "button", class: "chip", role: "radio", "data-minor": value.toString(), "aria-checked": String(value === state.chip) }, money(value));
    chip.addEventListener("click", () => {
      state.chip = value;
      for (const c of chips.querySelectorAll(".chip")) c.setAttribute("aria-checked", String(c === chip));
    });
    chips.append(chip);
  }
}

function renderAreas(table: TableInfo): void {
  const areas = $("areas");
  areas.replaceChildren();
  for (const area of table.areas) {
    const button = el("button", { type: "button", class: "area", "data-area": area });
    button.append(el("span", { class: "name" }, area), el("br"), el("span", { class: "total" }, ""));
    button.addEventListener("click", () => void bet(area));
    areas.append(button);
  }
}

// ------------------------------------------------------------------ betting

async function bet(area: string): Promise<void> {
  const table = state.table;
  if (!table) return;
  $("action-error").textContent = "";
  try {
    const existing = [...state.myBets.entries()].find(([, b]) => b.area === area);
    if (table.variant === "red_envelope_bull" && existing) {
      // 68 NiuNiu: one bet each, raised with ChangeBet.
      await client.table.changeBet({ commandId: `web-${crypto.randomUUID()}`, tableId: table.tableId, betId: existing[0], amountMinor: existing[1].stake + state.chip });
    } else {
      await client.table.placeBet({ commandId: `web-${crypto.randomUUID()}`, tableId: table.tableId, area, amountMinor: state.chip, roundId: state.roundId });
    }
  } catch (error) {
    $("action-error").textContent = describe(error);
  }
}

async function cancel(betId: string): Promise<void> {
  const table = state.table;
  if (!table) return;
  $("action-error").textContent = "";
  try {
    if (table.variant === "red_envelope_bull") {
      await client.table.changeBet({ commandId: `web-${crypto.randomUUID()}`, tableId: table.tableId, betId, amountMinor: 0n });
    } else {
      await client.table.cancelBet({ commandId: `web-${crypto.randomUUID()}`, tableId: table.tableId, betId });
    }
  } catch (error) {
    $("action-error").textContent = describe(error);
  }
}

$("bid-btn").addEventListener("click", () => {
  void (async () => {
    const table = state.table;
    if (!table) return;
    $("action-error").textContent = "";
    try {
      const amountMinor = parseMoney($<HTMLInputElement>("bid-amount").value);
      const receipt = await client.table.placeBid({ commandId: `web-${crypto.randomUUID()}`, tableId: table.tableId, amountMinor, roundId: state.roundId });
      $("action-error").textContent = `bid ${money(receipt.amountMinor)}: ${receipt.status}`;
    } catch (error) {
      $("action-error").textContent = describe(error);
    }
  })();
});

function renderMyBets(): void {
  const list = $("my-bets");
  list.replaceChildren();
  for (const [betId, b] of state.myBets) {
    const li = el("li", { class: "my-bet", "data-bet-id": betId, "data-area": b.area }, `${b.area} ${money(b.stake)} `);
    const button = el("button", { type: "button", class: "cancel" }, "cancel");
    button.disabled = state.phase !== "betting";
    button.addEventListener("click", () => void cancel(betId));
    li.append(button);
    list.append(li);
  }
}

// ------------------------------------------------------------------ the round

function setPhase(roundId: string, phase: string, deadline: bigint): void {
  if (roundId && roundId !== state.roundId) {
    state.roundId = roundId;
    state.myBets.clear();
    renderMyBets();
  }
  state.phase = phase;
  state.deadline = deadline;
  $("round-id").textContent = state.roundId;
  $("phase").textContent = phase || "–";
  for (const b of document.querySelectorAll<HTMLButtonElement>(".area, .chip")) b.disabled = phase !== "betting";
  $<HTMLButtonElement>("bid-btn").disabled = phase !== "bidding";
  renderMyBets();
}

setInterval(() => {
  const left = state.deadline > 0n ? client.clock.remainingMs(state.deadline) : 0;
  $("countdown").textContent = left > 0 ? `${(left / 1000).toFixed(1)} s left (${state.phase})` : "";
  $("countdown").dataset.remainingMs = String(Math.round(left));
}, 200);

function roundUi(roundId: string): RoundUi {
  const known = state.rounds.get(roundId);
  if (known) return known;
  const section = el("section", { class: "round", "data-round-id": roundId });
  section.append(el("h4", {}, `round ${roundId}`));
  const ui: RoundUi = {
    section,
    hands: el("ol", { class: "hands" }),
    grabs: el("ol", { class: "grabs" }),
    result: el("div", { class: "result" }),
    balance: el("div", { class: "balance" }),
    verify: el("div", { class: "verify", "data-status": "pending" }, "not verified yet (the seed is revealed after settlement)"),
    balanceShown: false,
  };
  section.append(ui.hands, ui.grabs, ui.result, ui.balance, ui.verify);
  $("rounds").prepend(section);
  state.rounds.set(roundId, ui);
  for (const old of [...state.rounds.keys()].slice(0, -8)) {
    state.rounds.get(old)?.section.remove();
    state.rounds.delete(old);
  }
  return ui;
}

function handle(u: TableUpdate): void {
  const ui = u.roundId ? roundUi(u.roundId) : undefined;
  const kind = u.update.case as string | undefined;
  switch (u.update.case) {
    case "roundOpened": {
      const o = u.update.value;
      const bidding = o.biddingClosesAtUnixMs > 0n;
      $("round-no").textContent = o.roundNo.toString();
      for (const t of document.querySelectorAll(".area .total")) t.textContent = "";
      setPhase(u.roundId, bidding ? "bidding" : "betting", bidding ? o.biddingClosesAtUnixMs : o.bettingClosesAtUnixMs);
      ui?.section.querySelector("h4")?.replaceChildren(`round ${o.roundNo} · commitment ${o.commitment.slice(0, 16)}…`);
      if (ui) ui.section.dataset.commitment = o.commitment;
      break;
    }
    case "phaseChanged":
      if (u.roundId === state.roundId || !state.roundId) setPhase(u.roundId, u.update.value.phase, u.update.value.deadlineUnixMs);
      break;
    case "areaTotals":
      for (const [area, total] of Object.entries(u.update.value.totalsMinor)) {
        const t = document.querySelector(`.area[data-area="${CSS.escape(area)}"] .total`);
        if (t) t.textContent = money(total);
      }
      break;
    case "myBetPlaced":
      if (u.roundId === state.roundId) state.myBets.set(u.update.value.betId, { area: u.update.value.area, stake: u.update.value.stakeMinor });
      renderMyBets();
      break;
    case "myBetChanged":
      if (u.roundId === state.roundId) state.myBets.set(u.update.value.betId, { area: u.update.value.area, stake: u.update.value.stakeMinor });
      renderMyBets();
      break;
    case "myBetCancelled":
      state.myBets.delete(u.update.value.betId);
      renderMyBets();
      break;
    case "dealerChosen":
      ui?.result.before(el("p", { class: "dealer" }, `dealer ${who(u.update.value.dealer)}, pool ${money(u.update.value.dealerPoolMinor)}`));
      if (u.roundId === state.roundId) setPhase(u.roundId, "betting", u.update.value.bettingClosesAtUnixMs);
      break;
    case "handRevealed": {
      const h = u.update.value;
      const part = h.group ? ` (${h.group})` : "";
      ui?.hands.append(el("li", { class: "hand", "data-seat": h.seat }, `${h.seat}${part}: ${h.cards.join(" ")} — ${h.category}${h.multiplier ? ` x${h.multiplier}` : ""}`));
      break;
    }
    case "envelopeGrabbed": {
      const g = u.update.value;
      ui?.grabs.append(
        el("li", { class: "grab", "data-position": String(g.position) }, `grab ${g.grabNo + 1}: ${who(g.participant)}${g.dealer ? " (dealer)" : ""} ${g.amountText} — ${g.category} x${g.multiplier}`),
      );
      break;
    }
    case "result": {
      const r = u.update.value;
      if (!ui) break;
      const outcomes = Object.entries(r.areaOutcomes).map(([a, o]) => `${a} ${o}`).join(", ");
      const mine = r.myBets.map((b) => `${b.area} ${money(b.stakeMinor)} ${b.outcome} ${formatMoney(b.netMinor, { signed: true })}`).join("; ");
      ui.result.textContent = `${r.status}${r.voidReason ? ` (${r.voidReason})` : ""}${outcomes ? ` · ${outcomes}` : ""} · my bets: ${mine || "none"} · net ${formatMoney(r.myNetMinor, { signed: true })}`;
      ui.result.dataset.status = r.status;
      ui.result.dataset.net = r.myNetMinor.toString();
      ui.balance.textContent = "waiting for the wallet to apply the settlement…";
      // The stream's balance update says when the wallet applied it; ask the wallet if it is late.
      const roundUiRef = ui;
      setTimeout(() => void (roundUiRef.balanceShown ? undefined : showRoundBalance(roundUiRef, undefined)), 3000);
      break;
    }
    case "seedRevealed":
      if (ui) void verifyRound(u.roundId, ui);
      break;
    default:
      if (kind === "balance" && ui) {
        const v = u.update.value as unknown as { availableMinor?: bigint; balance?: { availableMinor?: bigint } };
        void showRoundBalance(ui, v.availableMinor ?? v.balance?.availableMinor);
      }
  }
}

async function showRoundBalance(ui: RoundUi, available: bigint | undefined): Promise<void> {
  const now = available ?? (await showBalance());
  if (available !== undefined) await showBalance();
  if (now === undefined) return;
  ui.balanceShown = true;
  ui.balance.textContent = `new balance ${money(now)}`;
  ui.balance.dataset.balance = now.toString();
}

async function watch(tableId: string): Promise<void> {
  const abort = new AbortController();
  state.watch = abort;
  const link = $("link");
  let after = 0n;
  while (!abort.signal.aborted) {
    try {
      const updates = watchTable(client, tableId, {
        afterPosition: after,
        signal: abort.signal,
        onReconnect: (info) => {
          link.dataset.state = "reconnecting";
          link.textContent = `reconnecting after position ${info.afterPosition} (${info.reason})`;
        },
        onKeepalive: () => {
          link.dataset.state = "live";
          link.textContent = "live";
        },
      });
      for await (const u of updates) {
        link.dataset.state = "live";
        link.textContent = "live";
        after = u.position;
        handle(u);
      }
      return;
    } catch (error) {
      if (abort.signal.aborted) return;
      if (error instanceof ResumeGapError) {
        after = 0n; // the server no longer has our position: start again from the current round
        continue;
      }
      link.dataset.state = "failed";
      link.textContent = describe(error);
      return;
    }
  }
}

// ------------------------------------------------------------------ verification

const GOLDEN_BULL_DEAL_ORDER = ["dealer", "area_1", "area_2", "area_3"];

/** The round's revealed seed checked in this browser (docs/fairness.md), then shown. */
async function verifyRound(roundId: string, ui: RoundUi): Promise<void> {
  const table = state.table;
  if (!table) return;
  ui.verify.textContent = "verifying…";
  try {
    const view = await client.table.getRound({ tableId: table.tableId, roundId });
    const result = await fairness.verifyRound(view);
    const failed = result.checks.filter((c) => !c.ok);
    const partial = result.checks.length === 1;
    ui.verify.dataset.status = !result.ok ? "failed" : partial ? "commitment-only" : "verified";
    ui.verify.textContent = !result.ok
      ? `FAILED: ${failed.map((c) => c.detail).join("; ")}`
      : partial
        ? "the revealed seed matches the commitment (nothing was dealt)"
        : `verified: ${result.checks.map((c) => c.name).join(", ")} match the revealed seed`;
    ui.verify.title = result.checks.map((c) => `${c.name}: ${c.detail}`).join("\n");
  } catch (error) {
    ui.verify.dataset.status = "error";
    ui.verify.textContent = `could not verify: ${describe(error)}`;
  }
}
