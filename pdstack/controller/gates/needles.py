"""The recall gate's prompts (gates/recall.py, and the churn gate's): needles, look-alike keys, a haystack of
neutral prose, and prompts of an exact token count built with the model's own tokenizer."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

KEYS = ("amber harbor", "cobalt ridge", "linen orchard", "quartz meadow", "willow bridge", "copper lantern",
        "violet canyon", "marble garden")

# Plain, neutral prose for the haystack (no question marks, nothing that looks like a needle).
HAYSTACK = (
    "The river ran past the old mill and the morning light fell across the valley. Farmers walked along the "
    "stone path with baskets of bread, and the children followed them to the market in the square. In the "
    "evening the wind turned cold and the lamps were lit one after another along the quiet street. A simple "
    "meal was shared at the long table, and stories were told about distant islands and ancient forests. "
    "Later the clouds drifted over the mountain and the first snow of winter settled on the silver roofs. "
    "Careful hands repaired the garden wall, and patient workers carried water from the well to the fields. "
    "The library kept its windows open in summer so that the sound of the ocean reached the reading room. "
    "Travelers spoke of bright harbors, hidden valleys and the steady rhythm of the seasons in the north. "
)


class TokenCounter:
    """Counts tokens with the model's tokenizer (HF `tokenizers`, from DIR/tokenizer.json)."""

    def __init__(self, tokenizer_dir: str | Path):
        from tokenizers import Tokenizer

        path = Path(tokenizer_dir)
        f = path / "tokenizer.json" if path.is_dir() else path
        if not f.exists():
            raise FileNotFoundError(f"no tokenizer.json at {path}; pass --tokenizer DIR (the model directory)")
        self.path = str(f)
        self.tok = Tokenizer.from_file(str(f))

    def count(self, text: str) -> int:
        return len(self.tok.encode(text, add_special_tokens=False).ids)

    def offsets(self, text: str) -> list[tuple[int, int]]:
        return list(self.tok.encode(text, add_special_tokens=False).offsets)


@dataclass
class Needle:
    key: str
    code: str
    depth: float  # % of the document before the needle

    @property
    def sentence(self) -> str:
        return f"The secret code for {self.key} is {self.code}."

    @property
    def question(self) -> str:
        return f"What is the secret code for {self.key}?"


class PromptBuilder:
    """Prompts of an exact token count: haystack, needles at their depths, then one question."""

    def __init__(self, counter: TokenCounter, max_length: int):
        self.counter = counter
        # enough haystack for the longest prompt, tokenized once (not once per repeat: quadratic, minutes at 131K
        # tokens); slices by token offsets
        repeats = (max_length + 64) // max(1, counter.count(HAYSTACK)) + 1
        text = HAYSTACK * repeats
        self.offs = counter.offsets(text)
        while len(self.offs) < max_length + 64:  # seams merged tokens: add a repeat more
            text += HAYSTACK
            self.offs = counter.offsets(text)
        self.text = text

    def _slice(self, a: int, b: int) -> str:
        """The haystack's tokens [a, b) as text."""
        if b <= a:
            return ""
        return self.text[self.offs[a][0]:self.offs[b - 1][1]]

    def build(self, length: int, needles: list[Needle], ask: Needle, prefix: str = "") -> str:
        return self.build_counted(length, needles, ask, prefix)[0]

    def build_counted(self, length: int, needles: list[Needle], ask: Needle, prefix: str = "") -> tuple[str, int]:
        """(prompt, its token count): `prefix` (a unique record line), the haystack with the needles at their depths,
        then the question; `length` tokens exactly, unless the fixed parts alone are longer."""
        ordered = sorted(needles, key=lambda n: n.depth)
        fixed = prefix + " ".join(n.sentence for n in ordered) + " " + ask.question
        n_fill = max(0, length - self.counter.count(fixed) - 2)
        for _ in range(8):  # converge on the exact count (BPE merges at the seams can shift it by a token or two)
            prompt = self._compose(n_fill, ordered, ask, prefix)
            got = self.counter.count(prompt)
            if got == length or n_fill == 0 and got > length:
                return prompt, got
            n_fill = max(0, n_fill + (length - got))
        return prompt, got

    def _compose(self, n_fill: int, needles: list[Needle], ask: Needle, prefix: str = "") -> str:
        parts, pos = [prefix.strip()] if prefix else [], 0
        for n in needles:
            cut = round(n_fill * n.depth / 100)
            parts.append(self._slice(pos, cut))
            parts.append(n.sentence)
            pos = max(pos, cut)
        parts.append(self._slice(pos, n_fill))
        body = " ".join(p for p in parts if p)
        return f"{body}\n{ask.question}"


def needle_depths(depth: float, n: int) -> list[float]:
    """The depths of n needles: the cell's depth first, the others spread evenly over the document."""
    return [depth] + [round((depth + 100 * k / n) % 100, 3) for k in range(1, n)]


def cell_needles(kind: str, depth: float, needles: int, rng: random.Random, index: int) -> tuple[list[Needle],
                                                                                          list[Needle]]:
    """(the needles in the prompt, those asked for, one request each) of a cell of this kind."""
    if kind == "single":
        ns = [Needle(KEYS[index % len(KEYS)], str(rng.randrange(100000, 1000000)), depth)]
        return ns, ns
    ds = needle_depths(depth, needles)
    if kind == "multikey":  # look-alike keys: one base, numbers of the same digits; the one at `depth` is asked
        base = KEYS[index % len(KEYS)]
        nums = rng.sample(range(10, 100), needles)
        ns = [Needle(f"{base} {num}", str(rng.randrange(100000, 1000000)), d) for num, d in zip(nums, ds, strict=True)]
        return ns, ns[:1]
    ns = [Needle(KEYS[i % len(KEYS)] + (f" {i // len(KEYS)}" if i >= len(KEYS) else ""),
                 str(rng.randrange(100000, 1000000)), nd) for i, nd in enumerate(ds)]
    return ns, ns
