// Prefix sharing in the update: sequences that begin with the same prompt tokens (the civilians'
// identical summary prompts, every vote prompt up to its voter's own line, the spy's prompt up to
// the removed span) are packed into one training pass as a prefix tree, so the shared tokens go
// through the forward and the backward once instead of once per sequence.
//
// Layout: the tree's nodes depth-first, each subtree contiguous, so a token's ancestors come before
// it. Token j is seen by the queries t with j <= t < keyEnd[j] (the end of its subtree): its own
// branch and those below it, never a sibling's (shaders/attention.wgsl, define TREE). Positions
// are each token's index in its own sequence (RoPE), so every sequence's hidden states, log-probs
// and gradients are those of running it alone, up to f32 rounding; the shared tokens' gradients
// are the sums over the sequences that share them, as the chain rule gives.
//
// Only tokens without a target are shared: a sequence's tokens from its first target on (the last
// prompt token predicts the first completion token, which differs between sequences) stay its own.

export interface PackInput {
  ids: readonly number[];
  /** The token each position predicts, or -1 where none (TrainingPass's targets). */
  targets: readonly number[];
}

export interface PackedLayout {
  /** Packed tokens (T). */
  ids: number[];
  /** (T) the token each packed position predicts, or -1. */
  targets: number[];
  /** (T) each token's position in its own sequence. */
  positions: number[];
  /** (T) one past the last query that sees each key (the end of its subtree). */
  keyEnd: number[];
  /** Per input sequence, the index among the packed targets (TrainingPass's log-prob rows) of each of its targets, in order. */
  rows: number[][];
}

interface Node {
  token: number;
  children: Map<number, Node>;
  /** Input sequences whose own (unshared) tokens start below this node, in input order. */
  tails: number[];
}

/** Tokens before the sequence's first target: the part it may share. */
export function shareableLength(s: PackInput): number {
  const first = s.targets.findIndex((t) => t >= 0);
  return first < 0 ? s.ids.length : first;
}

/** Packs `seqs` into one prefix tree (see the top of this file). */
export function packSequences(seqs: readonly PackInput[]): PackedLayout {
  const root: Node = { token: -1, children: new Map(), tails: [] };
  for (const [i, s] of seqs.entries()) {
    if (s.targets.length !== s.ids.length)
      throw new RangeError(`sequence ${i}: ${s.targets.length} targets for ${s.ids.length} tokens`);
    let node = root;
    const n = shareableLength(s);
    for (let t = 0; t < n; t++) {
      const id = s.ids[t]!;
      let next = node.children.get(id);
      if (!next) node.children.set(id, (next = { token: id, children: new Map(), tails: [] }));
      node = next;
    }
    node.tails.push(i);
  }
  const out: PackedLayout = { ids: [], targets: [], positions: [], keyEnd: [], rows: seqs.map(() => []) };
  const tailTargets: { seq: number; at: number }[] = []; // packed index of each target, by sequence
  // Depth-first without recursion (prompts run to thousands of tokens): a node's token, its tails,
  // then its children's subtrees; a node's keyEnd is set when its subtree is done.
  const stack: { node: Node; depth: number; at: number; phase: 'enter' | 'exit' }[] = [];
  const pushChildren = (node: Node, depth: number) => {
    // Reversed onto the stack, so children are laid out in first-seen order.
    for (const c of [...node.children.values()].reverse())
      stack.push({ node: c, depth: depth + 1, at: -1, phase: 'enter' });
  };
  const emitTails = (node: Node, depth: number) => {
    for (const i of node.tails) {
      const s = seqs[i]!;
      const start = out.ids.length;
      for (let t = depth; t < s.ids.length; t++) {
        out.ids.push(s.ids[t]!);
        out.targets.push(s.targets[t]!);
        out.positions.push(t);
        if (s.targets[t]! >= 0) tailTargets.push({ seq: i, at: out.ids.length - 1 });
      }
      for (let t = start; t < out.ids.length; t++) out.keyEnd.push(out.ids.length);
    }
  };
  // The root holds no token: its children are the trees of sequences' first tokens.
  for (const c of [...root.children.values()].reverse()) stack.push({ node: c, depth: 0, at: -1, phase: 'enter' });
  emitTails(root, 0); // sequences that share nothing (their first token has a target)
  while (stack.length) {
    const f = stack.pop()!;
    if (f.phase === 'exit') {
      out.keyEnd[f.at] = out.ids.length;
      continue;
    }
    const at = out.ids.length;
    out.ids.push(f.node.token);
    out.targets.push(-1);
    out.positions.push(f.depth);
    out.keyEnd.push(-1);
    stack.push({ node: f.node, depth: f.depth, at, phase: 'exit' });
    // The sequences ending their shared part here: their own tokens right after it, inside its
    // subtree and before its children's (which never see them: past the tails' keyEnd).
    emitTails(f.node, f.depth + 1);
    pushChildren(f.node, f.depth);
  }
  // Targets are log-prob rows in packed order.
  tailTargets.sort((a, b) => a.at - b.at);
  for (const [m, x] of tailTargets.entries()) out.rows[x.seq]!.push(m);
  return out;
}

/** Tokens a pack saves: the sum of the sequences' lengths minus the packed length. */
export function sharedTokens(seqs: readonly PackInput[], layout: PackedLayout): number {
  return seqs.reduce((n, s) => n + s.ids.length, 0) - layout.ids.length;
}
