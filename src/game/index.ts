// The game (pure TS, no GPU, no DOM). File readers live in govreport.node.ts / govreport.browser.ts.
export { Rng, type RngState } from './rng.ts';
export {
  normalizeText,
  isCharBoundary,
  snapBack,
  snapForward,
  sentenceEnds,
  wordEnds,
  tokenCharOffsets,
  tokensBefore,
  commonPrefixLength,
  type GameTokenizer,
} from './text.ts';
export {
  parseDocuments,
  splitGovReport,
  loadBundledGovReport,
  fitToBudget,
  documentForRound,
  DocumentParseError,
  GOVREPORT_PATH,
  type SpyDocument,
  type DocumentSplit,
  type DocumentCut,
  type BudgetedText,
} from './documents.ts';
export {
  maskSpan,
  type MaskMode,
  type MaskOptions,
  type MaskedDocument,
  type MaskedSpan,
  type SpanSnap,
} from './masking.ts';
export {
  assignRoles,
  playerName,
  seatOfLabel,
  seatsByLabel,
  MIN_GROUP_SIZE,
  MAX_GROUP_SIZE,
  type Roles,
} from './roles.ts';
export {
  DEFAULT_PROMPTS,
  VOTE_ANSWER_PREFIX,
  REASON_VOTE_SEPARATOR,
  renderPrompt,
  shareKvPrefix,
  summaryMessages,
  summaryPrompts,
  voteMessages,
  reasonPrompts,
  votePrompts,
  cleanReason,
  labelTokenIds,
  type PromptConfig,
  type ChatPrompt,
  type SummaryPrompts,
  type VotePromptInput,
} from './prompts.ts';
export { castVotes, renormalize, type Vote, type VoteChoice } from './votes.ts';
export {
  computeRewards,
  summaryFormat,
  formatPenalty,
  REWARD_FORMULAS,
  type RewardConfig,
  type RoundRewards,
  type FormatFlags,
} from './rewards.ts';
export {
  groupAdvantages,
  roundAdvantages,
  updateSpyBaseline,
  INITIAL_SPY_BASELINE,
  ADVANTAGE_FORMULAS,
  type AdvantageConfig,
  type SpyBaseline,
  type SpyBaselineState,
  type RoundAdvantages,
} from './advantages.ts';
export { rougeL, rougeTokenize, lcsLength, type RougeScore } from './rouge.ts';
export { porterStem } from './porter.ts';
export {
  DEFAULT_CONFIG,
  CONFIG_FIELDS,
  validateConfig,
  configLeaves,
  describeConfig,
  ConfigError,
  type SpyRLConfig,
  type SpyRLConfigInput,
  type SamplingConfig,
  type PpoConfig,
  type OptimizerConfig,
  type LoraSettings,
} from './config.ts';
export {
  playRound,
  runLogLine,
  roundRng,
  type Policy,
  type GenerateOptions,
  type Generation,
  type RoundContext,
  type RoundResult,
  type RoundRecord,
  type PolicySample,
  type SummaryRecord,
  type VoteRecord,
} from './round.ts';
