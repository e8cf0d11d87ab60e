"""The rules of what a run reports (config/validate.py runs them in its order): the profiler's steps, text
samples that can start, trackers that exist and can reach their servers."""
from __future__ import annotations

import importlib.util

from framework.data import tokenizer
from framework.errors import ConfigError, require_positive
from framework.metrics.trackers import TRACKERS, tracker_class
from framework.metrics.trackers.mlflow_tracker import tracking_uri


def validate_profile(cfg) -> None:
    steps = list(cfg.trainer.profile.steps or [])
    if steps and (len(steps) != 2 or not 1 <= steps[0] <= steps[1]):
        raise ConfigError("trainer.profile.steps", f"give [first, last] with 1 <= first <= last, got {steps}")


def validate_sampling(cfg) -> None:
    t = cfg.trainer
    if t.sample_every < 0 or t.sample_tokens <= 0:
        raise ConfigError("trainer.sample_every" if t.sample_every < 0 else "trainer.sample_tokens",
                          f"must be {'non-negative' if t.sample_every < 0 else 'positive'}")
    if not t.sample_every:
        return
    tok = tokenizer.of_data(cfg.data)
    if tok is None:
        raise ConfigError("trainer.sample_every", f"needs the data's tokenizer; data.source={cfg.data.source} names "
                                                  f"none: set data.tokenizer=/path/to/tokenizer.json")
    from framework.metrics.samples import start_tokens
    start, vocab = start_tokens(tok, t.sample_prompt), cfg.data.vocab_size
    outside = [i for i in start if i >= vocab]
    if start and not outside:
        return
    empty = "is empty" if not t.sample_prompt else f"{t.sample_prompt!r} encodes to no token"
    if tok.encode(t.sample_prompt, add_special_tokens=False).ids:
        why = f"{t.sample_prompt!r} encodes to token {outside[0]}, which the data never holds"
    elif start:
        why = (f"{empty}, so a sample would start from the tokenizer's "
               f"{'BOS' if tokenizer.bos_ids(tok) else 'end-of-text'} token ({outside[0]}), which the data never holds")
    else:
        why = f"{empty}, and the data's tokenizer has no BOS or end-of-text token to start a sample from"
    raise ConfigError("trainer.sample_prompt", f"{why} (data.source={cfg.data.source}, data.vocab_size={vocab}); "
                                               f"give the samples a start, e.g. trainer.sample_prompt='The '")


def validate_logging(cfg) -> None:
    require_positive(cfg, "logging.tracker_timeout_s")
    names = list(cfg.logging.trackers)
    for name in names:
        if name not in TRACKERS:
            raise ConfigError("logging.trackers", f"{name!r} is not a tracker; use any of {', '.join(TRACKERS)} "
                                                  f"(metrics.jsonl is always written)")
        if importlib.util.find_spec(tracker_class(name).package) is None:
            raise ConfigError("logging.trackers", f"{name} needs its client library: pip install 'framework[{name}]'")
    if len(set(names)) != len(names):
        raise ConfigError("logging.trackers", f"names a tracker twice: {names}")
    if "mlflow" in names and not tracking_uri(cfg):
        raise ConfigError("logging.mlflow_tracking_uri", "logging.trackers has mlflow but no tracking server is "
                                                         "given; set logging.mlflow_tracking_uri=http://HOST:PORT "
                                                         "or MLFLOW_TRACKING_URI")
