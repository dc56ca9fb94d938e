// The reference web table, a game client on the SDK alone, for every variant: log in, pick an
// open table, see the round's phase and countdown on the server's clock, choose a chip and
// see the stake and the most it can cost before betting, bet (with an optional client seed),
// watch the cards (SVG) or envelope grabs revealed, the result and the new balance, and the
// round verified in this browser once its seed is revealed. Names are the seeds' own, in
// English or Chinese (i18n.ts); refusals are explained by their reason code.
import {
  ConnectError,
  fairness,
  formatMoney,
  NiuniuClient,
  parseMoney,
  reasonOf,
  ResumeGapError,
  watchTable,
  type TableInfo,
  type TableUpdate,
} from "@niuniu/sdk";

import { cardBack, cardSvg } from "./cards.js";
import { areaName, categoryName, lang, outcomeName, phaseName, reasonMessage, setLang, ui, variantName } from "./i18n.js";

const params = new URLSearchParams(location.search);
const apiMeta = document.querySelector<HTMLMetaElement>('meta[name="niuniu-api"]')?.content;
/** The gateway: ?api=..., a <meta name="niuniu-api">, or the page's own origin (the gateway serving the page). */
const API = params.get("api") ?? apiMeta ?? location.origin;
const client = new NiuniuClient({ baseUrl: API, protocol: params.get("protocol") === "grpc-web" ? "grpc-web" : "connect" });

const VERIFY_ATTEMPTS = 6;
const VERIFY_BACKOFF_MS = 500;
const HISTORY_ROUNDS = 10;
/** Seats in the order a board shows them (the dealer or banker first). */
const SEAT_ORDER: Record<string, readonly string[]> = {
  golden_bull: ["dealer", "area_1", "area_2", "area_3"],
  bai_buu: ["banker", "player_01", "player_02", "player_03"],
  baibian_bull: ["banker", "heaven", "earth", "mystic", "yellow"],
};

const $ = <T extends HTMLElement = HTMLElement>(id: string): T => {
  const found = document.getElementById(id);
  if (!found) throw new Error(`#${id} is missing`);
  return found as T;
};

function el<K extends keyof HTMLElementTagNameMap>(tag: K, attrs: Record<string, string> = {}, text = ""): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text) node.textContent = text;
  return node;
}

const money = (minor: bigint): string => formatMoney(minor);
const signed = (minor: bigint): string => formatMoney(minor, { signed: true });
const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/** A refusal in the player's words, keyed by its reason code. */
function explain(error: unknown): string {
  const detail = error instanceof ConnectError ? error.rawMessage : String(error);
  return reasonMessage(reasonOf(error), lang() === "zh" ? `出現問題（${detail}），請重試。` : `Something went wrong (${detail}). Try again.`);
}

/** Phase changes, results and verdicts for screen readers: never the countdown's ticks. */
function announce(text: string): void {
  $("announcer").textContent = text;
}

// ------------------------------------------------------------------ state

interface MyBet {
  area: string;
  stake: bigint;
  /** What the page said the bet could cost before it was placed. */
  riskShown: bigint;
  /** What the wallet holds for it (GetHold of the receipt's hold). */
  held: bigint;
}

const state = {
  username: "",
  table: undefined as TableInfo | undefined,
  roundId: "",
  phase: "",
  deadline: 0n,
  chip: 0n,
  watch: undefined as AbortController | undefined,
  myBets: new Map<string, MyBet>(),
  /** The round on the board and its updates, replayed when the language changes. */
  boardRound: "",
  boardUpdates: [] as TableUpdate[],
  allowance: undefined as bigint | undefined,
};

// ------------------------------------------------------------------ balance and language

async function refreshBalance(): Promise<bigint | undefined> {
  try {
    const b = await client.wallet.getBalance({});
    const shown = $("balance");
    shown.dataset.available = b.availableMinor.toString();
    shown.dataset.held = b.heldMinor.toString();
    shown.textContent = `${ui("balance")} ${money(b.availableMinor)}` + (b.heldMinor > 0n ? ` · ${ui("held")} ${money(b.heldMinor)}` : "");
    return b.availableMinor;
  } catch (error) {
    $("balance").textContent = explain(error);
    return undefined;
  }
}

function applyLanguage(): void {
  $("lang-btn").textContent = lang() === "zh" ? "English" : "中文";
  $("tables-title").textContent = ui("tables");
  $("tables-btn").textContent = ui("tables");
  $("my-bets-title").textContent = ui("myBets");
  $("history-title").textContent = lang() === "zh" ? "歷史" : "History";
  $("seed-label").textContent = ui("clientSeed");
  $("bid-label").textContent = ui("bid");
  if (state.table) {
    $("variant").textContent = variantName(state.table.variant);
    renderAreas(state.table);
    renderRisk();
    renderMyBets();
    setPhase(state.roundId, state.phase, state.deadline);
    renderBoard();
  }
  if (client.session) {
    void refreshBalance();
    void loadTables();
  }
}

$("lang-btn").addEventListener("click", () => {
  setLang(lang() === "zh" ? "en" : "zh");
  applyLanguage();
});

// ------------------------------------------------------------------ login and tables

$("login-form").addEventListener("submit", (event) => {
  event.preventDefault();
  void (async () => {
    $("login-error").textContent = "";
    try {
      state.username = $<HTMLInputElement>("username").value;
      await client.login(state.username, $<HTMLInputElement>("password").value);
      $("who").dataset.state = "logged-in";
      $("user").textContent = state.username;
      $("login-panel").hidden = true;
      $("tables-panel").hidden = false;
      await refreshBalance();
      await loadTables();
    } catch (error) {
      $("login-error").textContent = explain(error);
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
      $("login-error").textContent = lang() === "zh" ? "已註冊：請登入（新帳戶需由營運方存款）。" : "Registered: log in now (a new account has no funds until the operator deposits).";
    } catch (error) {
      $("login-error").textContent = explain(error);
    }
  })();
});

/** Open tables with a Play button; closing and closed ones listed without one. */
async function loadTables(): Promise<void> {
  const { tables } = await client.table.listTables({});
  const list = $("tables");
  list.replaceChildren();
  for (const t of tables) {
    const li = el("li", { class: "table-row", "data-table-id": t.tableId, "data-status": t.status || "open" });
    li.append(el("span", { class: "table-title" }, `${t.tableId} · ${variantName(t.variant)}`), " ");
    if (t.status && t.status !== "open") {
      li.append(el("span", { class: "table-closed" }, ui(t.status)));
    } else {
      const button = el("button", { type: "button", class: "table-pick", "data-table-id": t.tableId, "data-variant": t.variant }, ui("play"));
      button.addEventListener("click", () => void openTable(t.tableId));
      li.append(button);
    }
    list.append(li);
  }
}
$("refresh-tables").addEventListener("click", () => void loadTables());

/** Back to the list: the table's stream stops (a bet placed stays in play). */
$("tables-btn").addEventListener("click", () => {
  state.watch?.abort();
  state.table = undefined;
  $("table-panel").hidden = true;
  $("tables-btn").hidden = true;
  $("tables-panel").hidden = false;
  void loadTables();
});

async function openTable(tableId: string): Promise<void> {
  state.watch?.abort();
  const table = (await client.table.joinTable({ tableId })).table ?? (await client.table.getTable({ tableId }));
  state.table = table;
  state.myBets.clear();
  state.boardRound = "";
  state.boardUpdates = [];
  state.allowance = undefined;
  for (const id of ["board", "my-bets", "history", "result", "verify", "dealer-line"]) $(id).replaceChildren();
  $("tables-panel").hidden = true;
  $("tables-btn").hidden = false;
  $("table-panel").hidden = false;
  $("table-panel").dataset.tableId = tableId;
  $("table-panel").dataset.variant = table.variant;
  $("table-name").textContent = tableId;
  $("variant").textContent = variantName(table.variant);
  $("bid-box").hidden = table.variant !== "red_envelope_bull";
  renderChips(table);
  renderAreas(table);
  setPhase(table.currentRoundId, table.phase, table.phase === "bidding" ? table.biddingClosesAtUnixMs : table.bettingClosesAtUnixMs);
  void watch(tableId);
}

// ------------------------------------------------------------------ chips, risk and areas

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
      renderRisk();
    });
    chips.append(chip);
  }
  renderRisk();
}

/** `stake x hold_multiplier`, rounded up as the wallet rounds a hold (the multiplier is a decimal). */
function riskOf(stake: bigint): bigint {
  const m = /^(\d+)(?:\.(\d+))?$/.exec(state.table?.holdMultiplier ?? "1");
  if (!m) return stake;
  const fraction = m[2] ?? "";
  const scale = 10n ** BigInt(fraction.length);
  const product = stake * BigInt((m[1] ?? "0") + fraction);
  return (product + scale - 1n) / scale;
}

/** 68 NiuNiu takes one bet a player, raised with ChangeBet: a chip adds to it. */
function envelopeBet(): [string, MyBet] | undefined {
  return state.table?.variant === "red_envelope_bull" ? [...state.myBets.entries()][0] : undefined;
}

/** The stake the next click places (a 68 NiuNiu bet's new total) and the most it can cost. */
function nextBet(): { stake: bigint; risk: bigint } {
  const stake = (envelopeBet()?.[1].stake ?? 0n) + state.chip;
  return { stake, risk: riskOf(stake) };
}

function renderRisk(): void {
  const { stake, risk } = nextBet();
  const box = $("risk");
  box.dataset.stake = stake.toString();
  box.dataset.risk = risk.toString();
  const allowance = state.allowance !== undefined ? ` · ${lang() === "zh" ? "尚可下注" : "you may still bet"} ${money(state.allowance)}` : "";
  box.textContent = `${ui("stake")} ${money(stake)} · ${ui("risk")} ${money(risk)}${allowance}`;
}

function renderAreas(table: TableInfo): void {
  const areas = $("areas");
  const totals = new Map([...areas.querySelectorAll<HTMLElement>(".area")].map((b) => [b.dataset.area ?? "", b.querySelector(".total")?.textContent ?? ""]));
  areas.replaceChildren();
  for (const area of table.areas) {
    const button = el("button", { type: "button", class: "area", "data-area": area });
    button.append(el("span", { class: "name" }, areaName(table.variant, area)), el("span", { class: "total" }, totals.get(area) ?? ""));
    button.addEventListener("click", () => void bet(area));
    button.disabled = state.phase !== "betting";
    areas.append(button);
  }
}

// ------------------------------------------------------------------ betting

async function bet(area: string): Promise<void> {
  const table = state.table;
  if (!table) return;
  $("action-error").textContent = "";
  const { stake, risk } = nextBet();
  const clientSeed = $<HTMLInputElement>("client-seed").value.trim();
  const commandId = `web-${crypto.randomUUID()}`;
  try {
    const existing = envelopeBet();
    const receipt = existing
      ? await client.table.changeBet({ commandId, tableId: table.tableId, betId: existing[0], amountMinor: stake })
      : await client.table.placeBet({ commandId, tableId: table.tableId, area, amountMinor: stake, roundId: state.roundId, clientSeed });
    const held = receipt.holdId ? (await client.wallet.getHold({ holdId: receipt.holdId })).amountMinor : receipt.holdMinor;
    state.myBets.set(receipt.betId, { area: receipt.area, stake: receipt.stakeMinor, riskShown: risk, held });
    renderMyBets();
    renderRisk();
  } catch (error) {
    $("action-error").textContent = explain(error);
  }
  await refreshBalance();
}

async function cancel(betId: string): Promise<void> {
  const table = state.table;
  if (!table) return;
  $("action-error").textContent = "";
  const commandId = `web-${crypto.randomUUID()}`;
  try {
    if (table.variant === "red_envelope_bull") await client.table.changeBet({ commandId, tableId: table.tableId, betId, amountMinor: 0n });
    else await client.table.cancelBet({ commandId, tableId: table.tableId, betId });
    state.myBets.delete(betId);
    renderMyBets();
    renderRisk();
  } catch (error) {
    $("action-error").textContent = explain(error);
  }
  await refreshBalance();
}

$("bid-btn").addEventListener("click", () => {
  void (async () => {
    const table = state.table;
    if (!table) return;
    $("action-error").textContent = "";
    try {
      const amountMinor = parseMoney($<HTMLInputElement>("bid-amount").value);
      const receipt = await client.table.placeBid({ commandId: `web-${crypto.randomUUID()}`, tableId: table.tableId, amountMinor, roundId: state.roundId });
      $("action-error").textContent = `${ui("bid")}: ${money(receipt.amountMinor)} (${ui("held")} ${money(receipt.holdMinor)})`;
    } catch (error) {
      $("action-error").textContent = error instanceof Error && error.name === "MoneyError" ? reasonMessage("AMOUNT_INVALID", "") : explain(error);
    }
    await refreshBalance();
  })();
});

function renderMyBets(): void {
  const list = $("my-bets");
  list.replaceChildren();
  const variant = state.table?.variant ?? "";
  for (const [betId, b] of state.myBets) {
    const li = el("li", { class: "my-bet", "data-bet-id": betId, "data-area": b.area, "data-stake": b.stake.toString(), "data-risk-shown": b.riskShown.toString(), "data-held": b.held.toString() });
    li.append(`${areaName(variant, b.area)} · ${ui("stake")} ${money(b.stake)} · ${ui("held")} ${money(b.held)} `);
    const button = el("button", { type: "button", class: "cancel" }, ui("cancel"));
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
    renderRisk();
  }
  const changed = phase !== state.phase;
  state.phase = phase;
  state.deadline = deadline;
  $("round-no").dataset.roundId = state.roundId;
  $("phase").textContent = phaseName(phase);
  $("phase").dataset.phase = phase;
  $("phase").dataset.roundId = state.roundId;
  for (const b of document.querySelectorAll<HTMLButtonElement>(".area, .chip")) b.disabled = phase !== "betting";
  $<HTMLButtonElement>("bid-btn").disabled = phase !== "bidding";
  renderMyBets();
  if (changed && phase) announce(phaseName(phase));
  // On a phone the controls are below the table: bring the table back for the reveal.
  if (changed && (phase === "dealing" || phase === "revealing")) showStage();
}

function showStage(): void {
  const stage = $("stage");
  if (stage.getBoundingClientRect().top < 0) window.scrollTo({ top: stage.offsetTop, behavior: "instant" });
}

setInterval(() => {
  const left = state.deadline > 0n ? client.clock.remainingMs(state.deadline) : 0;
  $("countdown").textContent = left > 0 ? `${Math.ceil(left / 1000)} s` : "";
  $("countdown").dataset.remainingMs = String(Math.round(left));
}, 200);

/** A reveal of a round not on the board: the board moves to it, the old round goes to the history. */
function boardFor(roundId: string): void {
  if (roundId === state.boardRound) return;
  const result = $("result");
  if (state.boardRound && result.textContent) {
    const line = el("li", { "data-round-id": state.boardRound }, result.textContent + ($("verify").dataset.status === "verified" ? ` · ✓ ${ui("verified")}` : ""));
    $("history").prepend(line);
    for (const old of [...$("history").children].slice(HISTORY_ROUNDS)) old.remove();
  }
  state.boardRound = roundId;
  state.boardUpdates = [];
  for (const id of ["board", "result", "verify", "dealer-line"]) $(id).replaceChildren();
  for (const id of ["board", "result", "verify"]) $(id).dataset.roundId = roundId;
  $("result").removeAttribute("data-status");
  $("verify").dataset.status = "pending";
  $("verify").textContent = ui("verifyPending");
}

const BOARD_KINDS = new Set(["dealt", "handRevealed", "envelopeSent", "envelopeGrabbed", "dealerChosen", "result", "seedRevealed", "balance"]);

function handle(u: TableUpdate): void {
  const kind = u.update.case as string | undefined;
  if (kind && BOARD_KINDS.has(kind) && u.roundId) {
    boardFor(u.roundId);
    state.boardUpdates.push(u);
    draw(u);
  }
  switch (u.update.case) {
    case "roundOpened": {
      const o = u.update.value;
      const bidding = o.biddingClosesAtUnixMs > 0n;
      $("round-no").textContent = `${ui("round")} ${o.roundNo}${lang() === "zh" ? " 局" : ""}`;
      for (const t of document.querySelectorAll(".area .total")) t.textContent = "";
      state.allowance = undefined;
      setPhase(u.roundId, bidding ? "bidding" : "betting", bidding ? o.biddingClosesAtUnixMs : o.bettingClosesAtUnixMs);
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
    case "betAllowance":
      state.allowance = u.update.value.bettingOpen ? u.update.value.availableToBetMinor : 0n;
      renderRisk();
      break;
    case "myBetCancelled":
      state.myBets.delete(u.update.value.betId);
      renderMyBets();
      break;
    case "seedRevealed":
      void verify(u.roundId);
      break;
    default:
  }
}

/** Replays the board round's updates (after a language change). */
function renderBoard(): void {
  for (const id of ["board", "result", "dealer-line"]) $(id).replaceChildren();
  for (const u of state.boardUpdates) draw(u);
}

function who(account: string): string {
  return account === client.session?.account ? ui("you") : account.replace(/^player:/, "").slice(0, 6);
}

function seatRow(seat: string): HTMLElement {
  const board = $("board");
  const found = board.querySelector<HTMLElement>(`.seat[data-seat="${CSS.escape(seat)}"]`);
  if (found) return found;
  const row = el("div", { class: "seat", "data-seat": seat });
  row.append(el("span", { class: "seat-name" }, areaName(state.table?.variant ?? "", seat)), el("span", { class: "cards" }), el("span", { class: "category" }));
  const order = SEAT_ORDER[state.table?.variant ?? ""] ?? [];
  const after = [...board.querySelectorAll<HTMLElement>(".seat")].find((r) => order.indexOf(r.dataset.seat ?? "") > order.indexOf(seat));
  board.insertBefore(row, after ?? null);
  return row;
}

/** One update of the board's round drawn on the board. */
function draw(u: TableUpdate): void {
  switch (u.update.case) {
    case "dealerChosen": {
      const d = u.update.value;
      $("dealer-line").textContent = `${areaName("", "dealer")}: ${who(d.dealer)} · ${lang() === "zh" ? "莊池" : "pool"} ${money(d.dealerPoolMinor)}`;
      break;
    }
    case "dealt": {
      const d = u.update.value;
      if (d.drawnCard) {
        const line = $("dealer-line");
        line.replaceChildren(lang() === "zh" ? "翻牌定首家 " : "Drawn card ", cardSvg(d.drawnCard), ` → ${areaName(state.table?.variant ?? "", d.firstSeat)}`);
      }
      break;
    }
    case "handRevealed": {
      const h = u.update.value;
      const row = seatRow(h.seat);
      const cards = row.querySelector(".cards");
      // A hand revealed in parts: Bai Buu adds its last two cards; 百變牛牛's open part is the whole hand.
      if (h.group === "open") cards?.replaceChildren();
      cards?.append(...h.cards.map(cardSvg));
      if (h.group === "face_up") cards?.append(cardBack());
      const whole = h.handCategory && h.handCategory !== h.category ? ` · ${categoryName(h.handCategory)}` : "";
      const category = categoryName(h.category) + whole;
      row.querySelector(".category")?.replaceChildren(h.category ? `${category}${h.multiplier && h.multiplier !== "0" ? ` ×${h.multiplier}` : ""}` : "");
      break;
    }
    case "envelopeSent":
      $("board").append(el("p", { class: "envelope" }, `🧧 ${money(u.update.value.totalMinor)} · ${u.update.value.participants.length} ${lang() === "zh" ? "人搶" : "grabs"}`));
      break;
    case "envelopeGrabbed": {
      const g = u.update.value;
      const row = el("div", { class: "grab", "data-position": String(g.position), "data-grab-no": String(g.grabNo) });
      row.append(
        el("span", { class: "seat-name" }, `${ui("grab")} ${g.grabNo + 1}`),
        el("span", { class: "who" }, `${who(g.participant)}${g.dealer ? ` (${areaName("", "dealer")})` : ""}`),
        el("strong", { class: "amount" }, g.amountText),
        el("span", { class: "category" }, `${categoryName(g.category)} ×${g.multiplier}`),
      );
      $("board").append(row);
      break;
    }
    case "result":
      drawResult(u);
      break;
    case "balance": {
      const b = u.update.value;
      void showRoundBalance(b.availableMinor, b.settlementStatus);
      break;
    }
    default:
  }
}

function drawResult(u: TableUpdate): void {
  if (u.update.case !== "result") return;
  const r = u.update.value;
  const variant = state.table?.variant ?? "";
  const result = $("result");
  result.dataset.status = r.status;
  result.dataset.net = r.myNetMinor.toString();
  const outcomes = Object.entries(r.areaOutcomes).map(([a, o]) => `${areaName(variant, a)} ${outcomeName(o)}`).join(", ");
  const mine = r.myBets.map((b) => `${areaName(variant, b.area)} ${money(b.stakeMinor)} ${outcomeName(b.outcome)}`).join("; ");
  const head = r.status === "voided" ? phaseName("voided") : `${ui("result")}: ${r.myBets.length ? `${ui("net")} ${signed(r.myNetMinor)}` : ui("noBets")}`;
  result.replaceChildren(el("strong", { class: "net" }, head), ` ${[outcomes, mine].filter(Boolean).join(" · ")}`);
  if (r.myBets.length) result.append(" ", el("span", { class: "round-balance" }, ui("waiting")));
  announce(head);
}

async function showRoundBalance(available: bigint, status: string): Promise<void> {
  const header = await refreshBalance();
  // "pending": the wallet had not applied the settlement within the stream's wait; its balance is the one to show.
  const now = status === "pending" ? header : available;
  const span = $("result").querySelector<HTMLElement>(".round-balance");
  if (!span || now === undefined) return;
  span.dataset.balance = now.toString();
  span.textContent = `${ui("newBalance")} ${money(now)}`;
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
        onReconnect: () => {
          link.dataset.state = "reconnecting";
          link.textContent = "⟳";
        },
      });
      for await (const u of updates) {
        link.dataset.state = "live";
        link.textContent = "●";
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
      link.textContent = explain(error);
      return;
    }
  }
}

// ------------------------------------------------------------------ verification

/** The round checked in this browser from its revealed seed (docs/fairness.md); retried on failure to fetch. */
async function verify(roundId: string): Promise<void> {
  const table = state.table;
  const mark = $("verify");
  if (!table) return;
  for (let attempt = 1; attempt <= VERIFY_ATTEMPTS; attempt++) {
    if (state.boardRound !== roundId) return;
    mark.dataset.status = attempt === 1 ? "verifying" : "retrying";
    mark.textContent = attempt === 1 ? ui("verifying") : `${ui("verifyRetry")} (${attempt}/${VERIFY_ATTEMPTS})`;
    try {
      const view = await client.table.getRound({ tableId: table.tableId, roundId });
      const result = await fairness.verifyRound(view);
      if (state.boardRound !== roundId) return;
      const failed = result.checks.filter((c) => !c.ok);
      const dealt = result.checks.some((c) => c.name === "deck" || c.name === "split");
      mark.dataset.status = !result.ok ? "failed" : dealt ? "verified" : "commitment-only";
      mark.textContent = !result.ok ? `✗ ${ui("verifyFailed")}: ${failed.map((c) => c.detail).join("; ")}` : dealt ? `✓ ${ui("verified")}` : `✓ ${ui("seedOnly")}`;
      mark.title = result.checks.map((c) => `${c.name}: ${c.detail}`).join("\n");
      announce(mark.textContent);
      return;
    } catch (error) {
      mark.title = String(error);
      if (attempt < VERIFY_ATTEMPTS) await sleep(VERIFY_BACKOFF_MS * 2 ** (attempt - 1));
    }
  }
  mark.dataset.status = "error";
  mark.textContent = lang() === "zh" ? "無法驗證本局" : "could not verify this round";
}

applyLanguage();
