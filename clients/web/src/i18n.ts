// The names a player reads: areas, seats, hands, phases, outcomes and refusals, in English
// and Chinese (the seeds' own names: 牛牛, 天 地 玄 黃, 五花牛 ...). Ids from the API never
// reach the page without going through here.

export type Lang = "en" | "zh";
type Pair = readonly [en: string, zh: string];

let current: Lang = localStorage.getItem("niuniu-lang") === "zh" ? "zh" : "en";

export function lang(): Lang {
  return current;
}

export function setLang(next: Lang): void {
  current = next;
  localStorage.setItem("niuniu-lang", next);
  document.documentElement.lang = next === "zh" ? "zh-Hant" : "en";
}

const pick = (pair: Pair): string => (current === "zh" ? pair[1] : pair[0]);

const ZH_DIGITS = ["零", "一", "二", "三", "四", "五", "六", "七", "八", "九", "十"];

const VARIANTS: Record<string, Pair> = {
  golden_bull: ["Golden Bull", "金牛牛"],
  bai_buu: ["Bai Buu", "百佛"],
  baibian_bull: ["Hundred-player Bull", "百變牛牛"],
  red_envelope_bull: ["68 NiuNiu red envelope", "68牛牛紅包"],
};

const SEATS: Record<string, Pair> = {
  dealer: ["Dealer", "莊家"],
  banker: ["Banker", "莊家"],
  area_1: ["Area 1", "一門"],
  area_2: ["Area 2", "二門"],
  area_3: ["Area 3", "三門"],
  heaven: ["Heaven", "天"],
  earth: ["Earth", "地"],
  mystic: ["Mystic", "玄"],
  yellow: ["Yellow", "黃"],
  banker_01: ["Banker 01", "莊 01"],
  banker_02: ["Banker 02", "莊 02"],
  banker_03: ["Banker 03", "莊 03"],
  player_01: ["Player 01", "閒 01"],
  player_02: ["Player 02", "閒 02"],
  player_03: ["Player 03", "閒 03"],
  jackpot_banker: ["Jackpot: Banker", "彩池 莊"],
  jackpot_player_01: ["Jackpot: Player 01", "彩池 閒 01"],
  jackpot_player_02: ["Jackpot: Player 02", "彩池 閒 02"],
  jackpot_player_03: ["Jackpot: Player 03", "彩池 閒 03"],
};

/** An area or seat. 68 NiuNiu's only area ("dealer") is a bet against the dealer. */
export function areaName(variant: string, area: string): string {
  if (variant === "red_envelope_bull" && area === "dealer") return pick(["Bet against the dealer", "押莊"]);
  const known = SEATS[area];
  return known ? pick(known) : area;
}

export function variantName(variant: string): string {
  const known = VARIANTS[variant];
  return known ? pick(known) : variant;
}

const CATEGORIES: Record<string, Pair> = {
  five_small: ["Five Small Bull", "五小牛"],
  bomb: ["Bomb Bull", "炸彈牛"],
  five_face: ["Five Face Bull", "五花牛"],
  four_face: ["Four Face Bull", "四花牛"],
  gold: ["Gold Bull", "金牛"],
  silver: ["Silver Bull", "銀牛"],
  bull_bull: ["Bull Bull", "牛牛"],
  no_bull: ["No Bull", "無牛"],
  // Bai Buu: the whole hand's category on its last reveal
  four_of_a_kind: ["Four of a kind", "四條"],
  three_of_a_kind: ["Three of a kind", "三條"],
  flush: ["Flush", "同花"],
  plain: ["Plain", "散牌"],
  // 68 NiuNiu: the envelope's amount
  baozi: ["Leopard (three alike)", "豹子"],
  manniu: ["Full Bull", "滿牛"],
  fanshun: ["Reverse straight", "反順"],
  shunzi: ["Straight", "順子"],
  duizi: ["Pair", "對子"],
  jinniu: ["Golden Bull", "金牛"],
};

/** A hand's (or an envelope's, or a Bai Buu pair of cards') category. */
export function categoryName(category: string): string {
  const known = CATEGORIES[category];
  if (known) return pick(known);
  let m = /^bull_(\d)$/.exec(category);
  if (m) return pick([`Bull ${m[1]}`, `牛${ZH_DIGITS[Number(m[1])]}`]);
  m = /^points_(\d+)(_5)?$/.exec(category);
  if (m) {
    const n = Number(m[1]);
    if (n === 10 && !m[2]) return pick(["Niu Niu (10 points)", "牛牛"]);
    return m[2] ? pick([`${n}½ points`, `${n}點半`]) : pick([`${n} points`, `${n}點`]);
  }
  m = /^pair_([2-9TJQKA])$/.exec(category);
  if (m) return pick([`Pair of ${m[1] === "T" ? "10" : m[1]}`, `對${m[1] === "T" ? "10" : m[1]}`]);
  return category;
}

const PHASES: Record<string, Pair> = {
  bidding: ["Bidding for the dealer seat", "搶莊"],
  betting: ["Place your bets", "請下注"],
  dealing: ["Dealing", "發牌"],
  revealing: ["Revealing", "開牌"],
  settling: ["Settling", "結算中"],
  settled: ["Settled", "已結算"],
  voided: ["Round voided", "本局作廢"],
};

export function phaseName(phase: string): string {
  const known = PHASES[phase];
  return known ? pick(known) : phase || "–";
}

const OUTCOMES: Record<string, Pair> = {
  win: ["won", "贏"],
  loss: ["lost", "輸"],
  push: ["push", "和"],
  refunded: ["refunded", "退還"],
  cancelled: ["cancelled", "已取消"],
  placed: ["placed", "已下注"],
};

export function outcomeName(outcome: string): string {
  const known = OUTCOMES[outcome];
  return known ? pick(known) : outcome;
}

/** What a refusal means for the player, by its reason code (the API's text is not shown). */
const REASONS: Record<string, Pair> = {
  BETTING_CLOSED: ["Betting has closed for this round. Try the next one.", "本局已停止下注，請等下一局。"],
  BIDDING_CLOSED: ["Bidding for the dealer seat has closed.", "搶莊已結束。"],
  INSUFFICIENT_FUNDS: ["Not enough balance to cover what this bet can cost.", "餘額不足以支付此注的最高風險。"],
  BELOW_TABLE_MINIMUM: ["The stake is below the table minimum.", "注額低於本桌最低限額。"],
  ABOVE_TABLE_MAXIMUM: ["That would take your stakes above the table maximum.", "注額超過本桌最高限額。"],
  NOT_A_CHIP_AMOUNT: ["Bet with the table's chips.", "請使用本桌籌碼下注。"],
  TABLE_CLOSED: ["This table is closed.", "本桌已關閉。"],
  TABLE_BUSY: ["The table is busy. Try again.", "本桌繁忙，請重試。"],
  ROUND_MISMATCH: ["That round is over: a new one has started.", "該局已結束，新一局已開始。"],
  ROUND_FULL: ["This round takes no more bets.", "本局注數已滿。"],
  PLAYER_ROUND_FULL: ["You have placed the most bets allowed this round.", "您本局下注次數已達上限。"],
  NO_BANKER: ["Nobody banks this round: no bets until a banker sits.", "本局無人坐莊，暫不能下注。"],
  BANKER_CANNOT_BET: ["The banker cannot bet against their own seat.", "莊家不能下注。"],
  DEALER_CANNOT_BET: ["The dealer cannot bet this round.", "莊家本局不能下注。"],
  BID_TOO_LOW: ["Bid higher: the bid must beat the highest by the increment.", "出價太低，須高於最高出價加上加價幅度。"],
  NO_BIDDING: ["There is no bidding now.", "現在不能搶莊。"],
  CLIENT_SEED_MALFORMED: ["A client seed is 1-64 letters, digits or . _ ~ + / = -", "客戶種子須為 1-64 個字母、數字或 . _ ~ + / = -"],
  CHANGE_IN_PROGRESS: ["Your previous change is still being applied.", "上一次修改仍在處理中。"],
  SELF_EXCLUDED: ["Your account is self-excluded.", "您的帳戶已自我禁止。"],
  SELF_EXCLUSION_ACTIVE: ["Your account is self-excluded.", "您的帳戶已自我禁止。"],
  INVALID_CREDENTIALS: ["Wrong username or password.", "用戶名或密碼錯誤。"],
  USERNAME_INVALID: ["A username is 3-32 letters, digits, . _ or -.", "用戶名須為 3-32 個字母、數字或 . _ -"],
  WALLET_UNAVAILABLE: ["The wallet is not answering. Try again.", "錢包暫時無回應，請重試。"],
  WALLET_BUSY: ["The wallet is busy. Try again.", "錢包繁忙，請重試。"],
  SERVICE_UNAVAILABLE: ["The game is not reachable. Try again.", "無法連線，請重試。"],
  AMOUNT_NOT_POSITIVE: ["Enter an amount above zero.", "請輸入大於零的金額。"],
  AMOUNT_INVALID: ["That amount is not valid.", "金額無效。"],
};

export function reasonMessage(reason: string, fallback: string): string {
  const known = REASONS[reason];
  if (known) return pick(known);
  return reason ? pick([`Refused (${reason}).`, `已拒絕（${reason}）。`]) : fallback;
}

/** The page's own words. */
const UI: Record<string, Pair> = {
  balance: ["Balance", "餘額"],
  held: ["held", "凍結"],
  stake: ["Stake", "注額"],
  risk: ["can cost up to", "最多可輸"],
  play: ["Play", "入座"],
  closed: ["closed", "已關閉"],
  closing: ["closing", "即將關閉"],
  tables: ["Tables", "牌桌"],
  myBets: ["My bets", "我的下注"],
  cancel: ["cancel", "取消"],
  result: ["Result", "結果"],
  net: ["net", "淨額"],
  verified: ["verified", "已驗證"],
  verifying: ["verifying…", "驗證中…"],
  verifyFailed: ["verification FAILED", "驗證失敗"],
  verifyPending: ["verified once the seed is revealed", "種子公開後驗證"],
  verifyRetry: ["could not verify yet; retrying", "暫時無法驗證，重試中"],
  seedOnly: ["seed matches its commitment (nothing dealt)", "種子與承諾相符（未發牌）"],
  round: ["Round", "第"],
  you: ["you", "你"],
  waiting: ["waiting for the wallet…", "等待錢包結算…"],
  newBalance: ["new balance", "新餘額"],
  bid: ["Bid for the dealer seat", "搶莊出價"],
  grab: ["grab", "搶"],
  clientSeed: ["Client seed (optional)", "客戶種子（可選）"],
  noBets: ["none", "無"],
};

export function ui(key: keyof typeof UI | string): string {
  const known = UI[key];
  return known ? pick(known) : key;
}
