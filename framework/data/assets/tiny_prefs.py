"""The preference pairs tiny_prefs.jsonl holds, made from templates with a fixed seed: the short questions of
tiny_chat.py (sums, spellings backwards, antonyms) as conversations, chosen the right answer, rejected a wrong one
in the same words (a sum off by one or two, the word not reversed, another word's opposite) -- enough for a small
model on a CPU to prefer the right answers within a minute (recipe dpo_tiny). `python -m
framework.data.assets.tiny_prefs` writes the file again; a test holds the shipped one to this."""
from __future__ import annotations

import random

from framework.data.assets import jsonl_text, write
from framework.data.assets.tiny_chat import OPPOSITES, WORDS

FILE = "tiny_prefs.jsonl"
SEED = 42


def _pair(rng: random.Random) -> tuple[str, str, str]:
    kind = rng.randrange(3)
    if kind == 0:
        a, b = rng.randrange(10), rng.randrange(10)
        wrong = a + b + rng.choice([-2, -1, 1, 2])
        return f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}.", f"{a} plus {b} is {wrong}."
    if kind == 1:
        word = rng.choice(WORDS)
        return f"Spell {word} backwards.", f"{word} backwards is {word[::-1]}.", f"{word} backwards is {word}."
    word = rng.choice(sorted(OPPOSITES))
    other = rng.choice(sorted(v for v in OPPOSITES.values() if v != OPPOSITES[word]))
    return (f"What is the opposite of {word}?", f"The opposite of {word} is {OPPOSITES[word]}.",
            f"The opposite of {word} is {other}.")


def pairs(count: int = 256) -> list[dict]:
    rng = random.Random(SEED)
    out = []
    for _ in range(count):
        question, good, bad = _pair(rng)
        out.append({"prompt": [{"role": "user", "content": question}],
                    "chosen": [{"role": "assistant", "content": good}],
                    "rejected": [{"role": "assistant", "content": bad}]})
    return out


def text() -> str:
    return jsonl_text(pairs())


if __name__ == "__main__":
    write(FILE, text())
