"""`data=preference`: chosen/rejected pairs in TRL's preference format (`prompt`, `chosen`, `rejected`: plain
strings or conversations; framework/data/pairs.py) from JSONL or Parquet files or through Hugging Face datasets,
read as data=chat reads its inputs, prepared at launch into examples two by two (chosen, then rejected) with the
completion trained; framework/data/examples.py `Pairs` makes them rows."""
from __future__ import annotations

from framework.data.sources.chat import Chat


class Preference(Chat):
    name = "preference"
    pairs = True
