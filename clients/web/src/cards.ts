// Playing cards drawn as SVG: a card code from the API ("KD", "TH", "SJ" small joker, "BJ"
// big joker) becomes an image with the rank in two corners and the suit in the middle,
// named for screen readers ("K♦"). No image files, no fonts beyond the system's.

const SVG = "http://www.w3.org/2000/svg";
const SUITS: Record<string, { glyph: string; red: boolean; name: string }> = {
  S: { glyph: "♠", red: false, name: "spades" },
  H: { glyph: "♥", red: true, name: "hearts" },
  C: { glyph: "♣", red: false, name: "clubs" },
  D: { glyph: "♦", red: true, name: "diamonds" },
};

function node<K extends keyof SVGElementTagNameMap>(tag: K, attrs: Record<string, string | number>, text = ""): SVGElementTagNameMap[K] {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  if (text) el.textContent = text;
  return el;
}

/** What a card is called, for the image's accessible name and title. */
export function cardLabel(code: string): string {
  if (code === "SJ") return "small joker";
  if (code === "BJ") return "big joker";
  const rank = code.slice(0, -1) === "T" ? "10" : code.slice(0, -1);
  const suit = SUITS[code.slice(-1)];
  return suit ? `${rank}${suit.glyph}` : code;
}

/** One card as an SVG image (60 x 84 units, scaled by CSS). */
export function cardSvg(code: string): SVGSVGElement {
  const svg = node("svg", { viewBox: "0 0 60 84", class: "card", role: "img", "aria-label": cardLabel(code), "data-card": code });
  svg.append(node("title", {}, cardLabel(code)));
  svg.append(node("rect", { x: 1, y: 1, width: 58, height: 82, rx: 6, class: "face" }));
  if (code === "SJ" || code === "BJ") {
    const color = code === "BJ" ? "#c62828" : "#222";
    svg.append(node("text", { x: 30, y: 48, "text-anchor": "middle", "font-size": 26, fill: color }, "★"));
    svg.append(node("text", { x: 30, y: 74, "text-anchor": "middle", "font-size": 9, fill: color, "font-weight": "bold" }, "JOKER"));
    return svg;
  }
  const rank = code.slice(0, -1) === "T" ? "10" : code.slice(0, -1);
  const suit = SUITS[code.slice(-1)] ?? { glyph: "?", red: false, name: "" };
  const color = suit.red ? "#c62828" : "#1a1a1a";
  svg.append(node("text", { x: 6, y: 18, "font-size": 15, "font-weight": "bold", fill: color }, rank));
  svg.append(node("text", { x: 6, y: 31, "font-size": 12, fill: color }, suit.glyph));
  svg.append(node("text", { x: 30, y: 56, "text-anchor": "middle", "font-size": 30, fill: color }, suit.glyph));
  svg.append(node("text", { x: 54, y: 78, "text-anchor": "end", "font-size": 15, "font-weight": "bold", fill: color }, rank));
  return svg;
}

/** A face-down card (a hand's hidden card before its reveal). */
export function cardBack(): SVGSVGElement {
  const svg = node("svg", { viewBox: "0 0 60 84", class: "card back", role: "img", "aria-label": "face down" });
  svg.append(node("rect", { x: 1, y: 1, width: 58, height: 82, rx: 6, class: "face" }));
  svg.append(node("rect", { x: 7, y: 7, width: 46, height: 70, rx: 4, class: "pattern" }));
  return svg;
}
