// Two players at the reference web table in headless Chromium (Debian's /usr/bin/chromium,
// driven by playwright-core from clients/web's dev dependencies). Run by
// tests/browser/test_web_table.py, which starts the stack, the gateway and the page's server.
//
// Input (environment): NIUNIU_WEB_URL (the page, served by the gateway), NIUNIU_WEB_PLAYERS (JSON
// [{username, password, area}] x2), NIUNIU_WEB_TABLES (JSON [{tableId, variant}]),
// NIUNIU_WEB_SCREENSHOTS (a directory), CHROMIUM (the browser binary).
// Output: one JSON line on stdout, per table and player what the page showed.
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(here, "../../clients/web/package.json"));
const { chromium } = require("playwright-core");

const URL_ = process.env.NIUNIU_WEB_URL;
const PLAYERS = JSON.parse(process.env.NIUNIU_WEB_PLAYERS ?? "[]");
const TABLES = JSON.parse(process.env.NIUNIU_WEB_TABLES ?? "[]");
const SHOTS = process.env.NIUNIU_WEB_SCREENSHOTS ?? ".";
const ROUND_TIMEOUT_MS = 120_000;

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-dev-shm-usage"],
});
const log = (...a) => console.error(new Date().toISOString(), ...a);

async function openPage(player) {
  const context = await browser.newContext({ viewport: { width: 1100, height: 1400 } });
  const page = await context.newPage();
  page.on("console", (m) => log(`[${player.username} console] ${m.text()}`));
  page.on("pageerror", (e) => log(`[${player.username} pageerror] ${e.message}`));
  await page.goto(URL_);
  await page.fill("#username", player.username);
  await page.fill("#password", player.password);
  await page.click("#login-btn");
  await page.waitForSelector("#tables-panel:not([hidden])");
  await page.waitForSelector('#who[data-balance]');
  return page;
}

/** Wait for a betting window with enough time left for both players to click. */
async function bettingRound(page) {
  await page.waitForFunction(
    () => document.getElementById("phase")?.textContent === "betting" && Number(document.getElementById("countdown")?.dataset.remainingMs ?? 0) > 3500,
    undefined,
    { timeout: ROUND_TIMEOUT_MS, polling: 100 },
  );
  return (await page.textContent("#round-id")) ?? "";
}

async function placeBet(page, area, chipMinor) {
  await page.click(`.chip[data-minor="${chipMinor}"]`);
  await page.click(`.area[data-area="${area}"]`);
  await page.waitForSelector(`#my-bets li[data-area="${area}"]`, { timeout: 10_000 });
}

async function outcome(page, roundId) {
  const round = `section.round[data-round-id="${roundId}"]`;
  await page.waitForSelector(`${round} .verify[data-status="verified"]`, { timeout: ROUND_TIMEOUT_MS });
  await page.waitForSelector(`${round} .balance[data-balance]`, { timeout: 30_000 });
  return page.evaluate((sel) => {
    const r = document.querySelector(sel);
    const text = (q) => r.querySelector(q)?.textContent ?? "";
    return {
      hands: [...r.querySelectorAll(".hands li")].map((li) => li.textContent),
      grabs: [...r.querySelectorAll(".grabs li")].map((li) => li.textContent),
      result: text(".result"),
      status: r.querySelector(".result")?.dataset.status ?? "",
      net: r.querySelector(".result")?.dataset.net ?? "",
      balance: r.querySelector(".balance")?.dataset.balance ?? "",
      verify: text(".verify"),
      verifyStatus: r.querySelector(".verify")?.dataset.status ?? "",
      header: document.getElementById("who")?.dataset.balance ?? "",
    };
  }, round);
}

const report = {};
try {
  const pages = [];
  for (const p of PLAYERS) pages.push(await openPage(p));
  for (const table of TABLES) {
    log(`table ${table.tableId} (${table.variant})`);
    for (const page of pages) {
      await page.click(`.table-pick[data-table-id="${table.tableId}"]`);
      await page.waitForSelector(`#table-panel[data-table-id="${table.tableId}"]`);
    }
    // Both pages must agree on the round they bet in; retry on the next round if a window closes under us.
    let roundId = "";
    for (let attempt = 0; attempt < 3 && !roundId; attempt++) {
      const first = await bettingRound(pages[0]);
      const second = await bettingRound(pages[1]);
      if (first !== second) continue;
      try {
        // The first player also places and cancels a bet: the cancel must take it off the page.
        const alice = pages[0];
        const extraArea = table.cancelArea ?? null;
        if (extraArea) {
          await placeBet(alice, extraArea, table.chips[0]);
          await alice.click(`#my-bets li[data-area="${extraArea}"] .cancel`);
          await alice.waitForSelector(`#my-bets li[data-area="${extraArea}"]`, { state: "detached", timeout: 10_000 });
        }
        for (const [i, page] of pages.entries()) await placeBet(page, table.areas[i], table.chips[Math.min(i + 1, table.chips.length - 1)]);
        roundId = first;
      } catch (error) {
        log(`betting in ${first} failed (${error.message}); next round`);
      }
    }
    if (!roundId) throw new Error(`no round of ${table.tableId} took both bets`);
    log(`bets placed in ${roundId}`);
    const players = {};
    for (const [i, page] of pages.entries()) players[PLAYERS[i].username] = await outcome(page, roundId);
    for (const [i, page] of pages.entries()) {
      const file = path.join(SHOTS, `${table.tableId}-${PLAYERS[i].username}.png`);
      await page.locator(`section.round[data-round-id="${roundId}"]`).scrollIntoViewIfNeeded();
      await page.screenshot({ path: file, fullPage: true });
      players[PLAYERS[i].username].screenshot = file;
    }
    report[table.tableId] = { roundId, players };
  }
  console.log(JSON.stringify(report));
} finally {
  await browser.close();
}
