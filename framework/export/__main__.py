"""CLI of the exporter: usage errors and unusable checkpoints exit 2 with one `error:` line (a checkpoint whose
config.yaml names code of its own among them, unless --trust-checkpoint-code)."""
from __future__ import annotations

import argparse
import os
import sys

import torch


def main(argv: list[str] | None = None) -> int:
    from framework.config.saved import TRUST_FLAG, TRUST_HELP
    parser = argparse.ArgumentParser(prog="python -m framework.export",
                                     description="Write a checkpoint's weights as Hugging Face safetensors.")
    parser.add_argument("checkpoint", help="a checkpoint step dir, e.g. <run>/checkpoints/step_00000100 or "
                                           "s3://bucket/run/step_00000100; a checkpoint dir: its newest complete one")
    parser.add_argument("out_dir", help="where model.safetensors and config.json go")
    parser.add_argument("--force", action="store_true", help="replace the files it writes in a non-empty out_dir")
    parser.add_argument("--merge", action="store_true",
                        help="a LoRA run: write the weights with the adapter merged in (default: base + adapter/)")
    parser.add_argument(TRUST_FLAG, dest="trust_code", action="store_true", help=TRUST_HELP)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from framework.export import ExportError, export, newest_step_dir
    from framework.redact import redacted
    try:
        step_dir = newest_step_dir(args.checkpoint)
        config = export(step_dir, args.out_dir, force=args.force, merge=args.merge, trust_code=args.trust_code)
    except ExportError as e:
        print(f"error: {redacted(str(e))}", file=sys.stderr)
        return 2
    except OSError as e:     # a bucket that is not there, an endpoint that does not answer
        print(f"error: {redacted(args.checkpoint)}: {redacted(str(e).splitlines()[0]) if str(e) else type(e).__name__}",
              file=sys.stderr)
        return 2
    adapter = os.path.isdir(os.path.join(args.out_dir, "adapter")) and not args.merge
    print(f"wrote {args.out_dir} from {step_dir}: {config['architectures'][0]} (model_type {config['model_type']}), "
          f"vocab {config['vocab_size']}{', with its LoRA adapter in adapter/ (PEFT)' if adapter else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
