"""Writes the rows of the tasks shipped with the package (framework/evaluation/shipped/): our own wording,
generated, deterministic; no sentence is copied from CPython's documentation.

  fw_pyfacts.jsonl  multiple choice: facts about Python's keywords, built-ins, methods and modules, each stem in
                    five frames, four choices (acc, acc_norm)
  fw_pytext.jsonl   rolling log-likelihood: short paragraphs about Python composed from templates, half of them
                    with a snippet of code (bits_per_byte, byte_perplexity, word_perplexity)

    python -m framework.evaluation.shipped.make_rows

The YAMLs beside the rows are written by hand; they read the rows through loader.py.
"""
from __future__ import annotations

import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = 59
TEXT_ROWS = 200

# (question stem, right answer, wrong answers): every answer is a short Python token or word, so that a byte
# model's log-likelihood of it after the stem is what ranks the choices.
FACTS = [
    ("The keyword that starts a function definition is", "def", ["func", "fn", "sub"]),
    ("The keyword that starts a class definition is", "class", ["struct", "type", "object"]),
    ("The keyword that leaves a loop early is", "break", ["exit", "stop", "leave"]),
    ("The keyword that skips to the next loop iteration is", "continue", ["next", "skip", "again"]),
    ("The keyword that hands a value back from a function is", "return", ["give", "yield_back", "output"]),
    ("The keyword that makes a function a generator is", "yield", ["produce", "emit", "generate"]),
    ("The keyword that brings a module into scope is", "import", ["include", "require", "use"]),
    ("The keyword that catches an exception is", "except", ["catch", "rescue", "handle"]),
    ("The keyword that raises an exception is", "raise", ["throw", "signal", "panic"]),
    ("The keyword that runs cleanup code whatever happens is", "finally", ["always", "ensure", "after"]),
    ("The keyword for an anonymous function is", "lambda", ["fun", "anon", "closure"]),
    ("The keyword that does nothing is", "pass", ["noop", "skip", "nothing"]),
    ("The built-in that returns the number of items in a container is", "len", ["size", "count", "length"]),
    ("The built-in that prints text to standard output is", "print", ["echo", "write", "puts"]),
    ("The built-in that reads a line from standard input is", "input", ["readline", "gets", "scan"]),
    ("The built-in that opens a file is", "open", ["fopen", "file", "load"]),
    ("The built-in that gives a sequence of integers is", "range", ["seq", "iota", "numbers"]),
    ("The built-in that pairs items of several iterables is", "zip", ["pair", "merge", "join"]),
    ("The built-in that numbers the items of an iterable is", "enumerate", ["number", "index", "indexed"]),
    ("The built-in that returns a sorted list is", "sorted", ["order", "arrange", "sortlist"]),
    ("The built-in that gives the type of an object is", "type", ["kind", "classof", "typeof"]),
    ("The built-in that tests whether an object is an instance of a class is", "isinstance", ["instanceof", "is_a", "typeis"]),
    ("The built-in that lists an object's attributes is", "dir", ["attrs", "list", "members"]),
    ("The built-in that returns the largest item is", "max", ["top", "largest", "biggest"]),
    ("The built-in that returns the smallest item is", "min", ["least", "smallest", "bottom"]),
    ("The built-in that adds up the items of an iterable is", "sum", ["add", "total", "plus"]),
    ("The built-in that returns the absolute value is", "abs", ["absolute", "magnitude", "positive"]),
    ("The built-in that converts a value to an integer is", "int", ["integer", "num", "toint"]),
    ("The built-in that converts a value to a string is", "str", ["string", "text", "tostr"]),
    ("The built-in that rounds a number is", "round", ["nearest", "trunc", "approx"]),
    ("The list method that adds one item at the end is", "append", ["push", "add", "insert_end"]),
    ("The list method that removes and returns the last item is", "pop", ["take", "drop", "shift"]),
    ("The list method that adds every item of an iterable is", "extend", ["concat", "merge", "addall"]),
    ("The dict method that returns a value or a default is", "get", ["fetch", "lookup", "find"]),
    ("The dict method that returns its key-value pairs is", "items", ["pairs", "entries", "tuples"]),
    ("The dict method that returns its keys is", "keys", ["names", "labels", "fields"]),
    ("The str method that splits a string into a list is", "split", ["cut", "explode", "tokens"]),
    ("The str method that joins strings with a separator is", "join", ["glue", "concat", "implode"]),
    ("The str method that removes surrounding whitespace is", "strip", ["trim", "chomp", "clean"]),
    ("The str method that returns an upper-case copy is", "upper", ["caps", "toupper", "big"]),
    ("The str method that replaces a substring is", "replace", ["swap", "sub", "change"]),
    ("The module for regular expressions is", "re", ["regex", "pattern", "rx"]),
    ("The module for operating system interfaces is", "os", ["system", "sysos", "platform_os"]),
    ("The module for mathematical functions is", "math", ["maths", "calc", "numeric"]),
    ("The module for random numbers is", "random", ["rand", "chance", "dice"]),
    ("The module for reading and writing JSON is", "json", ["jsonlib", "serial", "data"]),
    ("The module for dates and times is", "datetime", ["calendar_time", "clock", "dates"]),
    ("The module for command-line option parsing is", "argparse", ["options", "cmdline", "flags"]),
    ("The constant for a missing value is", "None", ["Null", "nil", "Nothing"]),
    ("The constant for truth is", "True", ["Yes", "On", "T"]),
]
# our own frames around a stem; the choice follows after one space (lm-eval's target_delimiter)
FRAMES = ["In Python, {stem}", "Python: {stem}", "{stem}", "In a Python program, {stem}", "Q: In Python, {stem}\nA:"]


def pyfacts(rng: random.Random) -> list[dict]:
    rows = []
    for stem, right, wrong in FACTS:
        for frame in FRAMES:
            choices = [right, *wrong]
            rng.shuffle(choices)
            rows.append({"question": frame.format(stem=stem[0].lower() + stem[1:] if frame[0] != "{" else stem),
                         "choices": choices, "answer": choices.index(right)})
    rng.shuffle(rows)
    return rows


SUBJECTS = ["A list", "A tuple", "A dictionary", "A set", "A string", "A generator", "A module", "A class",
            "A function", "An iterator", "A file object", "An exception"]
VERBS = ["holds", "returns", "stores", "yields", "keeps", "names"]
OBJECTS = ["a sequence of items", "the value of the key", "an object of its own type", "every element once",
           "the text it was given", "the next item on request", "the attributes it defines", "a new instance"]
TAILS = ["when the program runs.", "unless an error is raised.", "and the interpreter checks its type.",
         "as the documentation describes.", "for the caller to use.", "in the order it was given."]
CODE = ["for item in items:\n    print(item)\n", "def area(width, height):\n    return width * height\n",
        "with open(path) as f:\n    text = f.read()\n", "if x is None:\n    x = []\n",
        "class Point:\n    def __init__(self, x, y):\n        self.x, self.y = x, y\n",
        "try:\n    value = int(text)\nexcept ValueError:\n    value = 0\n"]


def pytext(rng: random.Random, n: int) -> list[dict]:
    rows = []
    for _ in range(n):
        sentences = [f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(TAILS)}"
                     for _ in range(rng.randint(2, 4))]
        text = " ".join(sentences)
        if rng.random() < 0.5:
            text += "\n\n" + rng.choice(CODE)
        rows.append({"text": text})
    return rows


def main() -> None:
    rng = random.Random(SEED)
    for name, rows in (("fw_pyfacts", pyfacts(rng)), ("fw_pytext", pytext(rng, TEXT_ROWS))):
        path = os.path.join(HERE, f"{name}.jsonl")
        with open(path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        print(f"{path}: {len(rows)} rows")


if __name__ == "__main__":
    main()
