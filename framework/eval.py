"""`python -m framework.eval CHECKPOINT --tasks T1,T2`: benchmark scores of a model through lm-evaluation-harness.

    python -m framework.eval outputs/run/checkpoints --tasks fw_pyfacts,fw_pytext --limit 50

CHECKPOINT is a checkpoint step dir, a run's checkpoint dir (its newest complete step), a URL of either
(s3://...), or a `python -m framework.export` dir; its model and tokenizer are read as framework.generate reads
them (the config as data, the signature and files checked; a LoRA run with its adapter). The tasks are lm-eval
task names: the ones shipped with the package (fw_pyfacts, fw_pytext), those of each --include-path folder (lm-eval
task YAMLs, e.g. `dataset_path: json` with local `data_files`), else lm-eval's own. Where every task is local,
nothing reaches the network. Prints a table (task, metric, value, stderr) and writes it as JSON (--out).
Unusable input exits 2 with one `error:` line naming the argument.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from framework.exit_codes import USAGE


def _tasks(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give at least one task name, e.g. --tasks fw_pyfacts,fw_pytext")
    return names


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        """A usage mistake as every refusal of this command: one line naming the argument."""
        print(f"error: {message}", file=sys.stderr)
        sys.exit(USAGE)


def parser() -> argparse.ArgumentParser:
    from framework.config.saved import TRUST_FLAG, TRUST_HELP
    p = _Parser(prog="python -m framework.eval",
                                description="Benchmark scores of a checkpoint through lm-evaluation-harness.")
    p.add_argument("checkpoint", help="a checkpoint step dir, a run's checkpoint dir (its newest complete step), a "
                                      "URL of either (s3://...), or a `python -m framework.export` dir")
    p.add_argument("--tasks", type=_tasks, required=True, help="comma-separated lm-eval task names")
    p.add_argument("--limit", type=_positive, default=None, help="the first N documents of each task (default: all)")
    p.add_argument("--include-path", action="append", default=[], metavar="DIR",
                   help="a folder of lm-eval task YAMLs (repeatable); the shipped tasks are always included")
    p.add_argument("--batch-size", type=_positive, default=16, help="requests per forward")
    p.add_argument("--max-length", type=_positive, default=None,
                   help="tokens a request is cut to (default: the checkpoint's data.seq_len; an export: the model's "
                        "context length)")
    p.add_argument("--apply-chat-template", action="store_true",
                   help="render each prompt with the chat template the model was trained with")
    p.add_argument("--out", default=None, help="write the scores here as JSON")
    p.add_argument(TRUST_FLAG, dest="trust_code", action="store_true", help=TRUST_HELP)
    return p


def _max_length(step_dir: str, model, trust_code: bool) -> int:
    from framework import storage
    from framework.checkpoint.names import META
    if storage.isfile(storage.join(step_dir, META)):
        from framework.config.saved import read_saved_config
        return int(read_saved_config(step_dir, trust_code).data.seq_len)
    return int(model.context_length)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from framework.data.tokenizer import TokenizerError, chat_config_in
    from framework.evaluation.tasks import TaskError, generative, load_tasks
    from framework.export import newest_step_dir
    from framework.export.load import LoadError, load
    from framework.redact import redacted

    def refuse(argument: str, message: str) -> int:
        print(f"error: {argument}: {redacted(message)}", file=sys.stderr)
        return USAGE

    try:     # the tasks first: the offline variables are set before anything imports `datasets`
        manager, loaded = load_tasks(args.tasks, args.include_path)
    except TaskError as e:
        return refuse(f"--{e.argument.replace('_', '-')}", str(e))
    if gen := generative(loaded):
        return refuse("--tasks", f"{gen[0]} generates text; framework.eval scores log-likelihood tasks "
                                 f"(multiple choice, loglikelihood, loglikelihood_rolling) only")
    try:
        step_dir = newest_step_dir(args.checkpoint)
        model, tok = load(step_dir, args.trust_code)
        chat = chat_config_in(step_dir) if args.apply_chat_template else {}
        max_length = args.max_length or _max_length(step_dir, model, args.trust_code)
    except (LoadError, TokenizerError) as e:
        return refuse("checkpoint", str(e))
    except OSError as e:     # a bucket that is not there, an endpoint that does not answer
        return refuse("checkpoint", f"{args.checkpoint}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    if args.apply_chat_template and not chat:
        return refuse("--apply-chat-template", f"{step_dir} records no chat template (the model was not trained on "
                                               f"chat data)")
    from framework.evaluation import scores
    from framework.evaluation.harness import FrameworkLM, forward_scorer, prefix_for
    vocab = model(torch.zeros(1, 1, dtype=torch.long)).shape[-1]
    lm = FrameworkLM(forward_scorer(model), tok, max_length, prefix_for(tok, vocab), args.batch_size, chat=chat)
    results = scores.evaluate(lm, args.tasks, manager, args.limit, args.apply_chat_template)
    rows = scores.table(results)
    print(scores.printed(rows))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"checkpoint": step_dir, "limit": args.limit, "max_length": max_length, "scores": rows}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
