"""The tokenizer travels with the weights: checkpoint -> export -> transformers' AutoTokenizer and
AutoModelForCausalLM, and `python -m framework.generate` from either, deterministic for a seed."""
import pytest
import torch

from framework.data.prepare import prepare
from tests.fixtures.corpora import write_pydoc_jsonl
from tests.harness.helpers import FAST, check_ok, read_metrics, run_framework

transformers = pytest.importorskip("transformers")

PROMPT = "The class statement"
CKPT = ["checkpoint.enabled=true", "trainer.max_steps=12"]


def _generate(path, *args):
    return run_framework([str(path), *args], module="framework.generate")


@pytest.fixture(scope="module")
def bpe_model(tmp_path_factory):
    """A tiny model trained on a prepared BPE dataset, its last checkpoint, and that checkpoint exported."""
    root = tmp_path_factory.mktemp("gen")
    prepare([str(f) for f in write_pydoc_jsonl(root / "jsonl")], "bpe:512", str(root / "dataset"))
    check_ok(run_framework([*FAST, *CKPT, "data=tokens", f"data.path={root / 'dataset'}"], root / "run"))
    step = root / "run" / "checkpoints" / "step_00000012"
    check_ok(run_framework([str(step), str(root / "hf")], module="framework.export"))
    return root, step, root / "hf"


def test_checkpoint_records_the_dataset_tokenizer(bpe_model):
    root, step, _ = bpe_model
    assert (step / "tokenizer.json").read_bytes() == (root / "dataset" / "tokenizer.json").read_bytes()


@torch.no_grad()
def test_transformers_loads_tokenizer_and_model_together_and_greedy_text_matches_ours(bpe_model):
    root, step, hf_dir = bpe_model
    from tokenizers import Tokenizer
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    assert ids[0].tolist() == Tokenizer.from_file(str(root / "dataset" / "tokenizer.json")).encode(PROMPT).ids
    assert tokenizer.eos_token == "<|endoftext|>" and model.config.eos_token_id == tokenizer.eos_token_id
    out = model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    theirs = PROMPT + tokenizer.decode(out[0, ids.shape[1]:])
    for path in (step, hf_dir):
        proc = _generate(path, "--prompt", PROMPT, "--max-new-tokens", "12", "--temperature", "0")
        check_ok(proc)
        assert proc.stdout == theirs + "\n"   # print adds the last newline


def test_sampling_is_deterministic_for_a_seed(bpe_model):
    _, step, hf_dir = bpe_model
    args = ["--prompt", PROMPT, "--max-new-tokens", "30", "--temperature", "1.0", "--top-k", "100"]
    # Two processes loading the weights two ways, one seed: the same text; another seed: another text.
    first, from_export = _generate(step, *args, "--seed", "3"), _generate(hf_dir, *args, "--seed", "3")
    other_seed = _generate(step, *args, "--seed", "4")
    for proc in (first, from_export, other_seed):
        check_ok(proc)
    assert first.stdout == from_export.stdout != other_seed.stdout
    assert first.stdout.startswith(PROMPT) and len(first.stdout) > len(PROMPT) + 10


def test_a_byte_level_model_exports_a_byte_tokenizer_and_generates(tmp_path):
    check_ok(run_framework([*FAST, *CKPT], tmp_path / "run"))   # data=pydoc: bytes
    step = tmp_path / "run" / "checkpoints" / "step_00000012"
    check_ok(run_framework([str(step), str(tmp_path / "hf")], module="framework.export"))
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert tokenizer("héllo").input_ids == list("héllo".encode())
    proc = _generate(step, "--prompt", "def ", "--max-new-tokens", "20", "--seed", "1")
    check_ok(proc)
    assert proc.stdout.startswith("def ") and len(proc.stdout.encode()) > 4


def test_a_path_without_a_model_is_refused_in_one_line(tmp_path):
    proc = _generate(tmp_path, "--prompt", "x")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"error: {tmp_path} is neither a checkpoint step dir (meta.json) "
                                   f"nor an export dir (config.json)")


def test_training_logs_the_same_sample_under_single_and_ddp(bpe_model, tmp_path):
    root, _, _ = bpe_model
    args = [*FAST, "data=tokens", f"data.path={root / 'dataset'}", "trainer.sample_every=4",
            "trainer.sample_prompt='The class'", "trainer.sample_tokens=8", "logging.trackers=[tensorboard]"]
    samples = {}
    for layout in (["parallel=single"], ["parallel=ddp", "launcher.nproc_per_node=2"]):
        run_dir = tmp_path / layout[0].split("=")[1]
        proc = run_framework([*args, *layout], run_dir)
        check_ok(proc)
        records = [r for r in read_metrics(run_dir) if "sample" in r]
        samples[layout[0]] = [(r["step"], r["sample"]) for r in records]
        assert f"step 4 sample: {records[0]['sample']!r}" in proc.stdout
        assert list((run_dir / "tensorboard").glob("events.*"))
    assert [step for step, _ in samples["parallel=single"]] == [4, 8]
    assert all(text.startswith("The class") and len(text) > len("The class") for _, text in samples["parallel=single"])
    assert samples["parallel=single"] == samples["parallel=ddp"]


def test_sampling_without_a_tokenizer_is_refused(tmp_path):
    import numpy as np
    np.arange(1000, dtype=np.uint16).tofile(tmp_path / "tokens.bin")
    proc = run_framework([*FAST, "data=tokens", f"data.path={tmp_path / 'tokens.bin'}", "data.vocab_size=1000",
                          "trainer.sample_every=2"], tmp_path / "run")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == ("error: trainer.sample_every: needs the data's tokenizer; "
                                                    "data.source=tokens names none: set "
                                                    "data.tokenizer=/path/to/tokenizer.json")
