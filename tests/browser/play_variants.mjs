// Two players at the reference web table in headless Chromium (Debian's /usr/bin/chromium,
// driven by playwright-core from clients/web's dev dependencies), one on a desktop window and
// one on a 390x844 phone reading Chinese, play one round of each table given. Run by
// tests/browser/test_web_table.py, which starts the stack and the gateway serving the page.
//
// Input (environment): NIUNIU_WEB_URL, NIUNIU_WEB_PLAYERS (JSON [{username, password}] x2:
// desktop, phone), NIUNIU_WEB_TABLES (JSON [{tableId, variant, chip, areas: [desktop, phone],
// cancelArea}]), NIUNIU_WEB_SCREENSHOTS (a directory), CHROMIUM (the browser binary).
// Output: one JSON line on stdout: the tables listed, then per table and player what the page showed.
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
const VIEWPORTS = [
  { name: "desktop", viewport: { width: 1280, height: 900 }, lang: "en" },
  { name: "phone", viewport: { width: 390, height: 844 }, lang: "zh", isMobile: true, hasTouch: true },
];

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-dev-shm-usage"],
});
const log = (...a) => console.error(new Date().toISOString(), ...a);

async function openPage(player, device) {
  const context = await browser.newContext({ viewport: device.viewport, isMobile: device.isMobile ?? false, hasTouch: device.hasTouch ?? false });
  const page = await context.newPage();
  page.on("console", (m) => log(`[${player.username} console] ${m.text()}`));
  page.on("pageerror", (e) => log(`[${player.username} pageerror] ${e.message}`));
  await page.goto(URL_);
  await page.fill("#username", player.username);
  await page.fill("#password", player.password);
  await page.click("#login-btn");
  await page.waitForSelector("#tables-panel:not([hidden])");
  await page.waitForSelector("#balance[data-available]");
  if (device.lang === "zh") await page.click("#lang-btn");
  return page;
}

/** A betting window with enough time left for both players to bet; its round id. */
async function bettingRound(page) {
  await page.waitForFunction(
    () => document.getElementById("phase")?.dataset.phase === "betting" && Number(document.getElementById("countdown")?.dataset.remainingMs ?? 0) > 4000,
    undefined,
    { timeout: ROUND_TIMEOUT_MS, polling: 100 },
  );
  return page.evaluate(() => document.getElementById("phase")?.dataset.roundId ?? "");
}

/** Choose a chip, read what the page says the bet can cost, bet, and read the wallet's hold the page shows. */
async function placeBet(page, area, chipMinor) {
  await page.click(`.chip[data-minor="${chipMinor}"]`);
  const risk = await page.evaluate(() => ({ ...document.getElementById("risk").dataset, text: document.getElementById("risk").textContent }));
  await page.evaluate(() => { document.getElementById("action-error").textContent = ""; });
  await page.click(`.area[data-area="${area}"]`);
  const bet = `#my-bets li[data-area="${area}"]`;
  await page.waitForFunction(
    (sel) => document.querySelector(sel) || document.getElementById("action-error")?.textContent,
    bet,
    { timeout: 10_000, polling: 50 },
  );
  const error = await page.textContent("#action-error");
  if (error) throw new Error(`the bet was refused: ${error}`);
  const placed = await page.evaluate((sel) => ({ ...document.querySelector(sel).dataset }), bet);
  return { riskBefore: risk, placed };
}

async function outcome(page, roundId) {
  await page.waitForSelector(`#verify[data-round-id="${roundId}"][data-status="verified"]`, { timeout: ROUND_TIMEOUT_MS });
  await page.waitForSelector(`#result[data-round-id="${roundId}"] .round-balance[data-balance]`, { timeout: 40_000 });
  await page.waitForFunction(
    (want) => document.getElementById("balance")?.dataset.available === want,
    await page.evaluate(() => document.querySelector("#result .round-balance").dataset.balance),
    { timeout: 10_000 },
  );
  return page.evaluate(() => {
    const inView = (id) => {
      const r = document.getElementById(id).getBoundingClientRect();
      return { top: r.top, bottom: r.bottom, inside: r.top >= 0 && r.bottom <= window.innerHeight && r.height > 0 };
    };
    const result = document.getElementById("result");
    return {
      cardImages: document.querySelectorAll('#board svg.card[role="img"]:not(.back)').length,
      cardLabels: [...document.querySelectorAll('#board svg.card[role="img"]')].slice(0, 5).map((c) => c.getAttribute("aria-label")),
      seats: [...document.querySelectorAll("#board .seat .seat-name")].map((s) => s.textContent),
      categories: [...document.querySelectorAll("#board .category")].map((s) => s.textContent),
      grabs: document.querySelectorAll("#board .grab").length,
      result: result.textContent,
      status: result.dataset.status ?? "",
      net: result.dataset.net ?? "",
      balance: result.querySelector(".round-balance")?.dataset.balance ?? "",
      available: document.getElementById("balance").dataset.available,
      held: document.getElementById("balance").dataset.held,
      verify: document.getElementById("verify").textContent,
      verifyStatus: document.getElementById("verify").dataset.status,
      announced: document.getElementById("announcer").textContent,
      resultView: inView("result"),
      verifyView: inView("verify"),
      scrollY: window.scrollY,
      innerHeight: window.innerHeight,
    };
  });
}

async function playTable(pages, table) {
  for (const page of pages) {
    if (await page.isVisible("#tables-btn")) await page.click("#tables-btn");
    await page.click(`.table-pick[data-table-id="${table.tableId}"]`);
    await page.waitForSelector(`#table-panel[data-table-id="${table.tableId}"]`);
  }
  for (let attempt = 0; attempt < 4; attempt++) {
    const roundId = await bettingRound(pages[0]);
    if ((await bettingRound(pages[1])) !== roundId) continue;
    try {
      const bets = [];
      if (table.cancelArea) {
        // The desktop player also places and cancels a bet: the cancel takes it off the page.
        await placeBet(pages[0], table.cancelArea, table.chip);
        await pages[0].click(`#my-bets li[data-area="${table.cancelArea}"] .cancel`);
        await pages[0].waitForSelector(`#my-bets li[data-area="${table.cancelArea}"]`, { state: "detached", timeout: 10_000 });
      }
      for (const [i, page] of pages.entries()) bets.push(await placeBet(page, table.areas[i], table.chip));
      return { roundId, bets };
    } catch (error) {
      log(`betting in ${roundId} at ${table.tableId} failed (${error.message}); next round`);
    }
  }
  throw new Error(`no round of ${table.tableId} took both bets`);
}

const report = { tables: [], rounds: {} };
try {
  const pages = [];
  for (const [i, p] of PLAYERS.entries()) pages.push(await openPage(p, VIEWPORTS[i]));
  report.tables = await pages[0].evaluate(() =>
    [...document.querySelectorAll("#tables .table-row")].map((li) => ({ tableId: li.dataset.tableId, status: li.dataset.status, play: !!li.querySelector(".table-pick") })),
  );
  for (const table of TABLES) {
    log(`table ${table.tableId} (${table.variant})`);
    const { roundId, bets } = await playTable(pages, table);
    log(`bets placed in ${roundId}`);
    const players = {};
    for (const [i, page] of pages.entries()) {
      const seen = await outcome(page, roundId);
      const file = path.join(SHOTS, `${table.tableId}-${VIEWPORTS[i].name}.png`);
      await page.screenshot({ path: file, fullPage: VIEWPORTS[i].name === "desktop" });
      players[PLAYERS[i].username] = { ...seen, ...bets[i], device: VIEWPORTS[i].name, screenshot: file };
    }
    report.rounds[table.tableId] = { roundId, players };
  }
  console.log(JSON.stringify(report));
} finally {
  await browser.close();
}
