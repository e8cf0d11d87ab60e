"""The data's rules (config/validate.py runs them in its order): sizes and splits, the source's own check, and,
last, the data's contents (token range, examples, splits long enough)."""
from __future__ import annotations

import math

from framework.data.sources import DataError, check_token_range, source_of, streams
from framework.errors import ConfigError, require_positive


def document_mask(data_cfg) -> bool:
    """data.document_mask as it applies: one example a row (data.packing=false) has no other document to keep it
    from, and causal attention keeps its padding out of view, so no document numbers are built (data/rows.py
    padded); admission writes this into the resolved config so that it says so."""
    return bool(data_cfg.document_mask) and bool(data_cfg.packing)


def validate_data_files(cfg, explicit: set[str] = frozenset()) -> None:
    data = cfg.data
    require_positive(cfg, "data.seq_len", "data.vocab_size")
    if not 0 <= data.val_fraction < 1:
        raise ConfigError("data.val_fraction", f"must be in [0, 1), got {data.val_fraction}")
    source = source_of(data)
    source.check(data)
    if not data.packing and source.mixture:
        raise ConfigError("data.packing", f"data.source={data.source} deals rows of data.seq_len out of several "
                                          f"sources; one example a row (data.packing=false) is not built for a "
                                          f"mixture: set data.packing=true, or train one dataset (data=tokens)")
    if not data.packing and "data.overlong" in explicit:
        raise ConfigError("data.overlong", "splits or cuts examples in packed rows; with data.packing=false an "
                                           "example longer than a row is truncated to data.seq_len + 1 tokens "
                                           "(TRL's max_length): leave data.overlong unset")


def _long_enough(n_tokens: int, seq_len: int, val_fraction: float, evaluates: bool) -> bool:
    val = int(n_tokens * val_fraction)
    return n_tokens - val >= seq_len + 1 and (not evaluates or val >= seq_len + 1)


def _shortest_corpus(seq_len: int, val_fraction: float, evaluates: bool) -> int:
    n = seq_len + 1
    if evaluates:
        n = max(n, math.ceil((seq_len + 1) / val_fraction))
    while not _long_enough(n, seq_len, val_fraction, evaluates):
        n += 1
    return n


def validate_data_contents(cfg) -> None:
    """Opens the data (memmaps; a prepared dataset's token range comes from its manifest, the others'
    are scanned): the last check, after the cheap ones passed."""
    data = cfg.data
    mixture = source_of(data).mixture
    try:
        found = streams(data)
        for stream in found:
            if stream.manifest is None:
                check_token_range(stream.tokens, data.vocab_size, stream.name)
            elif stream.manifest["vocab_size"] > data.vocab_size:
                raise DataError(f"data.vocab_size: {stream.name} was tokenized with a vocabulary of "
                                f"{stream.manifest['vocab_size']}, but data.vocab_size is {data.vocab_size}")
    except DataError as e:
        key, _, msg = str(e).partition(": ")
        raise ConfigError(key, msg) from None
    for stream in found:
        if not data.packing and stream.mask is None:
            raise ConfigError("data.packing", f"data.source={data.source} ({stream.name}) is a token stream, not "
                                              f"examples (instruction data with a loss mask, as data=chat prepares "
                                              f"it): one example a row means nothing there; set data.packing=true")
        if data.document_mask and stream.starts is None:
            raise ConfigError("data.document_mask", f"data.source={data.source} ({stream.name}) records no document "
                                                    f"boundaries (a dataset dir from `python -m framework.data."
                                                    f"prepare` does); set data.document_mask=false")
        if stream.mask is not None:
            _enough_examples(cfg, stream, mixture)
    # With no validation fraction at all, the trainer.eval_every rule below says what to change.
    evaluates = bool(cfg.trainer.eval_every) and data.val_fraction > 0
    for stream in (s for s in found if s.mask is None):
        n = len(stream.tokens)
        if not mixture and data.path and not _long_enough(n, data.seq_len, data.val_fraction, evaluates):
            split = f" plus a validation split (data.val_fraction={data.val_fraction}) of as many" if evaluates else ""
            raise ConfigError("data.path", f"{data.path} is empty" if not n else
                              f"{data.path} is too short: it holds {n} tokens, one training sequence needs "
                              f"{data.seq_len + 1}{split}, so at least "
                              f"{_shortest_corpus(data.seq_len, data.val_fraction, evaluates)} tokens")
        where = f" in {stream.name}" if mixture else ""
        n_val = int(n * data.val_fraction)
        if n - n_val < data.seq_len + 1:
            raise ConfigError("data.seq_len", f"the training split{where} holds {n - n_val} tokens, "
                                              f"fewer than one sequence of {data.seq_len + 1}")
        if cfg.trainer.eval_every and n_val < data.seq_len + 1:
            raise ConfigError("trainer.eval_every", f"evaluation needs a validation split{where} of at least one "
                                                    f"sequence; raise data.val_fraction or set trainer.eval_every=0")


def _enough_examples(cfg, stream, mixture: bool) -> None:
    """Instruction data is packed whole, or one example a row: its training split needs an example (one a row:
    one that data.seq_len leaves a trained target), its validation split one more where evaluation runs."""
    from framework.data.batches import layout_of, split_stream
    train, val = split_stream(stream, cfg.data.val_fraction)
    where = f" in {stream.name}" if mixture else ""
    if len(train.starts) < 2:
        raise ConfigError("data.path", f"the training split{where} holds no example")
    if not cfg.data.packing and not len(layout_of(train, cfg.data)):
        raise ConfigError("data.seq_len", f"every example of the training split{where} is cut to data.seq_len + 1 = "
                                          f"{cfg.data.seq_len + 1} tokens with no trained target left; raise it")
    if cfg.trainer.eval_every and len(val.starts) < 2:
        raise ConfigError("trainer.eval_every", f"evaluation needs a validation split{where} of at least one "
                                                f"example; raise data.val_fraction or set trainer.eval_every=0")
