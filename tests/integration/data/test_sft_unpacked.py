"""data.packing=false: chat data one conversation a row, held to TRL's SFTTrainer with packing off.

- the rows: each conversation's first seq_len + 1 tokens and trained targets are what TRL's own dataset
  preparation makes of the same tokenized conversations (truncated to max_length = seq_len + 1, those left with
  no trained token dropped), and a micro-batch is padded to its longest row;
- the loss: per-step losses and gradient norms of a transformers Llama (model=hf) equal TRL's SFTTrainer's on the
  same batches in the same order (gradient accumulation of two micro-batches of unequal widths), to 1e-5;
- the counts: what data.seq_len cut (examples truncated, dropped, tokens cut) is the data's own, counted here from
  the conversations' token lengths, and a run reports it in its first metrics record and its summary;
- layouts: ddp x2 (compiled) trains the single-process run's losses, and a resume from its step-2 checkpoint
  under ddp replays steps 3-4 exactly;
- where it means nothing (a token stream) or cannot work (a pipeline: stages of one width), it is refused in one
  line.
"""
import json
import math
import shutil

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from framework.data.batches import build_samplers, micro_batches
from framework.data.examples import COUNTS, OneExampleARow, cut_counts
from framework.data.prepare import ChatOptions, prepare
from framework.data.token_dataset import open_mask, open_starts, open_tokens
from framework.models.loss import IGNORE_INDEX, cross_entropy, global_batch
from tests.harness.helpers import check_ok, read_metrics, run_framework

transformers = pytest.importorskip("transformers")

SEQ_LEN = 96
STEPS = 4
COMMON = ["data=chat", "data.tokenizer=bytes", "data.chat_template=chatml", "data.packing=false",
          f"data.seq_len={SEQ_LEN}", "data.val_fraction=0", "trainer.eval_every=0", f"trainer.max_steps={STEPS}",
          "trainer.global_batch_size=4", "trainer.micro_batch_size=2", "trainer.log_every=1",
          "trainer.progress_bar=false", "logging.trackers=[]", "optimizer.lr=1e-3", "optimizer.weight_decay=0",
          "scheduler=constant", "scheduler.warmup_steps=0", "trainer.grad_clip=1.0"]


def conversations() -> list[dict]:
    """Short chats, some longer than a row (their answers cut), and two whose prompt alone fills a row (their
    answers cut off entirely: dropped)."""
    out = []
    for i in range(40):
        question, answer = f"What is {i} plus {i % 7}?", f"{i} plus {i % 7} is {i + i % 7}."
        if i % 5 == 1:
            answer = " ".join([answer] * 8)                 # longer than a row: truncated, still trained
        if i in (13, 27):
            question = "Please read this. " * 8 + question  # the prompt fills a row: nothing left to train
        out.append({"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]})
    return out


@pytest.fixture(scope="module")
def chats(tmp_path_factory):
    folder = tmp_path_factory.mktemp("chats")
    path = folder / "chats.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in conversations()))
    return path


@pytest.fixture(scope="module")
def prepared(chats, tmp_path_factory):
    """(tokens, mask, document starts) of the conversations as data=chat prepares them (bytes, ChatML)."""
    out = tmp_path_factory.mktemp("prepared") / "chats"
    prepare([str(chats)], "bytes", str(out), workers=1, chat=ChatOptions("chatml"))
    return np.asarray(open_tokens(str(out))), np.asarray(open_mask(str(out))), np.asarray(open_starts(str(out)))


def _trl_prepared(examples: list[tuple[np.ndarray, np.ndarray]], max_length: int) -> list[tuple[list, list]]:
    """TRL's SFTTrainer's own preparation of tokenized examples (input_ids, labels: -100 where not trained):
    truncation to max_length and the dropping of examples left with no label."""
    import datasets
    from trl import SFTConfig, SFTTrainer
    dataset = datasets.Dataset.from_dict({
        "input_ids": [ids.astype(np.int64).tolist() for ids, _ in examples],
        "labels": [np.where(mask != 0, ids.astype(np.int64), IGNORE_INDEX).tolist() for ids, mask in examples]})
    trainer = SFTTrainer.__new__(SFTTrainer)          # only its dataset preparation, on the class as TRL ships it
    trainer.completion_only_loss = False
    args = SFTConfig(output_dir="unused", max_length=max_length, report_to=[], use_cpu=True)
    done = trainer._prepare_dataset(dataset, None, args, packing=False, formatting_func=None, dataset_name="train")
    return [(row["input_ids"], row["labels"]) for row in done]


def test_rows_are_trls_truncated_and_filtered_examples(prepared):
    tokens, mask, starts = prepared
    examples = [(tokens[a:b], mask[a:b]) for a, b in zip(starts[:-1], starts[1:])]
    theirs = _trl_prepared(examples, SEQ_LEN + 1)
    layout = OneExampleARow(tokens, mask, starts, SEQ_LEN)
    rows = layout.rows(np.arange(len(layout)))
    ours = []
    for r, n in enumerate(rows.lengths.tolist()):
        ids = rows.tokens[r, :n]
        ours.append((ids.tolist(), torch.where(rows.trained[r, :n], ids, IGNORE_INDEX).tolist()))
    assert len(theirs) == len(examples) - 2 and ours == theirs
    assert int(rows.lengths.max()) == SEQ_LEN + 1 and rows.tokens.shape[1] == SEQ_LEN + 1


def test_a_micro_batch_is_as_wide_as_its_longest_row(prepared):
    tokens, mask, starts = prepared
    layout = OneExampleARow(tokens, mask, starts, SEQ_LEN)
    ids = np.array([0, 1, 2, 3])              # short conversations, then a long one
    lengths = layout.length[ids]
    batches = micro_batches(layout.rows(ids), 2)
    assert [b[0].shape[1] for b in batches] == [max(lengths[:2]) - 1, max(lengths[2:]) - 1]
    for (inputs, targets), part in zip(batches, (lengths[:2], lengths[2:])):    # no document numbers: causal
        for r, n in enumerate(part):      # attention keeps the padding after a row's end out of its view
            assert (targets[r, n - 1:] == IGNORE_INDEX).all() and (inputs[r, n:] == 0).all()


def test_the_loss_over_micro_batches_of_unequal_widths_is_the_mean_over_the_global_batch(prepared):
    """What transformers' Trainer computes with num_items_in_batch (TRL's default): the sum of every trained
    target's loss over the step's micro-batches, divided by their count; here against one forward of the whole
    batch, padded to its longest, in transformers' own loss."""
    tokens, mask, starts = prepared
    layout = OneExampleARow(tokens, mask, starts, SEQ_LEN)
    ids = np.array([5, 0, 6, 2, 11, 3])           # widths differ between micro-batches
    rows = layout.rows(ids)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=320, max_position_embeddings=256)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    labels = torch.where(rows.trained, rows.tokens, IGNORE_INDEX)
    with torch.no_grad():
        whole = model(input_ids=rows.tokens, labels=labels,
                      attention_mask=(torch.arange(rows.tokens.shape[1])[None] < rows.lengths[:, None]).long()).loss
        trained = layout.trained(ids)
        for size in (1, 2, 3):
            with global_batch(trained, len(ids), None):
                shares = [cross_entropy(model(input_ids=x).logits, y) for x, y in micro_batches(rows, size)]
            assert abs(float(torch.stack(shares).mean()) - float(whole)) <= 1e-5 * float(whole)


def test_the_counts_are_the_datas_own(prepared):
    tokens, mask, starts = prepared
    lengths = np.diff(starts)
    width = SEQ_LEN + 1
    longer = [i for i, n in enumerate(lengths) if n > width]
    empty = [i for i in longer if not mask[starts[i] + 1:starts[i] + width].any()]
    assert len(longer) == 8 + 2 and len(empty) == 2             # conversations() made them so
    unpacked = cut_counts(starts, mask, SEQ_LEN, packing=False, overlong="split")
    assert unpacked == dict(zip(COUNTS, (40, 0, len(longer), len(empty), int(sum(lengths[longer] - width)))))
    split = cut_counts(starts, mask, SEQ_LEN, packing=True, overlong="split")
    assert split == dict(zip(COUNTS, (40, len(longer), 0, 0, 0)))
    cut = cut_counts(starts, mask, SEQ_LEN, packing=True, overlong="truncate")
    assert cut == dict(zip(COUNTS, (40, 0, len(longer), 0, int(sum(lengths[longer] - width)))))


@pytest.fixture(scope="module")
def hf_llama(tmp_path_factory):
    """A transformers Llama saved as a pretrained dir: both trainers start from its weights."""
    folder = tmp_path_factory.mktemp("hf_llama")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=320, max_position_embeddings=256)
    transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def runs(chats, hf_llama, tmp_path_factory):
    """One process (checkpoint at step 2), ddp x2, and ddp resuming the first from its step 2."""
    root = tmp_path_factory.mktemp("unpacked")
    args = [*COMMON, "model=hf", f"model.pretrained={hf_llama}", f"data.path={chats}",
            f"data.cache_dir={root / 'cache'}"]
    single = root / "single"
    proc = run_framework([*args, "parallel=single", "checkpoint.enabled=true", "checkpoint.interval=2"], single)
    check_ok(proc)
    ddp = root / "ddp"      # compiled too: blocks that meet a new width every micro-batch (aot_eager: traced only)
    check_ok(run_framework([*args, "parallel=ddp", "launcher.nproc_per_node=2", "checkpoint.enabled=false",
                            "trainer.compile=true", "trainer.compile_backend=aot_eager"], ddp))
    resumed = root / "resumed"
    check_ok(run_framework([*args, "parallel=ddp", "launcher.nproc_per_node=2", "checkpoint.enabled=false",
                            f"checkpoint.resume={single / 'checkpoints' / 'step_00000002'}"], resumed))
    return single, ddp, resumed, proc.stdout


def _trl_losses(run_dir, hf_llama, tmp_path) -> list[dict]:
    """TRL's SFTTrainer on the conversations the run took, in its order, one step at a time."""
    import datasets
    from trl import SFTConfig, SFTTrainer
    cfg = OmegaConf.load(run_dir / "config.yaml")
    sampler, _ = build_samplers(cfg.data, cfg.trainer.global_batch_size, cfg.seed, with_val=False)
    tokens, mask = np.asarray(open_tokens(cfg.data.prepared)), np.asarray(open_mask(cfg.data.prepared))
    starts = np.asarray(open_starts(cfg.data.prepared))
    order = [int(np.searchsorted(starts, sampler.layout.start[i]))
             for k in range(STEPS) for i in sampler.sequence_ids(k)]
    examples = [(tokens[starts[i]:starts[i + 1]], mask[starts[i]:starts[i + 1]]) for i in order]
    assert any(len(ids) > SEQ_LEN + 1 for ids, _ in examples), "the steps take a conversation TRL must truncate"
    dataset = datasets.Dataset.from_dict({
        "input_ids": [ids.astype(np.int64).tolist() for ids, _ in examples],
        "labels": [np.where(m != 0, ids.astype(np.int64), IGNORE_INDEX).tolist() for ids, m in examples]})
    tokenizer = transformers.AutoTokenizer.from_pretrained(cfg.data.prepared)
    args = SFTConfig(output_dir=str(tmp_path / "trl"), max_length=SEQ_LEN + 1, per_device_train_batch_size=2,
                     gradient_accumulation_steps=2, max_steps=STEPS, learning_rate=1e-3, lr_scheduler_type="constant",
                     warmup_steps=0, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.95, adam_epsilon=1e-8,
                     max_grad_norm=1.0, optim="adamw_torch", logging_steps=1, report_to=[], use_cpu=True,
                     save_strategy="no", train_sampling_strategy="sequential", dataloader_drop_last=True,
                     bf16=False, fp16=False, seed=0, pad_token=tokenizer.eos_token)
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_llama, dtype=torch.float32)
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    trainer.train()
    return [r for r in trainer.state.log_history if "loss" in r and "grad_norm" in r]


def test_per_step_losses_and_gradient_norms_are_trls(runs, hf_llama, tmp_path):
    single = runs[0]
    ours = read_metrics(single)
    theirs = _trl_losses(single, hf_llama, tmp_path)
    assert [r["step"] for r in ours] == list(range(1, STEPS + 1)) and len(theirs) == STEPS
    for a, b in zip(ours, theirs):
        assert math.isclose(a["loss"], b["loss"], rel_tol=1e-5), (a["step"], a["loss"], b["loss"])
        assert math.isclose(a["grad_norm"], b["grad_norm"], rel_tol=1e-5), (a["step"], a["grad_norm"], b["grad_norm"])
    assert ours[-1]["loss"] < ours[0]["loss"]


def test_ddp_trains_the_single_process_losses_and_resumes_exactly(runs):
    """ddp x2 compiled, and a ddp run resuming the single-process run's step 2: its losses."""
    single, ddp, resumed, _ = runs
    assert OmegaConf.load(single / "config.yaml").data.document_mask is False    # one a row: nothing to mask
    reference = [r["loss"] for r in read_metrics(single)]
    assert max(abs(a - b) for a, b in zip(reference, [r["loss"] for r in read_metrics(ddp)])) <= 1e-5
    replayed = [r for r in read_metrics(resumed)]
    assert [r["step"] for r in replayed] == [3, 4]
    assert max(abs(a - b["loss"]) for a, b in zip(reference[2:], replayed)) <= 1e-5


def test_the_cut_is_reported_once_in_the_first_record_and_the_summary(runs, prepared):
    single, _, resumed, printed = runs
    tokens, mask, starts = prepared
    counts = cut_counts(starts, mask, SEQ_LEN, packing=False, overlong="split")
    records = read_metrics(single)
    assert {k: records[0][k] for k in COUNTS} == counts and not any(k in r for r in records[1:] for k in COUNTS)
    assert {k: read_metrics(resumed)[0][k] for k in COUNTS} == counts      # a resumed run reports it again, once
    examples, _, truncated, dropped, cut = (counts[k] for k in COUNTS)
    assert f"  data        {examples} examples, {truncated} longer than a row of {SEQ_LEN + 1} tokens (data.seq_len " \
           f"+ 1): truncated ({cut:,} tokens cut); {dropped} of them dropped with no trained token left" in \
           printed.splitlines()


CHAT = ["data=chat", "data.tokenizer=bytes", "data.chat_template=chatml", "data.packing=false", "data.seq_len=96"]


@pytest.mark.parametrize("args,line", [
    (["data.packing=false"], "error: data.packing: data.source=pydoc (pydoc) is a token stream, not examples"),
    ([*CHAT, "parallel=3d", "parallel.pp=2", "parallel.tp=1", "parallel.dp_shard=1", "launcher.nproc_per_node=2"],
     "error: parallel.pp: needs rows of one width"),
    ([*CHAT, "data.overlong=split"], "error: data.overlong: splits or cuts examples in packed rows"),
], ids=["token-stream", "pipeline", "overlong"])
def test_packing_false_where_it_means_nothing_or_cannot_work_is_refused_in_one_line(tmp_path, chats, args, line):
    shutil.copy(chats, tmp_path / "chats.jsonl")
    data = [f"data.path={tmp_path / 'chats.jsonl'}", f"data.cache_dir={tmp_path / 'cache'}"] \
        if "data=chat" in args else []
    proc = run_framework(["model=tiny", "trainer.max_steps=1", *args, *data], tmp_path / "run", timeout=120)
    # chat data is prepared at launch, before the rules that read the whole config (its one line may come first)
    *before, last = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and last.startswith(line), proc.stderr[-2000:]
    assert all(x.startswith("prepared ") for x in before) and len(before) <= 1, proc.stderr[-2000:]
    assert not (tmp_path / "run").exists()
