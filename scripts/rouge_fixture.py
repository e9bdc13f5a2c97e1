"""Writes test/fixtures/rouge/rouge_cases.json: (reference, candidate, expected ROUGE-1/2/L) triples
for test/game/rougeFull.test.ts, with and without Porter stemming.

The expected scores come from Google's rouge_score package when it is importable
(RougeScorer(['rouge1', 'rouge2', 'rougeL'], use_stemmer=...)). Where it is not installed (our pip
mirror lacks it), they come from `reference_scores` below: rouge_score's documented algorithm
(tokenize.py: lowercase, non-[a-z0-9] runs to spaces, stem tokens longer than 3 characters; n-gram
overlap / LCS with max(count, 1) denominators) written out in Python on top of NLTK's real
PorterStemmer, the stemmer rouge_score itself calls. Either way the stemmer is NLTK's, so this
checks our TypeScript port of it (src/game/porter.ts) on thousands of real GovReport words.

  python3 -m venv .venv-ref && .venv-ref/bin/pip install nltk   # rouge_score too, if available
  .venv-ref/bin/python scripts/rouge_fixture.py
"""
import collections
import json
import random
import re
import sys
from pathlib import Path

from nltk.stem import porter

ROOT = Path(__file__).resolve().parent.parent
STEMMER = porter.PorterStemmer()  # mode NLTK_EXTENSIONS, as rouge_score constructs it


def tokenize(text, use_stemmer):
    text = re.sub(r"[^a-z0-9]+", " ", text.lower())
    tokens = re.split(r"\s+", text)
    if use_stemmer:
        tokens = [STEMMER.stem(t) if len(t) > 3 else t for t in tokens]
    return [t for t in tokens if re.match(r"^[a-z0-9]+$", t)]


def prf(overlap, n_pred, n_target):
    p = overlap / max(n_pred, 1)
    r = overlap / max(n_target, 1)
    return {"precision": p, "recall": r, "fmeasure": 2 * p * r / (p + r) if p + r > 0 else 0.0}


def ngrams(tokens, n):
    return collections.Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def lcs(a, b):
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def reference_scores(target, prediction, use_stemmer):
    t, p = tokenize(target, use_stemmer), tokenize(prediction, use_stemmer)
    out = {}
    for n in (1, 2):
        tn, pn = ngrams(t, n), ngrams(p, n)
        overlap = sum(min(c, tn[g]) for g, c in pn.items())
        out[f"rouge{n}"] = prf(overlap, sum(pn.values()), sum(tn.values()))
    out["rougeL"] = prf(lcs(t, p), len(p), len(t)) if t and p else {"precision": 0.0, "recall": 0.0, "fmeasure": 0.0}
    return out


def scorer():
    try:
        from rouge_score import rouge_scorer  # type: ignore
    except ImportError:
        return None, "nltk PorterStemmer + rouge_score's algorithm (scripts/rouge_fixture.py)"
    scorers = {s: rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=s) for s in (False, True)}

    def score(target, prediction, use_stemmer):
        r = scorers[use_stemmer].score(target, prediction)
        return {k: {"precision": v.precision, "recall": v.recall, "fmeasure": v.fmeasure} for k, v in r.items()}

    return score, "rouge_score " + getattr(sys.modules.get("rouge_score"), "__version__", "")


def main():
    rows = [json.loads(l) for l in (ROOT / "data/govreport/govreport_sample.jsonl").read_text().splitlines() if l.strip()]
    rng = random.Random(0)
    pairs = [
        ("The quick brown fox jumps over the lazy dog", "The quick brown dog jumps on the log."),
        ("", "anything at all"),
        ("Same text.", "same TEXT"),
        ("The agencies' reported obligations increased", "Agency reporting of obligation increases"),
        ("a a a b", "a b b b a"),
        ("The U.S. GAO's FY-2020 report: café & naïve!", "the gao reports in fy2020 on cafes"),
    ]
    for row in rows[:14]:
        ref = row.get("summary") or ""
        sents = re.split(r"(?<=[.!?])\s+", row["report"])
        start = rng.randrange(max(1, len(sents) - 8))
        cand = " ".join(sents[start:start + rng.randint(2, 8)])  # an extractive "summary"
        pairs.append((ref, cand))
        words = ref.split()
        rng.shuffle(words)
        pairs.append((ref, " ".join(words[: len(words) // 2])))  # same words, scrambled order
    score, source = scorer()
    cases = []
    for ref, cand in pairs:
        for stem in (False, True):
            ours = reference_scores(ref, cand, stem)
            if score is not None:
                theirs = score(ref, cand, stem)
                for k in ours:
                    assert abs(ours[k]["fmeasure"] - theirs[k]["fmeasure"]) < 1e-12, (k, ref[:40], cand[:40])
                ours = theirs
            cases.append({"reference": ref, "candidate": cand, "useStemmer": stem, "expected": ours,
                          "tokens": len(tokenize(cand, stem))})
    # Every distinct word of the sample through NLTK's stemmer: a direct check of porter.ts.
    words = sorted({w for row in rows for w in tokenize(row["report"] + " " + row.get("summary", ""), False) if len(w) > 3})
    out = {"source": source, "cases": cases, "stems": {w: STEMMER.stem(w) for w in words}}
    dest = ROOT / "test/fixtures/rouge/rouge_cases.json"
    dest.write_text(json.dumps(out, indent=0, ensure_ascii=False) + "\n")
    print(f"wrote {len(cases)} cases and {len(words)} stems to {dest} ({source})")


if __name__ == "__main__":
    main()
