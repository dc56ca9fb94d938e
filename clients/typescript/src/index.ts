export { NiuniuClient, ServerClock, type ClientOptions, type Protocol, type Session } from "./client.js";
export {
  watchTable,
  isKeepalive,
  isNew,
  serverTimeOf,
  DeadLinkError,
  ResumeGapError,
  type WatchOptions,
  type WatchState,
  type ReconnectInfo,
} from "./watch.js";
export { formatMoney, parseMoney, toChips, MoneyError, type Minor, type MoneyFormat } from "./money.js";
export { reasonOf, REASON_KEY } from "./errors.js";
export * as fairness from "./fairness.js";
export { verifyRound, type Verification, type VerifyInput } from "./fairness.js";
export * as tablePb from "./gen/niuniu/table/v1/table_pb.js";
export * as tableEventsPb from "./gen/niuniu/table/v1/events_pb.js";
export * as walletPb from "./gen/niuniu/wallet/v1/wallet_pb.js";
export { Table, type TableUpdate, type RoundView, type TableInfo } from "./gen/niuniu/table/v1/table_pb.js";
export { Wallet } from "./gen/niuniu/wallet/v1/wallet_pb.js";
export { Code, ConnectError } from "@connectrpc/connect";
