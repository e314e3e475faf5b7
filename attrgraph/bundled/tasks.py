"""Task generators for the bundled model's corpus, with known answers.

Each task yields `Example`s: a list of word-level tokens plus the positions whose
token is a graded prediction (teacher-forced next-token top-1), and for the
tasks used in circuit discovery a corrupted counterpart of the same length.

Tasks and their known mechanisms (the literature each one comes from):

1. induction  random words, then the same words again; heads that attend to the
              token after the previous occurrence (Olsson et al., 2022).
2. ioi        the 15 templates of Wang et al. (2022), as listed in the HAP seed's
              appendix A, in both name orders (ABBA and BABA); the answer is the
              indirect object. Corruption: a third name replaces S2 (the "ABC" set).
3. greater-than  "The war lasted from the year 17 YY to the year 17" -> ZZ > YY
              (Hanna et al., 2023; the PEAP seed); corruption: YY = "01".
4. brackets   a random bracket prefix, "|", then every still-open bracket closed
              in order and "." once depth reaches 0 (stack tracking).
5. addition   "3 4 + 2 5 = 5 9": two-digit numbers written digit by digit so
              that carries are learnable; every answer digit is graded.
6. facts      "The capital of France is Paris ." (factual recall).
7. filler     sentences from a small grammar, so features are not all task-bound.

Numbers: a year "1732" is tokenized "17" "32" (two-digit chunks), which is why
years are written as two two-digit tokens; addition digits are single tokens.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from attrgraph.errors import OptionError

NAMES = (
    "Mary John Alice Bob Tom James Sarah Emma David Michael Anna Laura Paul Mark Lucy Kate Peter "
    "Jack Jane Rose Sam Max Leo Mia Noah Liam Olivia Ava Ella Grace Chloe Ethan Lucas Henry Oscar "
    "Ruby Lily Amy Ben Dan Tim Eric Adam Ryan Dylan Kevin Brian Jason Sophie Hannah Megan Rachel "
    "Nina Eva Ivy Zoe Jake Luke Owen Carl Frank George Harry Ian Joe Kyle Neil Ralph Scott Victor "
    "Walter Alex Chris Diana Fiona Helen Irene Julia Karen Linda Monica Nancy Paula Rita Susan "
    "Tina Vera Wendy Bella Clara Daisy Elena Felix Hugo Igor Jonas Kurt Lars Marco Nico"
).split()
PLACES = (
    "store school park hospital station restaurant garden library office market beach church "
    "museum theater bank cafe river house farm zoo"
).split()
OBJECTS = (
    "drink book ball kiss bone gift apple letter ring cake bag computer necklace basketball "
    "snack pen cup hat key flower"
).split()
IOI_TEMPLATES = (
    "Then , [B] and [A] went to the [PLACE] . [B] gave a [OBJECT] to [A]",
    "Then , [B] and [A] had a lot of fun at the [PLACE] . [B] gave a [OBJECT] to [A]",
    "Then , [B] and [A] were working at the [PLACE] . [B] decided to give a [OBJECT] to [A]",
    "Then , [B] and [A] were thinking about going to the [PLACE] . [B] wanted to give a [OBJECT] to [A]",
    "Then , [B] and [A] had a long argument , and afterwards [B] said to [A]",
    "After [B] and [A] went to the [PLACE] , [B] gave a [OBJECT] to [A]",
    "When [B] and [A] got a [OBJECT] at the [PLACE] , [B] decided to give it to [A]",
    "When [B] and [A] got a [OBJECT] at the [PLACE] , [B] decided to give the [OBJECT] to [A]",
    "While [B] and [A] were working at the [PLACE] , [B] gave a [OBJECT] to [A]",
    "While [B] and [A] were commuting to the [PLACE] , [B] gave a [OBJECT] to [A]",
    "After the lunch , [B] and [A] went to the [PLACE] . [B] gave a [OBJECT] to [A]",
    "Afterwards , [B] and [A] went to the [PLACE] . [B] gave a [OBJECT] to [A]",
    "Then , [B] and [A] had a long argument . Afterwards [B] said to [A]",
    "The [PLACE] [B] and [A] went to had a [OBJECT] . [B] gave it to [A]",
    "Friends [B] and [A] found a [OBJECT] at the [PLACE] . [B] gave it to [A]",
)
GT_NOUNS = "war dynasty famine reign expedition siege drought voyage plague rebellion".split()
CAPITALS = {
    "France": "Paris",
    "Germany": "Berlin",
    "Italy": "Rome",
    "Spain": "Madrid",
    "Portugal": "Lisbon",
    "Japan": "Tokyo",
    "China": "Beijing",
    "Russia": "Moscow",
    "Egypt": "Cairo",
    "Greece": "Athens",
    "Austria": "Vienna",
    "Poland": "Warsaw",
    "Norway": "Oslo",
    "Sweden": "Stockholm",
    "Finland": "Helsinki",
    "Denmark": "Copenhagen",
    "Ireland": "Dublin",
    "Hungary": "Budapest",
    "Belgium": "Brussels",
    "Netherlands": "Amsterdam",
    "Canada": "Ottawa",
    "Mexico": "Mexico_City",
    "Peru": "Lima",
    "Chile": "Santiago",
    "Argentina": "Buenos_Aires",
    "Kenya": "Nairobi",
    "Turkey": "Ankara",
    "Iran": "Tehran",
    "India": "Delhi",
    "Thailand": "Bangkok",
    "Vietnam": "Hanoi",
    "Cuba": "Havana",
    "Australia": "Canberra",
    "Brazil": "Brasilia",
    "Colombia": "Bogota",
    "Nigeria": "Abuja",
}
FILLER_WORDS = {
    "det": "the a every one this that".split(),
    "adj": "red big small old new happy quiet bright dark green blue cold warm tall".split(),
    "noun": "dog cat bird tree car boat city river child teacher farmer doctor song story".split()
    + OBJECTS[:8],
    "verb": "sees likes finds carries watches paints follows helps visits builds".split(),
    "prep": "near behind under beside inside".split(),
}
OPEN_CLOSE = {"(": ")", "[": "]", "{": "}", "<": ">"}
PUNCT = [".", ",", "+", "=", "|"]
TASKS = ("induction", "ioi", "greater_than", "brackets", "addition", "facts", "filler")


@dataclass(frozen=True)
class Example:
    """One task instance.

    tokens: the instance as word-level tokens (no BOS).
    graded: indices into `tokens` whose token is predicted from the tokens before it.
    valid: for greater-than, every token that counts as correct at the last graded index.
    corrupt: a same-length counterfactual (IOI: S2 -> a third name; greater-than: YY -> 01).
    meta: task-specific fields (names, years, ...) for analysis.
    """

    task: str
    tokens: tuple[str, ...]
    graded: tuple[int, ...]
    valid: tuple[str, ...] = ()
    corrupt: tuple[str, ...] | None = None
    meta: dict = field(default_factory=dict, compare=False)

    @property
    def text(self) -> str:
        return " ".join(self.tokens)

    @property
    def prompt(self) -> str:
        """The text before the first graded token (what a user would type)."""
        return " ".join(self.tokens[: self.graded[0]])

    @property
    def answer(self) -> str:
        return self.tokens[self.graded[0]]


def two_digit(n: int) -> str:
    return f"{n:02d}"


def content_words() -> list[str]:
    words = set(NAMES) | set(PLACES) | set(OBJECTS) | set(CAPITALS) | set(CAPITALS.values())
    for group in FILLER_WORDS.values():
        words |= set(group)
    return sorted(words)


def vocabulary() -> list[str]:
    """Every word any task can produce (the tokenizer's vocabulary, specials excluded)."""
    words = set(content_words()) | set(PUNCT) | set(OPEN_CLOSE) | set(OPEN_CLOSE.values())
    for template in IOI_TEMPLATES:
        words |= {w for w in template.split() if not w.startswith("[")}
    words |= set("The lasted from the year to capital of is".split()) | set(GT_NOUNS)
    words |= {str(d) for d in range(10)} | {two_digit(n) for n in range(100)}
    return sorted(words)


def induction(rng: random.Random) -> Example:
    pool = content_words()
    n = rng.randint(4, 12)
    seq = [rng.choice(pool) for _ in range(n)]
    tokens = seq + seq
    # the first repeated token is unpredictable; grade the rest of the second half
    return Example("induction", tuple(tokens), tuple(range(n + 1, 2 * n)), meta={"n": n})


def ioi(rng: random.Random, template: int | None = None, order: str | None = None) -> Example:
    t = IOI_TEMPLATES[rng.randrange(len(IOI_TEMPLATES)) if template is None else template]
    io, s, c = rng.sample(NAMES, 3)
    order = order or rng.choice(("ABBA", "BABA"))
    words = t.replace("[PLACE]", rng.choice(PLACES)).replace("[OBJECT]", rng.choice(OBJECTS)).split()
    slots = [i for i, w in enumerate(words) if w in ("[A]", "[B]")]
    first, second, s2, end = slots
    tokens = list(words)
    tokens[first], tokens[second] = (s, io) if order == "BABA" else (io, s)
    tokens[s2], tokens[end] = s, io
    corrupt = list(tokens)
    corrupt[s2] = c
    return Example(
        "ioi",
        tuple(tokens),
        (end,),
        corrupt=tuple(corrupt),
        meta={"io": io, "s": s, "c": c, "order": order, "s2_pos": s2, "template": t},
    )


def greater_than(rng: random.Random) -> Example:
    yy = rng.randint(2, 98)
    zz = rng.randint(yy + 1, 99)
    noun = rng.choice(GT_NOUNS)
    head = ["The", noun, "lasted", "from", "the", "year", "17", two_digit(yy), "to", "the", "year", "17"]
    corrupt = list(head)
    corrupt[7] = "01"
    return Example(
        "greater_than",
        tuple(head + [two_digit(zz), "."]),
        (len(head),),
        valid=tuple(two_digit(n) for n in range(yy + 1, 100)),
        corrupt=tuple(corrupt + [two_digit(zz), "."]),
        meta={"yy": yy},
    )


def brackets(rng: random.Random) -> Example:
    stack: list[str] = []
    prefix: list[str] = []
    for _ in range(rng.randint(3, 12)):
        if stack and rng.random() < 0.35:
            prefix.append(OPEN_CLOSE[stack.pop()])
        elif len(stack) < 6:
            stack.append(rng.choice(list(OPEN_CLOSE)))
            prefix.append(stack[-1])
    if not stack:
        stack.append(rng.choice(list(OPEN_CLOSE)))
        prefix.append(stack[-1])
    tail = [OPEN_CLOSE[b] for b in reversed(stack)] + ["."]
    tokens = prefix + ["|"] + tail
    start = len(prefix) + 1
    return Example("brackets", tuple(tokens), tuple(range(start, len(tokens))), meta={"depth": len(stack)})


def addition(rng: random.Random) -> Example:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    lhs = list(str(a)) + ["+"] + list(str(b)) + ["="]
    tokens = lhs + list(str(a + b)) + ["."]
    return Example("addition", tuple(tokens), tuple(range(len(lhs), len(tokens) - 1)), meta={"a": a, "b": b})


def facts(rng: random.Random) -> Example:
    country = rng.choice(sorted(CAPITALS))
    tokens = ["The", "capital", "of", country, "is", CAPITALS[country], "."]
    return Example("facts", tuple(tokens), (5,), meta={"country": country})


def filler(rng: random.Random) -> Example:
    w = FILLER_WORDS

    def noun_phrase() -> list[str]:
        adj = [rng.choice(w["adj"])] if rng.random() < 0.5 else []
        return [rng.choice(w["det"]), *adj, rng.choice(w["noun"])]

    tokens = noun_phrase() + [rng.choice(w["verb"])] + noun_phrase()
    if rng.random() < 0.4:
        tokens += [rng.choice(w["prep"]), "the", rng.choice(PLACES)]
    return Example("filler", tuple(tokens + ["."]), (), meta={})


GENERATORS = {
    "induction": induction,
    "ioi": ioi,
    "greater_than": greater_than,
    "brackets": brackets,
    "addition": addition,
    "facts": facts,
    "filler": filler,
}
DEFAULT_MIX = {
    "induction": 0.15,
    "ioi": 0.25,
    "greater_than": 0.12,
    "brackets": 0.1,
    "addition": 0.18,
    "facts": 0.05,
    "filler": 0.15,
}


def generate(task: str, n: int, seed: int = 0) -> list[Example]:
    """`n` examples of one task, reproducible from `seed`."""
    if task not in GENERATORS:
        raise OptionError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
    rng = random.Random(f"{task}-{seed}")
    return [GENERATORS[task](rng) for _ in range(n)]


def stream(seed: int = 0, mix: dict[str, float] | None = None) -> Iterator[Example]:
    """An endless, reproducible mixture of all tasks (the training corpus)."""
    mix = mix or DEFAULT_MIX
    rng = random.Random(seed)
    names, weights = zip(*mix.items())
    while True:
        yield GENERATORS[rng.choices(names, weights)[0]](rng)


def corpus(seed: int = 0) -> Iterator[tuple[str, ...]]:
    """`stream(seed)` as word tuples: the corpus "bundled" of `transcoders.train` (the entry point
    `transcoders.corpora` in pyproject.toml)."""
    return (ex.tokens for ex in stream(seed))


def ioi_pairs(n: int, seed: int = 0) -> list[Example]:
    """IOI examples with their ABC corruptions, for circuit discovery."""
    return generate("ioi", n, seed)


def greater_than_pairs(n: int, seed: int = 0) -> list[Example]:
    """Greater-than examples with their "01" counterfactuals, for circuit discovery."""
    return generate("greater_than", n, seed)
