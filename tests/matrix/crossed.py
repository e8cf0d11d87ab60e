"""What the combination matrix crosses, said here and nowhere in the product: every field the schema declares is
either crossed (CROSSED: its values, the first being what a job gets where the matrix does not set it) or listed in
NOT_CROSSED with the reason; each registered model family is crossed at its smallest member (SMALLEST) or listed.
tests/matrix/test_matrix.py fails on a field or a family in neither, so a new option that changes how a job trains
cannot be forgotten: it is crossed, or someone says why not."""
from __future__ import annotations

import os
import shutil
import tempfile

from framework.parallel.activation_checkpointing import MODES as AC_MODES
from framework.parallel.pipeline import SCHEDULES as PP_SCHEDULES
from framework.parallel.precision import FLOAT8_RECIPES

#: config path -> the values the matrix tries (group options are crossed by their config group: tests/matrix/axes.py)
CROSSED: dict[str, tuple] = {
    "activation_checkpointing.mode": ("none", *(m for m in AC_MODES if m != "none")),
    "activation_checkpointing.save_every_nth_matmul": (1, 2),
    "checkpoint.async_save": (False, True),
    "data.document_mask": (False, True),
    "lora.base_dtype": ("float32", "bfloat16", "nf4"),
    "lora.dora": (False, True),
    "lora.enabled": (False, True),
    "model.loss_chunk_tokens": (0, 16),
    "parallel.cp": (1, 2),
    "parallel.dp_replicate": (1, 2),
    "parallel.dp_shard": (-1, 1, 2),        # -1 first: parallel=fsdp's and 3d's default, the rest of the world
    "parallel.ep": (1, 2),
    "parallel.pp": (1, 2),
    "parallel.pp_schedule": ("1F1B", *(s for s in PP_SCHEDULES if s != "1F1B")),
    "parallel.pp_virtual_stages": (1, 2),
    "parallel.sequence_parallel": (False, True),
    "parallel.tp": (1, 2),
    "precision.float8_emulate": (False, True),
    "precision.float8_recipe": ("tensorwise", *FLOAT8_RECIPES[1:]),
    "trainer.compile": (False, True),
    "trainer.deterministic": (False, True),
    "trainer.on_oom": ("abort", "retry"),
    "trainer.rampup_batch_size": (None, (4, 4, 8)),
    "zero.offload_optimizer": (False, True),
    "zero.offload_params": (False, True),
}

_GROUP = "crossed as its config group's options (parallel=, zero=, precision=, model=)"
_SIZE = "a size, a count or a rate: it scales what the job computes, not which code trains it"
_PATH = "a path or a name of the user's: where data, weights or records are, not how the job trains"
_RECORDS = "what is recorded and where (metrics, trackers, samples, evaluation), not how a step trains"
_LAUNCH = "how the workers are started, placed, timed out and stopped, not what a step computes"
_PLANNER = "what the planner assumes before launch; it changes no step"
_SHAPE = "the model's shape: the matrix trains each family at its smallest member (SMALLEST)"
_DEEPSPEED = ("a DeepSpeed engine tunable, passed into its generated JSON as it is: buffer sizes, overlap and "
              "offload placement, not what the step computes; parallel=deepspeed is crossed with every option")
_FP16 = "fp16's loss-scaling numbers: precision=fp16 is crossed, its scaler's constants are not modes"
_OPTIMIZER = ("a parameter of the torch optimizer the optimizer group names; every strategy steps that optimizer "
              "the same way, whatever its numbers")
_OPTIMIZER_CLASS = (
    "the optimizer class. torch's step alike under every strategy; optimizer=muon, which gathers sharded matrices, is "
    "held to single under ddp zero1, fsdp zero2/3 and 3d by tests/integration/optim/test_muon_layouts.py and refused "
    "under deepspeed; torchao's low-bit ones compile per parameter shape (tests/unit/optim/test_lowbit.py). Crossing "
    "the group (adamw, muon, sgd) in the pairwise cover was measured at 86 jobs against 58: not yet afforded")
_RESUME = "a checkpoint to start from: the matrix resumes every job from its own checkpoint (tests/matrix/run.py)"
_DDP = ("a DistributedDataParallel tunable (its buckets, hooks and graph bookkeeping); the gradients it "
        "all-reduces are the same")
_FAMILY = "a mode of one family's own model (moe): the family is crossed at its smallest member, which has one"

#: objective -> why the objective axis leaves it out (the axis is the objective registry less these)
OBJECTIVES_NOT_CROSSED: dict[str, str] = {}

#: config path -> why the matrix does not cross it
NOT_CROSSED: dict[str, str] = {
    **dict.fromkeys(("parallel", "parallel.name", "zero.stage", "precision.name", "precision.param_dtype", "model",
                     "model._target_", "objective", "objective.name"), _GROUP),
    **dict.fromkeys(("optimizer", "optimizer._target_"), _OPTIMIZER_CLASS),
    **dict.fromkeys(("objective.beta", "objective.gamma", "objective.label_smoothing"),
                    "a preference objective's numbers: each objective is crossed (objective=), its constants are "
                    "not modes; tests/unit/objectives holds them to TRL"),
    "objective.precompute_reference": (
        "where dpo's reference log-probs come from, not what trains: the pass before training is each layout's own "
        "eval_loss over its training micro-batches, and tests/integration/objectives/test_preference_runs.py holds "
        "single and fsdp x2 to the live reference's losses and rewards bit for bit (a resume reading the table back "
        "too); crossed, it would double every dpo job"),
    "objective.loss_type": ("objective=dpo's loss on the same log-probs (sigmoid, ipo, hinge), each held to TRL's "
                            "by tests/unit/objectives; every one reads the log-probs the crossed layouts compute"),
    **dict.fromkeys(("optimizer.lr", "optimizer.betas", "optimizer.eps", "optimizer.foreach", "optimizer.momentum",
                     "optimizer.nesterov", "optimizer.weight_decay", "optimizer.ns_steps", "optimizer.adjust_lr_fn",
                     "optimizer.adamw_lr", "optimizer.adamw_betas", "optimizer.adamw_eps", "optimizer.block_size",
                     "optimizer.bf16_stochastic_round"),
                    _OPTIMIZER),
    "optimizer.groups": ("per-parameter lr, weight decay and (muon) update by name: the optimizer factory builds the "
                         "groups from the model's names in every strategy alike"),
    "optimizer.mode": ("Muon's two ways to orthogonalise a sharded matrix (only optimizer=muon has the key); both are "
                       "held bit for bit to torch's step by tests/integration/optim/test_muon_sharded_step.py"),
    **dict.fromkeys(("activation_checkpointing.every_n_layers", "activation_checkpointing.save_matmuls",
                     "activation_checkpointing.block_classes"),
                    "which blocks and outputs activation_checkpointing.mode=layer keeps: the mode is crossed"),
    **dict.fromkeys(("checkpoint.dir", "checkpoint.initial_load", "checkpoint.score"), _PATH),
    **dict.fromkeys(("checkpoint.enabled", "checkpoint.interval", "checkpoint.keep_best", "checkpoint.keep_last",
                     "checkpoint.score_mode", "checkpoint.storage_timeout_s"),
                    "when checkpoints are written and which are kept: every matrix job saves and resumes"),
    "checkpoint.resume": _RESUME,
    **dict.fromkeys(("data.cache_dir", "data.name", "data.path", "data.prepared", "data.sources", "data.split",
                     "data.text_key", "data.tokenizer", "data.eos_id", "data.chat_template", "data.dtype"), _PATH),
    **dict.fromkeys(("data.seq_len", "data.vocab_size", "data.num_tokens", "data.val_fraction",
                     "data.max_prompt_length"), _SIZE),
    "data.source": "the reader of the tokens: every source yields the same token streams to the same samplers",
    **dict.fromkeys(("data.overlong", "data.packing", "data.train_on"),
                    "instruction (chat) data only: how its examples fill rows and which tokens train; the matrix "
                    "trains token data, and the chat tests hold each mode to TRL"),
    "device": "cpu or cuda: CI has only CPUs; a GPU runs the same matrix of code",
    **dict.fromkeys(("launcher.backend", "launcher.engine", "launcher.max_restarts", "launcher.monitor_interval",
                     "launcher.nproc_per_node", "launcher.preempt_signals", "launcher.preload",
                     "launcher.ray.address", "launcher.ray.callbacks", "launcher.ray.resources_per_worker",
                     "launcher.stop_grace_s", "launcher.timeout_s"), _LAUNCH),
    **dict.fromkeys(("logging.cpu_peak_flops", "logging.experiment", "logging.gpu_health",
                     "logging.mlflow_tracking_uri", "logging.peak_flops", "logging.run_name", "logging.tracker_errors",
                     "logging.tracker_timeout_s", "logging.trackers"), _RECORDS),
    **dict.fromkeys(("lora.alpha", "lora.dropout", "lora.rank"), _SIZE),
    "lora.targets": "which linears carry adapters: lora.enabled is crossed, with every block linear adapted",
    **dict.fromkeys(("model.attn_head_dim", "model.dim", "model.ffn_dim", "model.init_std", "model.max_seq_len",
                     "model.moe_ffn_dim", "model.multiple_of", "model.n_experts", "model.n_heads", "model.n_kv_heads",
                     "model.n_layers", "model.norm_eps", "model.rope_scaling.factor",
                     "model.rope_scaling.high_freq_factor", "model.rope_scaling.low_freq_factor",
                     "model.rope_scaling.original_max_position_embeddings", "model.rope_scaling.rope_type",
                     "model.rope_theta", "model.shared_ffn_dim", "model.top_k", "model.vocab_size", "model.config",
                     "model.pretrained", "model.tie_embeddings", "model.qk_norm"), _SHAPE),
    **dict.fromkeys(("model.aux_loss_coef", "model.balance", "model.bias_update_rate", "model.expert_compute",
                     "model.norm_topk_prob", "model.score_func"), _FAMILY),
    **dict.fromkeys(("parallel.allgather_bucket_size", "parallel.allgather_partitions", "parallel.contiguous_gradients",
                     "parallel.overlap_comm", "parallel.pin_memory", "parallel.reduce_bucket_size",
                     "parallel.reduce_scatter", "parallel.round_robin_gradients",
                     "parallel.stage3_gather_16bit_weights_on_model_save", "parallel.stage3_max_live_parameters",
                     "parallel.stage3_max_reuse_distance", "parallel.stage3_param_persistence_threshold",
                     "parallel.stage3_prefetch_bucket_size", "parallel.sub_group_size", "parallel.nvme_path",
                     "parallel.overrides", "parallel.hysteresis", "parallel.min_loss_scale"), _DEEPSPEED),
    "parallel.ds_config": "a DeepSpeed JSON of the user's, adopted before validation into the keys the matrix crosses",
    "parallel.use_deepspeed_optimizer": ("DeepSpeed's own Adam(W) kernels in place of torch's; on a CPU with no "
                                         "offload it is torch's AdamW either way"),
    **dict.fromkeys(("parallel.bucket_cap_mb", "parallel.comm_hook", "parallel.find_unused_parameters",
                     "parallel.gradient_as_bucket_view", "parallel.static_graph"), _DDP),
    "parallel.pp_microbatches": ("how many pipeline micro-batches: derived from the micro-batch by default, a count "
                                 "that the pipeline's schedules (crossed) take"),
    "parallel.rest_world_size": "how many workers a -1 degree spawns: the world size, not a mode",
    **dict.fromkeys(("parallel.strategies", "parallel.top"), "parallel=auto's search, which picks one of the "
                                                             "crossed layouts"),
    "parallel.wrap_classes": "which modules FSDP2 wraps: the model's blocks by default, crossed with every option",
    **dict.fromkeys(("planner.check", "planner.device", "planner.gpus_per_node", "planner.nodes",
                     "planner.time_on_device"), _PLANNER),
    **dict.fromkeys(("precision.backoff_factor", "precision.growth_factor", "precision.growth_interval",
                     "precision.init_scale"), _FP16),
    "precision.allow_tf32": "CUDA's TF32 matmuls: nothing on a CPU",
    "precision.store_dtype": ("bf16 parameters with no fp32 master (precision=bf16 only; refused under deepspeed and "
                              "with lora): held to torchao's optimizer under single by tests/unit/optim/"
                              "test_adamw_bf16.py, to single under fsdp zero3 (with its planned states) by "
                              "tests/integration/optim/test_bf16_params.py, and resumed exactly by test_checkpoint.py; "
                              "ddp, fsdp zero2, 3d tp2 and pp2 were measured once (parity kind bf16-params). Crossing "
                              "it in the pairwise cover was measured at 86 jobs against 77: not yet afforded"),
    "precision.reduce_dtype": ("FSDP2's gradient reduction dtype: the precision group's options set it with the "
                               "compute dtype"),
    **dict.fromkeys(("scheduler.min_lr_ratio", "scheduler.warmup_steps", "scheduler.decay_fraction"), _SIZE),
    "scheduler.decay_type": "the decay's shape (wsd): a number a step reads, the same under every strategy",
    "scheduler.name": "the learning-rate schedule: a number a step reads, the same under every strategy",
    "seed": "the seed: every matrix job and its reference share one",
    **dict.fromkeys(("trainer.eval_batches", "trainer.eval_every", "trainer.log_every", "trainer.objective",
                     "trainer.profile.memory_snapshot", "trainer.profile.steps", "trainer.progress_bar",
                     "trainer.sample_every", "trainer.sample_prompt", "trainer.sample_tokens"), _RECORDS),
    **dict.fromkeys(("trainer.global_batch_size", "trainer.max_steps", "trainer.micro_batch_size",
                     "trainer.grad_clip", "trainer.stall_timeout_s", "trainer.stop_at_step"), _SIZE),
    "trainer.compile_backend": ("trainer.compile's backend: the matrix compiles with aot_eager (tests/matrix/"
                                "oracle.py CHEAPER), inductor's numerics are held by the compile tests"),
    "trainer.on_nonfinite": "what a NaN or inf loss does: no matrix job meets one",
    # benchmark scores: forwards in evaluation mode through the strategy, no random state moved (tests/integration/
    # evaluation/test_in_loop.py holds a job's losses with them to the losses without); every layout is held to
    # single's scores there
    **dict.fromkeys(("eval.tasks", "eval.limit", "eval.every", "eval.apply_chat_template"), _RECORDS),
    "eval.include_path": _PATH,
}


def _hf_smallest(scratch_dir: str) -> list[str]:
    """A fresh transformers Llama of four tiny blocks, from a config.json written into scratch_dir: a vocabulary
    that holds byte tokens and ChatML's (the preference objectives' data)."""
    from framework.models.hf.model import require_transformers
    config = require_transformers().LlamaConfig(
        hidden_size=32, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=320, max_position_embeddings=256, tie_word_embeddings=False)
    path = os.path.join(scratch_dir, "hf_smallest")
    if not os.path.isfile(os.path.join(path, "config.json")):
        # written whole, then renamed: a job already reading it (the matrix composes while its sweep runs) never
        # sees a file cut short
        tmp = tempfile.mkdtemp(dir=scratch_dir)
        config.save_pretrained(tmp)
        os.makedirs(path, exist_ok=True)
        os.replace(os.path.join(tmp, "config.json"), os.path.join(path, "config.json"))
        shutil.rmtree(tmp, ignore_errors=True)
    return ["model=hf", f"model.config={path}"]


#: model family -> the overrides of its smallest member, with blocks enough for every layout (2 pipeline ranks x 2
#: virtual stages); a function where the member needs a file of its own in the matrix's scratch dir
SMALLEST = {
    "llama": ["model=tiny", "model.n_layers=4"],
    "gpt2": ["model=gpt2_tiny", "model.n_layers=4"],
    "hf": _hf_smallest,
    "moe": ["model=moe_tiny", "model.n_layers=4"],
}


def objective_overrides(name: str, scratch_dir: str) -> list[str]:
    """An objective, with the data it trains on: a preference objective takes the shipped pairs (tiny_prefs.jsonl,
    ChatML conversations of ~80 byte tokens: rows of 64 + 1 keep every prompt and part of each answer), prepared
    once into the matrix's scratch dir, and steps with SGD: a preference loss's gradient is a difference of the
    chosen and rejected answers' (exactly cancelling on the tokens they share), so many of its elements are
    rounding noise, which Adam's normalised step makes full-size updates (measured: layouts that sum in another
    order part by 2e-5 to 3e-4 after two AdamW steps, most in the token embeddings, for dpo and simpo alike);
    SGD keeps a rounding difference one."""
    from framework.data.assets import path
    from framework.objectives.registry import objective_class
    if objective_class(name).rows_per_example == 1:
        return [f"objective={name}"]
    return [f"objective={name}", "data=preference", f"data.path={path('tiny_prefs.jsonl')}", "data.tokenizer=bytes",
            "data.chat_template=chatml", "data.seq_len=64", f"data.cache_dir={os.path.join(scratch_dir, 'prepared')}",
            "optimizer=sgd"]


def smallest_overrides(family: str, scratch_dir: str) -> list[str]:
    found = SMALLEST[family]
    return found(scratch_dir) if callable(found) else list(found)
