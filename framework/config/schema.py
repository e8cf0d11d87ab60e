"""Typed schemas for every config group.

Each group option in conf/ starts its defaults list with `<option>_schema`, so a key the
schema does not know, or a value of the wrong type, fails when Hydra composes the config.
Strategy-specific options live beside their strategy; only the shared parts are here.

A field that takes one of a fixed set of values is `OneOf[...]`: OmegaConf 2.3 refuses typing.Literal in
a structured config, so the type it sees is str and the set rides along as a Literal, which
config/choices.py reads to refuse any other value before work starts. Where the set is a table of the
code that implements it (sources, schedules, dtypes), the field names that table; a registry (a dict: sources,
engines) is read when the value is checked, so a name registered at runtime (a plugin, a test) is allowed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Optional

from omegaconf import MISSING

from framework.config.choices import Registered

from framework.checkpoint.retention import SCORE_MODES
from framework.data.chat import TEMPLATES, TRAIN_ON
from framework.data.sources import SOURCES, TOKEN_DTYPES
from framework.models.lora import BASE_DTYPES
from framework.optim.names import ALGORITHMS, MUON_MODES
from framework.optim.schedulers import DECAYS, SCHEDULES
from framework.parallel.compile import BACKENDS as COMPILE_BACKENDS
from framework.parallel.precision import COMPUTE_DTYPES, DTYPES, FLOAT8_RECIPES, STORE_DTYPES
from framework.runtime.engines import ENGINES
from framework.storage.timeouts import DEFAULT_TIMEOUT_S as STORAGE_TIMEOUT_S


class OneOf:
    """`OneOf["a", "b"]` (or `OneOf[a_tuple]`) = Annotated[str, Literal["a", "b"]]; `OneOf[a_dict]` =
    Annotated[str, Registered(a_dict)]: the dict's keys when a value is checked."""

    def __class_getitem__(cls, values):
        if isinstance(values, dict):
            return Annotated[str, Registered(values)]
        return Annotated[str, Literal[tuple(values) if isinstance(values, (tuple, list)) else (values,)]]


@dataclass
class ParallelConfig:
    """Options every strategy understands; strategies subclass it with their own knobs."""
    name: str = MISSING                     # the strategy; set by the group option (parallel=<name>)
    # data-parallel replica groups (HSDP: sharded inside a group, replicated across); -1 = the rest
    dp_replicate: int = 1
    dp_shard: int = 1                       # ranks a parameter is sharded over (FSDP2); -1 = the rest of the world size
    tp: int = 1                             # tensor-parallel degree (parallel=3d)
    pp: int = 1                             # pipeline stages (parallel=3d)
    # GPipe | 1F1B | Interleaved1F1B | LoopedBFS | InterleavedZeroBubble | ZBVZeroBubble | DualPipeV
    pp_schedule: str = "1F1B"
    pp_microbatches: Optional[int] = None   # null: a data-parallel rank's share / micro_batch_size, at least pp
    # 2+ for Interleaved1F1B / LoopedBFS / InterleavedZeroBubble, 2 for ZBV/DualPipeV
    pp_virtual_stages: int = 1
    cp: int = 1                             # context parallel: ranks that split every sequence (parallel=3d)
    # tp > 1: norms and residual activations sharded over the tp ranks along the sequence
    sequence_parallel: bool = False
    ep: int = 1                             # expert parallelism (parallel=3d): MoE experts sharded over the dp ranks


@dataclass
class AutoParallelConfig(ParallelConfig):
    """parallel=auto: the planner picks the layout (strategy, zero, degrees, schedule, AC, micro-batch)."""
    name: str = "auto"
    strategies: Optional[list[str]] = None  # the strategies tried; null = every registered one
    top: int = 5                            # layouts printed, best first


@dataclass
class ZeroConfig:
    stage: int = 0      # what is sharded: 0 nothing, 1 optimizer states, 2 also gradients, 3 also parameters
    # optimizer states (and their step) in CPU memory (fsdp: with offload_params; deepspeed)
    offload_optimizer: bool = False
    offload_params: bool = False            # parameters in CPU memory between uses (fsdp; deepspeed stage3)


@dataclass
class PrecisionConfig:
    name: OneOf[COMPUTE_DTYPES] = "fp32"    # the compute dtype; set by the group option (precision=<name>)
    param_dtype: OneOf[DTYPES] = "float32"    # compute dtype: autocast dtype, or FSDP2's all-gather dtype
    reduce_dtype: OneOf[DTYPES] = "float32"   # gradient reduction dtype (FSDP2); master weights stay fp32
    # parameters as stored: float32 (the master weights) | bfloat16 (precision=bf16 only: parameters, gradients and
    # optimizer states in bf16, no fp32 copy; the fp32 init rounded; optimizer=adamw_bf16 rounds stochastically)
    store_dtype: OneOf[STORE_DTYPES] = "float32"
    allow_tf32: bool = True             # CUDA: fp32 matmuls on TF32 tensor cores (MFU then uses the TF32 peak)
    float8_recipe: OneOf[FLOAT8_RECIPES] = "tensorwise"  # float8: tensorwise (FSDP2 all-gathers float8) | rowwise (one scale a row)
    float8_emulate: bool = False            # float8: emulate the float8 matmuls (numerics only: tests, CPU)
    # fp16 dynamic loss scaling (torch.amp.GradScaler)
    init_scale: float = 65536.0             # fp16: the first loss scale (torch.amp.GradScaler)
    growth_factor: float = 2.0              # fp16: the loss scale grows by this after growth_interval finite steps
    backoff_factor: float = 0.5             # fp16: the loss scale shrinks by this after a step with inf/NaN gradients
    growth_interval: int = 2000             # fp16: finite steps before the loss scale grows


@dataclass
class ActivationCheckpointingConfig:
    # none | full | layer (every_n_layers blocks) | op (every block, matmul and attention outputs kept).
    # A str, not a OneOf: validation refuses the old value `selective` naming its successors.
    mode: str = "none"
    every_n_layers: int = 2     # layer: checkpoint every Nth block
    save_matmuls: bool = False  # layer: inside checkpointed blocks keep matmul outputs, recompute the rest
    save_every_nth_matmul: int = 1          # where matmul outputs are kept: only every nth (2 = torchtitan's op policy)
    block_classes: list[str] = field(default_factory=list)   # empty = the model's block_classes()


@dataclass
class ParamGroupConfig:
    pattern: str = MISSING      # a Python regex searched in each parameter's name (the model's, without wrappers)
    lr_scale: float = 1.0                   # the group's lr = the optimizer's lr x lr_scale (scheduled alike)
    weight_decay: Optional[float] = None    # null: the default (optimizer.weight_decay on matrices, 0 on the rest)
    algorithm: Optional[OneOf[ALGORITHMS]] = None  # optimizer=muon: muon | adamw; null: by shape (muon: hidden 2-D)


@dataclass
class OptimizerConfig:
    _target_: str = MISSING                 # the torch.optim class (any class path works)
    lr: float = MISSING                     # peak learning rate (the scheduler's warm-up and decay scale it)
    weight_decay: float = 0.0               # decoupled weight decay (AdamW) or L2 penalty (SGD)
    # parameter groups by name, first match wins: [{pattern: 'output', lr_scale: 0.5, weight_decay: 0.0}]
    groups: list[ParamGroupConfig] = field(default_factory=list)


@dataclass
class AdamWConfig(OptimizerConfig):
    _target_: str = "torch.optim.AdamW"
    lr: float = 3e-3
    weight_decay: float = 0.1
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])  # Adam's moment decay rates
    eps: float = 1e-8                       # added to the denominator for numerical stability
    foreach: Optional[bool] = None          # torch's multi-tensor kernels; null = torch's choice


@dataclass
class LowBitAdamWConfig(OptimizerConfig):
    _target_: str = "torchao.optim.AdamW8bit"   # torchao.optim.AdamW8bit | AdamW4bit (optimizer=adamw_8bit | 4bit)
    lr: float = 3e-3
    weight_decay: float = 0.1
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])  # Adam's moment decay rates
    eps: float = 1e-8                       # added to the denominator for numerical stability
    # values per scale of the quantised states; a tensor under 4096 values (or not a multiple) keeps fp32 states
    block_size: int = 256


@dataclass
class BF16AdamWConfig(OptimizerConfig):
    """optimizer=adamw_bf16: torchao's AdamW on bf16 parameters (precision.store_dtype=bfloat16), its two moments
    bf16 as well; each update computed in fp32 and rounded back stochastically."""
    _target_: str = "torchao.optim._AdamW"
    lr: float = 3e-3
    weight_decay: float = 0.1
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])  # Adam's moment decay rates
    eps: float = 1e-8                       # added to the denominator for numerical stability
    # round the updated bf16 parameters up or down with the probability of their distance (unbiased); false:
    # to nearest, which loses every update smaller than half a bf16 step
    bf16_stochastic_round: bool = True


@dataclass
class SGDConfig(OptimizerConfig):
    _target_: str = "torch.optim.SGD"
    lr: float = 0.1
    momentum: float = 0.9                   # momentum factor
    nesterov: bool = False                  # Nesterov momentum


@dataclass
class MuonConfig(OptimizerConfig):
    _target_: str = "framework.optim.muon.MuonWithAdamW"
    lr: float = 0.02                        # Muon's lr, for the hidden matrices
    weight_decay: float = 0.1               # decoupled, on every matrix (Muon's and AdamW's)
    momentum: float = 0.95                  # Muon's momentum (an EMA of the gradients, as torch.optim.Muon's)
    nesterov: bool = True                   # Muon's update from the Nesterov look-ahead of the momentum
    ns_steps: int = 5                       # Newton-Schulz iterations of the orthogonalisation
    # original: lr x sqrt(max(1, rows/cols)); match_rms_adamw: lr x 0.2 x sqrt(max(rows, cols)) (Moonlight)
    adjust_lr_fn: Optional[OneOf["original", "match_rms_adamw"]] = None   # null = original
    adamw_lr: float = 3e-3                  # AdamW's lr, for embeddings, the output head, norms and biases
    adamw_betas: list[float] = field(default_factory=lambda: [0.9, 0.95])   # AdamW's moment decay rates
    adamw_eps: float = 1e-8                 # AdamW's eps
    # gather: every rank orthogonalises each whole matrix; round_robin: each matrix on one rank, scattered back
    mode: OneOf[MUON_MODES] = "gather"


@dataclass
class SchedulerConfig:
    name: OneOf[SCHEDULES] = MISSING        # the schedule; set by the group option (scheduler=<name>)
    warmup_steps: int = 0                   # linear warm-up from 0 to optimizer.lr over these steps
    min_lr_ratio: float = 0.1   # the decay ends at lr * min_lr_ratio at max_steps (cosine, linear, wsd)


@dataclass
class WSDConfig(SchedulerConfig):
    # the decay's share of trainer.max_steps: it starts at max_steps * (1 - decay_fraction), after the stable phase
    decay_fraction: float = 0.2
    decay_type: OneOf[tuple(DECAYS)] = "linear"    # the decay's shape: linear | sqrt | cosine


@dataclass
class MixSourceConfig:
    path: str = MISSING                 # a prepared dataset dir, a Megatron prefix, or a flat token file
    weight: float = 1.0                 # relative share of the sequences drawn from this source
    name: Optional[str] = None          # metrics key tokens/<name>; null = the path's base name


@dataclass
class DataConfig:
    name: str = MISSING                     # the corpus option; set by the group option (data=<name>)
    seq_len: int = 128                      # tokens per training sequence
    source: OneOf[SOURCES] = MISSING        # the reader (framework/data/sources.py) the option uses
    path: Optional[str] = None          # text file; token file or prepared dataset dir; Megatron .bin/.idx prefix
    dtype: OneOf[TOKEN_DTYPES] = "uint16"   # flat token files (dataset dirs and Megatron say their own)
    vocab_size: int = 256               # byte-level for pydoc and text; a prepared dataset's manifest sets it
    eos_id: Optional[int] = None        # from a prepared dataset's manifest
    tokenizer: Optional[str] = None     # bytes | a tokenizer.json; a prepared dataset's manifest sets it
    sources: list[MixSourceConfig] = field(default_factory=list)   # mix only
    val_fraction: float = 0.05              # share of the corpus held out for val_loss
    num_tokens: int = 1_000_000         # synthetic only
    # attention stays within each document and positions restart at its start (prepared data: its documents)
    document_mask: bool = False
    overlong: OneOf["split", "truncate"] = "split"   # packed instruction data: an example longer than a sequence
    # instruction data: examples packed whole into rows of seq_len; false: one example a row, truncated to
    # seq_len + 1 tokens and padded to its micro-batch's longest row, or to seq_len + 1 under trainer.compile
    # (TRL's packing=False; document_mask: false)
    packing: bool = True
    # jsonl, parquet, datasets, chat: tokenized at launch into a dataset under cache_dir (null: ~/.cache/framework)
    text_key: str = "text"              # the field / column holding a document's text (or a chat's messages)
    split: str = "train"                # datasets: the split to read
    chat_template: Optional[OneOf[TEMPLATES]] = None   # chat: null = the tokenizer's own; llama3 | chatml
    train_on: OneOf[TRAIN_ON] = "assistant"           # chat: the tokens trained (the rest masked from the loss)
    # preference: a prompt longer than this keeps its last max_prompt_length tokens (older TRL's rule; TRL 1.16 has
    # none); null = off. Then each sequence keeps its first seq_len + 1 tokens (TRL's max_length, keep-start)
    max_prompt_length: Optional[int] = None
    cache_dir: Optional[str] = None         # where prepared datasets are kept; null: ~/.cache/framework
    prepared: Optional[str] = None      # set by the launcher: the dataset dir the inputs were prepared into


@dataclass
class LoraConfig:
    """Parameter-efficient fine-tuning: adapters on the block linears, everything else frozen (models/lora.py)."""
    enabled: bool = False                   # train adapters instead of the whole model
    rank: int = 8                           # inner dimension of each adapter (A: rank x in, B: out x rank)
    alpha: float = 16.0                 # the adapter's output is scaled by alpha / rank
    dropout: float = 0.0                    # dropout on the adapter's input while training
    dora: bool = False                      # weight-decomposed LoRA: a trained magnitude per output row
    targets: list[str] = field(default_factory=list)   # linears whose names end so; empty = every block linear
    base_dtype: OneOf[BASE_DTYPES] = "float32"  # frozen adapted weights: float32 | bfloat16 | float8 | nf4 (QLoRA)


@dataclass
class ProfileConfig:
    steps: list[int] = field(default_factory=list)   # [first, last] step to trace (1-based); empty = off
    memory_snapshot: bool = False       # CUDA: also record the allocator history over those steps


@dataclass
class TrainerConfig:
    max_steps: int = 200                    # optimizer steps in the run (the LR schedule spans them)
    global_batch_size: int = 16             # sequences per optimizer step, over all data-parallel ranks
    micro_batch_size: Optional[int] = None  # null = global_batch_size / data-parallel degree (no accumulation)
    log_every: int = 10                     # steps between metrics records (metrics.jsonl, TensorBoard, stdout)
    eval_every: int = 100               # 0 = never; otherwise every N steps and at the end
    eval_batches: int = 2                   # batches per evaluation (val_loss)
    sample_every: int = 0               # 0 = never; otherwise log a continuation of sample_prompt every N steps
    # "" = start where a document of the data starts: after the tokenizer's BOS, else its end-of-text token (refused
    # on byte-level data, which holds neither)
    sample_prompt: str = ""
    sample_tokens: int = 32                 # tokens a text sample continues for
    grad_clip: float = 1.0              # 0 = no clipping (the norm is still measured)
    stop_at_step: Optional[int] = None  # end this run early (the schedule still spans max_steps); resume later
    on_nonfinite: OneOf["abort", "skip"] = "abort"   # what a NaN/inf loss or gradient does
    # what an out-of-memory error inside a training step does: abort, or halve the micro-batch on every rank
    # and run the step again (the global batch stays; at micro-batch 1 the job stops, naming what it lacked)
    on_oom: OneOf["abort", "retry"] = "abort"
    # [start, increment, samples] as Megatron's --rampup-batch-size: the global batch grows from `start` by
    # `increment` sequences over the first `samples` sequences, up to global_batch_size; null = no ramp
    rampup_batch_size: Optional[list[int]] = None
    progress_bar: bool = True               # a tqdm bar on rank 0 (false: plain log lines only)
    # Seconds without a finished step before every rank writes its stacks to <run dir>/stall/ and the job
    # fails; 0 = off. Below launcher.timeout_s, so a rank stuck outside a collective is caught (with
    # evidence) before its peers' collectives time out.
    stall_timeout_s: float = 900.0
    objective: str = "val_loss"         # the metric whose final value the run returns to a sweeper (Optuna)
    deterministic: bool = False             # GPU runs repeat exactly (slower kernels); CPU runs always do
    compile: bool = False                   # torch.compile each block (torch-native strategies); compile_time logged apart
    # trainer.compile's torch.compile backend: inductor (fused kernels), or aot_eager / eager, which trace the same
    # graphs without generating code (to tell whether a failure is inductor's, and to check composition cheaply)
    compile_backend: OneOf[COMPILE_BACKENDS] = "inductor"
    profile: ProfileConfig = field(default_factory=ProfileConfig)


@dataclass
class CheckpointConfig:
    enabled: bool = True                # save at the end, and every `interval` steps if > 0
    dir: Optional[str] = None           # a path or an fsspec URL (s3://bucket/prefix, gs://, az://); default: <run dir>/checkpoints
    interval: int = 0                       # steps between saves; 0 = only at the end
    resume: Optional[str] = None        # null | auto (newest complete in dir) | <path or URL of a step dir>
    keep_last: int = 2                      # complete checkpoints kept; older ones are deleted
    keep_best: int = 0                  # also keep this many with the best `score` (0 = off)
    score: str = "val_loss"             # the metric keep_best ranks by, as the step's metrics record names it
    score_mode: OneOf[SCORE_MODES] = "min"   # min: lower is better | max
    async_save: bool = False                # write in the background (torch-native strategies; `async` is a keyword)
    initial_load: Optional[str] = None  # a dir (or URL) of HF-layout safetensors to start the weights from
    # Seconds each attempt of an object-store request (a URL in checkpoint.dir, resume or initial_load) waits to
    # connect or for the next part of its answer, in the launcher and every worker; a request makes ATTEMPTS of them
    # (framework/storage/timeouts.py), so an endpoint that never answers fails the job after about that many times this.
    storage_timeout_s: float = STORAGE_TIMEOUT_S


@dataclass
class EvalConfig:
    """Benchmark scores inside the job (lm-evaluation-harness, the `eval` extra), beside val_loss."""
    # lm-eval task names: the shipped fw_pyfacts and fw_pytext, those of include_path, else lm-eval's own; empty = off
    tasks: list[str] = field(default_factory=list)
    limit: Optional[int] = None             # the first N documents of each task; null = all
    every: Optional[int] = None             # steps between evaluations (and at the end); null = trainer.eval_every
    include_path: list[str] = field(default_factory=list)   # folders of your own lm-eval task YAMLs
    apply_chat_template: bool = False       # render each prompt as a user turn in the chat template the job trains with


@dataclass
class RayConfig:
    """launcher.engine=ray: where the Ray cluster is and what each worker asks it for."""
    address: Optional[str] = None           # host:port or ray://host:10001; null = $RAY_ADDRESS, else start a local one
    resources_per_worker: dict[str, float] = field(default_factory=dict)   # e.g. {CPU: 8}; empty = Ray's default (1 CPU, + 1 GPU on GPUs)
    callbacks: list[str] = field(default_factory=list)   # import paths of ray.train.UserCallback classes for the run


@dataclass
class LauncherConfig:
    engine: OneOf[ENGINES] = "torch"        # torch: workers here (spawned, or under torchrun/SLURM/Kubeflow) | ray: a Ray Train job
    ray: RayConfig = field(default_factory=RayConfig)
    nproc_per_node: Optional[int] = None    # null = what the strategy's degrees need; under Ray: the number of Ray workers
    max_restarts: int = 0                   # restarts of the worker group after a failure, each from the newest checkpoint
    monitor_interval: float = 0.1           # seconds between the elastic agent's checks of its workers
    # Modules the fork server imports once for all workers besides those the job needs (a sweep that mixes
    # strategies or model families: their union, so that its server starts once, not again at each new one).
    preload: list[str] = field(default_factory=list)
    backend: Optional[str] = None           # null = nccl on CUDA (plus gloo when offloading), gloo otherwise
    # Seconds a collective waits for a peer that died or hangs before it raises on every rank. The elastic
    # agent then restarts the group or gives up. Generous enough for a first DeepSpeed op build or a large
    # checkpoint on a slow disk; lower it to fail faster.
    timeout_s: float = 1200.0
    # Signals that stop the run after the current step with a checkpoint and exit code 143 (requeue me).
    # SLURM's and Kubernetes' SIGTERM, `sbatch --signal` USR1, submitit's USR2.
    preempt_signals: list[str] = field(default_factory=lambda: ["SIGTERM", "SIGUSR1", "SIGUSR2"])
    # Seconds the launcher's elastic agent gives workers, after passing a signal on, before it SIGKILLs
    # them (torch's own default is 30 s). They finish their step, vote, save and exit in it. Sized for the
    # llama3_8b recipe's preemption save (docs/how-to/preemption.md); a larger model or slower disk needs more.
    stop_grace_s: float = 180.0


@dataclass
class LoggingConfig:
    # where metrics go besides metrics.jsonl (always written): any of framework/metrics/trackers' TRACKERS
    trackers: list[str] = field(default_factory=lambda: ["tensorboard"])
    tracker_errors: OneOf["fail", "warn"] = "fail"   # a tracker unreachable at start: exit 2, or warn and go on
    experiment: str = "framework"           # MLflow experiment / W&B project
    run_name: Optional[str] = None          # null = the run dir's name (a sweep point: <sweep dir>-<n>)
    mlflow_tracking_uri: Optional[str] = None   # null = MLFLOW_TRACKING_URI
    # Seconds a tracker's server may hold the job: its check before launch, its start on rank 0 and the drain of
    # its queue at the end each wait at most this long (the steps never wait: records go through a queue)
    tracker_timeout_s: float = 60.0
    gpu_health: bool = True                 # NVML (nvidia-ml-py) readings of each rank's GPU in every record
    peak_flops: Optional[float] = None      # per device; null = look up the device
    cpu_peak_flops: float = 3.0e11          # what MFU is measured against on CPU


@dataclass
class PlannerConfig:
    # h100 | h100_96gb | h100_pcie | h200 | a100_40gb | a100_80gb | b200 | mi300x | cpu; null = detected
    device: Optional[str] = None
    nodes: int = 1                          # nodes to plan for (python -m framework.plan)
    gpus_per_node: Optional[int] = None  # null = launcher.nproc_per_node, else the world on a CPU, else 8 for a GPU
    check: bool = True                  # refuse (exit 2) a job the plan says cannot fit the device
    time_on_device: bool = True         # python -m framework.plan on a GPU: time the job's blocks there


@dataclass
class Config:
    parallel: Any = MISSING
    zero: ZeroConfig = MISSING
    precision: PrecisionConfig = MISSING
    activation_checkpointing: ActivationCheckpointingConfig = MISSING
    model: Any = MISSING
    optimizer: Any = MISSING
    scheduler: SchedulerConfig = MISSING
    data: DataConfig = MISSING
    objective: Any = MISSING     # what the job trains toward (framework/objectives); a group option names it
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    seed: int = 0                       # initial weights and every step's batches follow from it
    device: OneOf["auto", "cpu", "cuda"] = "auto"   # auto = cuda where a GPU is visible, else cpu
