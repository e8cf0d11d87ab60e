"""What parallel=auto picks for Llama 3 8B / 70B / 405B on 8, 64 and 512 H100s (bf16, sequences of
8192 tokens, 2 sequences per GPU per step), with the planner's memory and MFU: the table in docs/benchmarks/planner.md.

    python benchmarks/plan_auto_table.py
"""
from __future__ import annotations

from framework.plan.__main__ import plan_for

MODELS = ("llama3_8b", "llama3_70b", "llama3_405b")
GPUS = (8, 64, 512)


def main() -> None:
    print("| model | H100s | parallel=auto picks | memory / GPU | MFU |")
    print("| --- | ---: | --- | ---: | ---: |")
    for model in MODELS:
        for gpus in GPUS:
            overrides = ["parallel=auto", f"model={model}", "data=synthetic", "data.seq_len=8192",
                         "data.vocab_size=128256", "precision=bf16", f"trainer.global_batch_size={2 * gpus}",
                         "planner.device=h100", f"planner.nodes={max(1, gpus // 8)}", "planner.gpus_per_node=8"]
            try:
                plan, ranking = plan_for(overrides)
            except SystemExit:
                raise
            except Exception as e:      # ConfigError: nothing fits
                print(f"| {model} | {gpus} | nothing fits: {str(e).split(': ', 1)[-1]} | | |")
                continue
            picked = ranking.splitlines()[2].split(None, 1)[1].rsplit(None, 4)[0].strip()
            print(f"| {model} | {gpus} | `{picked}` | {plan.per_rank_bytes['total'] / 1024 ** 3:.1f} GiB "
                  f"| {plan.mfu:.0%} |", flush=True)


if __name__ == "__main__":
    main()
