"""The conversations tiny_chat.jsonl holds, made from templates with a fixed seed: short questions with one
right answer (sums, spellings backwards, greetings, colours, antonyms), a few with a system message or a second
turn, and some as prompt/completion pairs -- enough for a small model on a CPU to learn the format in a minute
(recipes sft_tiny and lora_tiny). `python -m framework.data.assets.tiny_chat` writes the file again; a test
holds the shipped one to this."""
from __future__ import annotations

import random

from framework.data.assets import jsonl_text, write

FILE = "tiny_chat.jsonl"
SEED = 42
NAMES = ["Ana", "Ben", "Cleo", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun"]
WORDS = ["cat", "dog", "sun", "tree", "book", "milk", "star", "fish", "rain", "bird", "lamp", "door"]
COLOURS = {"grass": "green", "the sky": "blue", "snow": "white", "coal": "black", "a banana": "yellow",
           "a tomato": "red", "an orange": "orange", "a plum": "purple"}
OPPOSITES = {"hot": "cold", "big": "small", "up": "down", "fast": "slow", "old": "new", "day": "night",
             "open": "closed", "happy": "sad", "light": "dark", "full": "empty"}
SYSTEM = "You are a helpful assistant. Answer in one short sentence."


def _turn(rng: random.Random) -> tuple[str, str]:
    kind = rng.randrange(5)
    if kind == 0:
        a, b = rng.randrange(10), rng.randrange(10)
        return f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}."
    if kind == 1:
        word = rng.choice(WORDS)
        return f"Spell {word} backwards.", f"{word} backwards is {word[::-1]}."
    if kind == 2:
        name = rng.choice(NAMES)
        return f"Say hello to {name}.", f"Hello, {name}!"
    if kind == 3:
        thing = rng.choice(sorted(COLOURS))
        return f"What color is {thing}?", f"{thing[0].upper() + thing[1:]} is {COLOURS[thing]}."
    word = rng.choice(sorted(OPPOSITES))
    return f"What is the opposite of {word}?", f"The opposite of {word} is {OPPOSITES[word]}."


def conversations(count: int = 400) -> list[dict]:
    rng = random.Random(SEED)
    out = []
    for i in range(count):
        question, reply = _turn(rng)
        if i % 10 == 9:
            out.append({"prompt": question, "completion": reply})
            continue
        messages = [{"role": "system", "content": SYSTEM}] if i % 4 == 0 else []
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": reply}]
        if i % 7 == 0:
            messages += [{"role": "user", "content": "Thanks!"}, {"role": "assistant", "content": "You are welcome."}]
        out.append({"messages": messages})
    return out


def text() -> str:
    return jsonl_text(conversations())


if __name__ == "__main__":
    write(FILE, text())
