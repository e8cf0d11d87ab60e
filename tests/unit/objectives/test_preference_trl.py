"""The preference objectives against TRL 1.16, the library users trust: on the same model, the same pairs and
the same batch, the loss and TRL's six metrics (rewards/chosen, rewards/rejected, rewards/accuracies,
rewards/margins, logps/chosen, logps/rejected) of objective=dpo (sigmoid, ipo, hinge) equal DPOTrainer's and those of
objective=simpo equal the experimental CPOTrainer's in SimPO mode (loss_type="simpo", cpo_alpha=0: SimPO lives only
in trl.experimental in 1.16) and those of objective=orpo the experimental ORPOTrainer's (with its nll_loss,
log_odds_ratio and log_odds_chosen; its NLL over the chosen sequences whole, prompt included), to 1e-5 (logps/*
relative: TRL scores them with a float32 head even for a float64 model, ~1e-7 relative). The framework's side is its own path: the pairs prepared by `prepare` (data=preference),
rows from `Pairs` (interleaved), `micro_batches`, the reference's pass queueing, the objective's loss; TRL's side is
its tokenization and collator on the same tokenizer (the one prepare wrote), so the tokens are compared too,
truncation and the dropped pair included. A float64 tiny Llama (transformers) with a reference of another seed:
with policy = reference every reward is 0 and the check would be vacuous.

The smoothed sigmoid (cDPO; TRL 1.16's DPOTrainer ignores label_smoothing for sigmoid) is checked against its
formula written out here."""
import json
import math
import os
import warnings

import numpy as np
import pytest
import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from framework.data.batches import build_samplers, micro_batches  # noqa: E402
from framework.data.prepare import ChatOptions, prepare  # noqa: E402
from framework.data.sources.preference import Preference  # noqa: E402
from framework.objectives.dpo import DPO, DPOOptions  # noqa: E402
from framework.objectives.orpo import ORPO, ORPOOptions  # noqa: E402
from framework.objectives.preference import REWARD_METRICS  # noqa: E402
from framework.objectives.simpo import SimPO, SimPOOptions  # noqa: E402

trl = pytest.importorskip("trl")

MAX_LENGTH = 64             # TRL's max_length = data.seq_len + 1
PLAIN = [
    {"prompt": "What is 2 plus 2?", "chosen": " 2 plus 2 is 4.", "rejected": " It is 5."},
    {"prompt": "Spell cat backwards.", "chosen": " cat backwards is tac.", "rejected": " tca"},
    {"prompt": "Name a colour of the sky.", "chosen": " Blue.", "rejected": " The sky is green and loud."},
    {"prompt": "Is snow hot?", "chosen": " No, snow is cold.", "rejected": " Yes."},
]
CHAT = [{"prompt": [{"role": "user", "content": r["prompt"]}],
         "chosen": [{"role": "assistant", "content": r["chosen"].strip()}],
         "rejected": [{"role": "assistant", "content": r["rejected"].strip()}]} for r in PLAIN]
CHAT[0]["prompt"] = [{"role": "system", "content": "Answer briefly."}] + CHAT[0]["prompt"]
# a prompt longer than a short max_length: the pair has no completion token left (TRL drops it silently)
LONG = PLAIN + [{"prompt": "Say the alphabet from a to z, slowly, one letter at a time please.", "chosen": " a b c",
                 "rejected": " no"}]


def prepared(tmp_path, name, records, template=None):
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / f"{name}-prepared"
    prepare([str(path)], "bytes", str(out), chat=ChatOptions(template), source=Preference(), chat_only=True,
            pairs=True)
    return str(path), str(out)


def pair_layout(out: str, seq_len: int):
    """The framework's Pairs over a prepared dir (what build_samplers makes of data=preference)."""
    from omegaconf import OmegaConf
    from framework.config.schema import DataConfig
    cfg = OmegaConf.structured(DataConfig(name="preference", source="preference", tokenizer="bytes", prepared=out,
                                          seq_len=seq_len, val_fraction=0.0, packing=False))
    sampler, _ = build_samplers(cfg, 2, 0, with_val=False)
    return sampler


def hf_tokenizer(out: str):
    from transformers import PreTrainedTokenizerFast
    tok = PreTrainedTokenizerFast.from_pretrained(out)
    tok.pad_token = tok.eos_token
    return tok


def tiny_llama(vocab: int, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=96, intermediate_size=192, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).to(torch.float64)
    with torch.no_grad():           # random init gives near-uniform logits: widen them so pairs differ
        model.lm_head.weight.mul_(8.0)
    return model.eval()


def dataset(records):
    from datasets import Dataset
    return Dataset.from_list(records)


def trl_rows(batch):
    """TRL's batch (all chosen rows, then all rejected) as ours, interleaved, with the trained positions."""
    ids, mask, attention = batch["input_ids"], batch["completion_mask"], batch["attention_mask"]
    order = torch.arange(len(ids)).view(2, -1).t().reshape(-1)
    return ids[order], mask[order].bool(), attention[order].bool()


def assert_same_rows(rows, batch):
    ids, completion, attention = trl_rows(batch)
    width = int(rows.lengths.max())
    assert rows.tokens.shape[0] == ids.shape[0] and width == ids.shape[1]
    assert torch.equal(rows.lengths, attention.sum(1))
    assert torch.equal(rows.tokens[attention], ids[attention])
    assert torch.equal(rows.trained[:, :width], completion)


def framework_pass(objective, policy, reference, rows, pairs_per_micro_batch):
    """What a step runs: the reference's pass queueing its log-probs, then the loss of each micro-batch; the mean
    over micro-batches and the objective's metrics (its sums divided once)."""
    objective.begin_step()
    objective.forget_reference()
    batches = [objective.prepare(b) for b in micro_batches(rows, 2 * pairs_per_micro_batch)]
    if reference is not None:
        with torch.no_grad():
            for inputs, targets in batches:
                objective.reference_fn(reference(input_ids=inputs).logits, targets)
    losses = [objective(policy(input_ids=inputs).logits, targets).detach() for inputs, targets in batches]
    sums = objective.metric_sums()
    return float(torch.stack(losses).mean()), dict(zip(objective.metric_names, (sums[:-1] / sums[-1]).tolist()))


def assert_close_to_trl(loss, metrics, trl_loss, trl_metrics):
    assert abs(loss - float(trl_loss)) < 1e-5, (loss, float(trl_loss))
    for name, value in metrics.items():
        theirs = float(trl_metrics[name])
        scale = max(1.0, abs(theirs)) if name.startswith("logps/") else 1.0
        assert abs(value - theirs) / scale < 1e-5, (name, value, theirs)


def trl_dpo(tok, records, policy, reference, loss_type, tmp_path, beta=0.1, max_length=MAX_LENGTH):
    from trl import DPOConfig, DPOTrainer
    args = DPOConfig(output_dir=str(tmp_path / "trl"), per_device_train_batch_size=len(records), beta=beta,
                     loss_type=loss_type, max_length=max_length, bf16=False, fp16=False, use_cpu=True,
                     report_to=[], save_strategy="no", seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = DPOTrainer(model=policy, ref_model=reference, args=args, train_dataset=dataset(records),
                             processing_class=tok)
    return trainer


@pytest.fixture(scope="module")
def chat_pairs(tmp_path_factory):
    return prepared(tmp_path_factory.mktemp("chat"), "pairs", CHAT, "chatml")


@pytest.fixture(scope="module")
def plain_pairs(tmp_path_factory):
    return prepared(tmp_path_factory.mktemp("plain"), "pairs", PLAIN)


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo", "hinge"])
@pytest.mark.parametrize("kind", ["chat", "plain"])
def test_dpo_equals_trl(kind, loss_type, chat_pairs, plain_pairs, tmp_path):
    _, out = chat_pairs if kind == "chat" else plain_pairs
    records = CHAT if kind == "chat" else PLAIN
    tok = hf_tokenizer(out)
    policy, reference = tiny_llama(len(tok), 0), tiny_llama(len(tok), 1)
    trainer = trl_dpo(tok, records, policy, reference, loss_type, tmp_path)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(records))])
    trainer.model.train()
    with torch.no_grad():
        trl_loss = trainer.compute_loss(trainer.model, batch)
    trl_metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    rows = pair_layout(out, MAX_LENGTH - 1).layout.rows(range(len(records)))
    assert_same_rows(rows, batch)
    objective = DPO(DPOOptions(beta=0.1, loss_type=loss_type))
    loss, metrics = framework_pass(objective, policy.train(), reference, rows, len(records))
    assert_close_to_trl(loss, metrics, trl_loss, trl_metrics)
    assert abs(metrics["rewards/margins"]) > 0.1 and abs(metrics["rewards/chosen"]) > 0.1   # the check has teeth
    # micro-batches of one pair each: the same numbers (every split keeps pairs whole)
    split_loss, split_metrics = framework_pass(objective, policy, reference, rows, 1)
    assert split_loss == pytest.approx(loss, abs=1e-12)
    assert split_metrics == pytest.approx(metrics, abs=1e-12)


def test_simpo_equals_trl_cpo(plain_pairs, tmp_path):
    from trl.experimental.cpo import CPOConfig, CPOTrainer
    _, out = plain_pairs
    tok = hf_tokenizer(out)
    policy = tiny_llama(len(tok), 0)
    args = CPOConfig(output_dir=str(tmp_path / "trl"), per_device_train_batch_size=len(PLAIN), loss_type="simpo",
                     cpo_alpha=0.0, beta=2.0, simpo_gamma=0.5, max_length=MAX_LENGTH, bf16=False, fp16=False,
                     use_cpu=True, report_to=[], save_strategy="no", seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = CPOTrainer(model=policy, args=args, train_dataset=dataset(PLAIN), processing_class=tok)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(PLAIN))])
    cat = trainer.concatenated_inputs(batch, is_encoder_decoder=False, padding_value=trainer.pad_token_id)
    trained = cat["concatenated_labels"] != -100
    trainer.model.train()
    with torch.no_grad():
        trl_loss = trainer.compute_loss(trainer.model, batch)
    trl_metrics = {k: v[-1] for k, v in trainer._stored_metrics["train"].items()}
    rows = pair_layout(out, MAX_LENGTH - 1).layout.rows(range(len(PLAIN)))
    # CPO's own (older) tokenization gives the same rows as DPO 1.16's on plain strings
    assert_same_rows(rows, {"input_ids": cat["concatenated_input_ids"], "completion_mask": trained,
                            "attention_mask": cat["concatenated_attention_mask"]})
    loss, metrics = framework_pass(SimPO(SimPOOptions(beta=2.0, gamma=0.5)), policy.train(), None, rows, 2)
    assert_close_to_trl(loss, metrics, trl_loss, trl_metrics)
    assert metrics["rewards/margins"] != 0


def test_truncation_and_dropped_pair_as_trl(tmp_path):
    """max_length cuts completions keeping the start, and drops the pair whose prompt fills it: TRL silently,
    the framework counting it (data/pairs_dropped)."""
    _, out = prepared(tmp_path, "long", LONG)
    tok = hf_tokenizer(out)
    max_length = 40
    trainer = trl_dpo(tok, LONG, tiny_llama(len(tok), 0), tiny_llama(len(tok), 1), "sigmoid", tmp_path,
                      max_length=max_length)
    kept = len(trainer.train_dataset)
    assert kept == len(LONG) - 1
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(kept)])
    sampler = pair_layout(out, max_length - 1)
    assert len(sampler.layout) == kept
    assert sampler.cut["data/pairs_dropped"] == 1 and sampler.cut["data/pairs_truncated"] > 0
    assert_same_rows(sampler.layout.rows(range(kept)), batch)


def test_max_prompt_length_keeps_the_prompts_end(plain_pairs):
    """data.max_prompt_length (older TRL's rule: the prompt's last tokens), then the completion whole."""
    _, out = plain_pairs
    whole = pair_layout(out, MAX_LENGTH - 1).layout
    from framework.data.examples import Pairs, prompt_length
    cut = Pairs(whole.tokens, whole.mask, [*whole.start.reshape(-1), whole.start[-1, -1] + whole.length[-1, -1]],
                MAX_LENGTH - 1, max_prompt_length=5)
    for pair in range(len(whole)):
        for side in (0, 1):
            s, n = int(whole.start[pair, side]), int(whole.length[pair, side])
            p = prompt_length(whole.mask, s, n)
            ids = np.asarray(whole.tokens[s:s + n]).tolist()
            a, m = int(cut.start[pair, side]), int(cut.length[pair, side])
            assert np.asarray(cut.tokens[a:a + m]).tolist() == ids[max(0, p - 5):]
            assert prompt_length(cut.mask, a, m) == min(p, 5)
    assert cut.counts["data/prompts_cut"] == len(PLAIN)


def test_conservative_dpo_is_its_formula():
    """label_smoothing e: -(1 - e) log sigmoid(beta h) - e log sigmoid(-beta h) (cDPO, written out here)."""
    torch.manual_seed(0)
    logps, reference = torch.randn(5, 2, dtype=torch.float64) * 10, torch.randn(5, 2, dtype=torch.float64) * 10
    counts = torch.full((5, 2), 7.0, dtype=torch.float64)
    beta, e = 0.3, 0.2
    loss, _ = DPO(DPOOptions(beta=beta, label_smoothing=e)).pair_losses(logps, counts, reference)
    sigmoid = lambda x: 1 / (1 + math.exp(-x))
    for i in range(5):
        h = (logps[i, 0] - reference[i, 0] - logps[i, 1] + reference[i, 1]).item()
        expected = -(1 - e) * math.log(sigmoid(beta * h)) - e * math.log(sigmoid(-beta * h))
        assert loss[i].item() == pytest.approx(expected, rel=1e-12)


def trl_orpo(tok, policy, tmp_path, beta=0.1):
    from trl.experimental.orpo import ORPOConfig, ORPOTrainer
    args = ORPOConfig(output_dir=str(tmp_path / "trl"), per_device_train_batch_size=len(PLAIN), beta=beta,
                      max_length=MAX_LENGTH, bf16=False, fp16=False, use_cpu=True, report_to=[], save_strategy="no",
                      seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ORPOTrainer(model=policy, args=args, train_dataset=dataset(PLAIN), processing_class=tok)


def test_orpo_equals_trl_orpo(plain_pairs, tmp_path):
    """The loss, TRL's six metrics and ORPO's own three (nll_loss, log_odds_ratio, log_odds_chosen): the NLL over
    the chosen sequences whole, prompt included, as TRL's. One-pair micro-batches give the same numbers within the
    global batch's count of chosen targets (Pairs.chosen_targets); their own means would not."""
    _, out = plain_pairs
    tok = hf_tokenizer(out)
    policy = tiny_llama(len(tok), 0)
    trainer = trl_orpo(tok, policy, tmp_path)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(PLAIN))])
    cat = trainer.concatenated_inputs(batch, is_encoder_decoder=False, padding_value=trainer.padding_value)
    trainer.model.train()
    with torch.no_grad():
        trl_loss = trainer.compute_loss(trainer.model, batch)
    trl_metrics = {k: v[-1] for k, v in trainer._stored_metrics["train"].items()}
    sampler = pair_layout(out, MAX_LENGTH - 1)
    rows = sampler.layout.rows(range(len(PLAIN)))
    assert_same_rows(rows, {"input_ids": cat["concatenated_input_ids"],
                            "completion_mask": cat["concatenated_labels"] != -100,
                            "attention_mask": cat["concatenated_attention_mask"]})
    objective = ORPO(ORPOOptions(beta=0.1))
    loss, metrics = framework_pass(objective, policy.train(), None, rows, len(PLAIN))
    assert set(metrics) == {*REWARD_METRICS, "nll_loss", "log_odds_ratio", "log_odds_chosen"}
    assert_close_to_trl(loss, metrics, trl_loss, trl_metrics)
    # the NLL is not the completions' alone: the prompt's tokens weigh in
    assert metrics["rewards/margins"] != 0 and metrics["nll_loss"] > 0
    whole = sampler.layout.chosen_targets(range(len(PLAIN)))
    assert whole == int(rows.lengths[0::2].sum()) - len(PLAIN)
    with objective.chosen_batch(whole, len(PLAIN)):
        split_loss, split_metrics = framework_pass(objective, policy, None, rows, 1)
    # the odds-ratio term is float32 (TRL's): its sums over other groupings round alike, not bit for bit
    assert split_loss == pytest.approx(loss, rel=1e-7)
    assert split_metrics == pytest.approx(metrics, rel=1e-7, abs=1e-7)
    own_means, _ = framework_pass(objective, policy, None, rows, 1)
    assert own_means != pytest.approx(loss, rel=1e-5)       # 1.6e-3 away here
    # a deferred head (model.loss_chunk_tokens) scores the prompt's targets as the whole logits do
    from framework.models.loss import deferred_logits
    inputs, targets = objective.prepare(micro_batches(rows, 2 * len(PLAIN))[0])
    with torch.no_grad():
        hidden = policy.model(input_ids=inputs).last_hidden_state
        chunked = objective(deferred_logits(hidden, policy.lm_head, 16), targets)
    assert float(chunked) == pytest.approx(loss, rel=1e-7)
