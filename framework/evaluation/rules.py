"""The rules of eval.* (config/validate.py runs them in its order): the tasks exist, their data can be read, each
scores log-likelihoods, and the model can be fed their text. Checked in the launching process, which then holds
the offline setting its workers inherit."""
from __future__ import annotations

from framework.data import tokenizer
from framework.errors import ConfigError
from framework.evaluation.tasks import TaskError, generative, load_tasks


def every_of(cfg) -> int:
    """Steps between in-loop evaluations of eval.tasks (0: none): eval.every, else trainer.eval_every."""
    return cfg.trainer.eval_every if cfg.eval.every is None else cfg.eval.every


def validate_eval(cfg) -> None:
    e = cfg.eval
    for key in ("limit", "every"):
        value = getattr(e, key)
        if value is not None and value < 1:
            raise ConfigError(f"eval.{key}", f"must be at least 1 (null: "
                                             f"{'every document' if key == 'limit' else 'trainer.eval_every'}), "
                                             f"got {value}")
    if not e.tasks:
        return
    if not every_of(cfg):
        raise ConfigError("eval.tasks", "are never evaluated: eval.every is null and trainer.eval_every=0; set "
                                        "eval.every=N (or trainer.eval_every)")
    if tokenizer.of_data(cfg.data) is None:
        raise ConfigError("eval.tasks", f"need the data's tokenizer to encode the tasks' text; data.source="
                                        f"{cfg.data.source} names none: set data.tokenizer=/path/to/tokenizer.json")
    if e.apply_chat_template and not tokenizer.chat_config_of_data(cfg.data):
        raise ConfigError("eval.apply_chat_template", "the data records no chat template (the job does not train "
                                                      "on chat data); leave it false")
    try:
        _, loaded = load_tasks(list(e.tasks), list(e.include_path))
    except TaskError as err:
        raise ConfigError(f"eval.{err.argument}", str(err)) from None
    if gen := generative(loaded):
        raise ConfigError("eval.tasks", f"{gen[0]} generates text, which is not evaluated in the loop (only "
                                        f"log-likelihood tasks: multiple choice, loglikelihood, "
                                        f"loglikelihood_rolling); leave it out")
