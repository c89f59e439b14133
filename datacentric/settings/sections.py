"""The sections of the settings schema: one typed ``kw_only`` dataclass per concern.

Sections follow torchtitan's layout: ``[job]``, ``[model]``, ``[data]``, ``[training]``,
``[parallelism]``, ``[checkpoint]``, ``[metrics]``, ``[profiling]`` (``torch.profiler``
traces, as in torchtitan), ``[cost]`` (the cost model and the cost profiler;
formerly ``[profiling]``, still read) and ``[scheduling]``. Each field's
docstring (the string right under it) is its help text; ranges live in the field
(:func:`~datacentric.settings.schema.setting`); choices are ``Literal`` types. This
module imports nothing heavy (no torch, none of our runtime), so ``datacentric --help``
and ``datacentric config --show`` stay fast and work where torch is missing.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Literal

from datacentric.settings.schema import setting

ShardMode = Literal["none", "ddp", "fsdp2"]
#: How model state can be held across ranks (see :mod:`datacentric.planning.sharding`).
SHARD_MODES: tuple[str, ...] = ("none", "ddp", "fsdp2")

DEFAULT_SHARD = "fsdp2"
"""The default: a model trained across ranks keeps only its share of the optimizer
state (Adam's 8-12 bytes per parameter dominate model state), so a model that does
not fit with replicated state (llama-7b on one H200 in bf16 needs 112 GB with it)
still plans and trains, and the gradient reduction overlaps the last backward. It is
what PyTorch recommends for large models (FSDP2); ``ddp`` keeps every rank's state
whole, as a single process does."""

DEFAULT_MEMORY_FRACTION = 0.7
"""Share of a device's memory the planner may use per rank when ``memory_gb`` is not
set: the rest is left to the allocator's fragmentation, the communication library's
buffers and what the memory model does not count. The one place this default is
written; :func:`datacentric.planning.memory_cap.resolve_memory_cap` applies it."""


def check_shard(mode: str, reshard_after_forward: bool) -> None:
    """Raise ``ValueError`` for a ``shard`` setting that cannot run."""
    if mode not in SHARD_MODES:
        raise ValueError(f"shard must be one of {', '.join(SHARD_MODES)}; got {mode!r}")
    if reshard_after_forward and mode != "fsdp2":
        raise ValueError("reshard_after_forward applies to shard 'fsdp2' only")


@dataclass(kw_only=True)
class JobConfig:
    out: str = "runs/train"
    """Output folder; a training run's holds its resolved config, metrics.jsonl,
    samples.jsonl, checkpoints and schedules."""
    seed: int = setting(0, ge=0)
    """Seed of model initialisation, data noise and the schedule."""
    overwrite: bool = False
    """Replace the run already in ``out`` (its checkpoints, logs and schedules) instead of
    refusing."""


@dataclass(kw_only=True)
class ModelConfig:
    model: str = "llama"
    """The model: a preset (``llama``, ``dit``, ...), ``hf:DIR_OR_NAME`` (a Hugging Face
    folder, pretrained weights loaded; or a tiny name such as ``hf:qwen2``),
    ``diffusers:DIR_OR_NAME`` or ``pkg.module:factory`` (docs/models.md)."""
    model_args: tuple[str, ...] = ()
    """Keyword arguments of the model, ``KEY=VALUE`` each (``--model-arg``, repeatable):
    config fields or the factory's parameters, checked against them."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Compute dtype (``bfloat16``: autocast on the ranks' device, CPU or CUDA)."""

    # Deprecated: ``config.model`` was the model's name before the settings were made of
    # sections; it is now this section, which still compares, hashes and reads as that
    # name (``config.model == "llama"``, ``":" in config.model``), with a warning.
    def _as_name(self) -> str:
        warnings.warn(
            "TrainConfig.model (flat settings) is the [model] section now; its name is "
            "settings.model.model",
            DeprecationWarning,
            stacklevel=3,
        )
        return self.model

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            return self._as_name() == other
        if type(other) is not type(self):
            return NotImplemented
        return (self.model, self.model_args, self.dtype) == (
            other.model,
            other.model_args,
            other.dtype,
        )

    def __hash__(self) -> int:
        return hash(self.model)

    def __contains__(self, part: str) -> bool:
        return part in self._as_name()

    def __str__(self) -> str:
        return self._as_name()

    def __format__(self, spec: str) -> str:
        return format(self._as_name(), spec)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or not hasattr(str, name):
            raise AttributeError(f"'ModelConfig' object has no attribute {name!r}")
        return getattr(self._as_name(), name)


@dataclass(kw_only=True)
class LoraConfig:
    """LoRA fine-tuning (docs/models.md, "LoRA"). Fields are named without the
    section's name (``settings.lora.rank``, ``[lora] rank``, ``--lora.rank``); their flat
    keys carry it (``lora_rank``, ``--lora-rank``)."""

    rank: int = setting(0, ge=0)
    """LoRA rank: 0 trains every parameter; above 0 the model is frozen and only
    ``peft`` LoRA adapters of this rank on ``targets`` train."""
    alpha: float | None = setting(None, gt=0)
    """LoRA scale numerator: an adapter adds ``alpha / rank`` times its product (unset:
    ``alpha = rank``)."""
    dropout: float = setting(0.0, ge=0)
    """Dropout on each adapter's input, in training mode only (as the model's own
    dropout outside attention)."""
    targets: str | None = None
    """Module names to adapt, comma separated, or ``all-linear`` (peft's shorthand: every
    linear layer but a transformers model's output head) (unset: the attention
    projections, ``q_proj,k_proj,v_proj,o_proj`` for transformers models and
    ``to_q,to_k,to_v,to_out.0`` for diffusers ones, ``wq,wk,wv,wo`` for our presets)."""


@dataclass(kw_only=True)
class DataConfig:
    dataset: str = "stdlib"
    """``stdlib``, a workload preset, ``jsonl:``/``parquet:``/``text:PATH_OR_GLOB``,
    ``hf-datasets:DIR``, ``latents:DIR`` or ``package.module:factory`` (docs/data.md)."""
    dataset_limit: int | None = setting(None, ge=1)
    """Use only the first N documents of the dataset (records or files, counted before
    long ones are chunked into samples; unset: all of it)."""
    max_tokens: int = setting(4096, ge=1)
    """Longest text sample in tokens; longer documents follow ``long_docs``."""
    tokenizer: str | None = None
    """Text datasets: a local ``tokenizer.json``, a folder saved with ``save_pretrained``
    (conversations need one, for its chat template), or ``bytes`` (UTF-8 bytes,
    vocabulary 256); unset: an ``hf:DIR`` model's own tokenizer (DIR), else bytes."""
    text_field: str = "text"
    """Text datasets: the JSON key or column holding each document's text."""
    long_docs: Literal["chunk", "truncate", "skip", "error"] = "chunk"
    """Documents longer than ``max_tokens``: split into near-equal chunks, truncate, skip
    or fail."""
    loss_on: Literal["assistant", "all"] | None = None
    """Which tokens carry loss: ``assistant`` (only the assistant's tokens of a
    conversation, as its chat template marks them) or ``all`` (unset: ``assistant`` for
    conversations, ``all`` for text)."""
    bucket_config: str | None = None
    """Latent datasets: Open-Sora-style bucket config, JSON (unset: every latent its own shape)."""


@dataclass(kw_only=True)
class ValidationConfig:
    """Validation during training: a held-out loss at chosen steps (docs/configuration.md,
    "Validation during training"); not the cost profiler's full-depth validation. Fields
    are named without the section's name (``[validation] every``, ``--validation.every``);
    their flat keys carry it (``validation_every``, ``--validation-every``)."""

    dataset: str | Any | None = None
    """Held-out samples: ``split=FRACTION`` (that share of the training set, drawn by the
    seed, never trained on) or any dataset ``--dataset`` takes, read with the ``[data]``
    settings; in Python, also a dataset object (unset: no validation)."""
    every: int | None = setting(None, ge=0)
    """Compute the held-out loss every K optimizer steps and after the last one (unset:
    after the last step only; 0: never, the ``split`` samples stay held out)."""
    limit: int | None = setting(None, ge=1)
    """Use only the first N held-out samples (unset: all of them)."""
    prompts: str | None = None
    """A file of prompts, one per line or JSON lines with per-prompt ``max_new_tokens`` and
    ``temperature``: text models continue each at each validation (to
    ``validation/step-N.jsonl`` and the log); with ``pipeline``, diffusers models render
    each."""
    max_new_tokens: int = setting(32, ge=1)
    """Tokens generated per prompt."""
    temperature: float = setting(0.0, ge=0)
    """0: greedy decoding; above 0: sampling at this temperature, from a generator seeded
    by the seed, the step and the prompt (a rerun gives the same tokens)."""
    pipeline: str | None = None
    """diffusers models: a pipeline folder (``model_index.json``, its VAE, text encoders
    and scheduler) whose own pipeline class renders each prompt with the transformer being
    trained, to ``validation/step-N/PROMPT_ID.mp4`` (``.png`` for an image pipeline) and
    a contact sheet; needs ``prompts``."""
    height: int | None = setting(None, ge=1)
    """Rendered height in pixels (unset: the pipeline's default)."""
    width: int | None = setting(None, ge=1)
    """Rendered width in pixels (unset: the pipeline's default)."""
    num_frames: int | None = setting(None, ge=1)
    """Rendered frames of a video pipeline (unset: the pipeline's default)."""
    num_inference_steps: int | None = setting(None, ge=1)
    """Denoising steps per render (unset: the pipeline's default)."""
    guidance_scale: float | None = setting(None, ge=0)
    """Classifier-free guidance scale of a render (unset: the pipeline's default)."""
    true_cfg_scale: float | None = setting(None, ge=0)
    """Pipelines with a distilled guidance (Flux): the true classifier-free guidance scale
    a prompt's ``negative_prompt`` is used with, above 1 (unset: the pipeline's default)."""
    fps: int = setting(16, ge=1)
    """Frame rate of the rendered videos."""


def split_fraction(dataset: Any) -> float | None:
    """The share of the training set a ``[validation] dataset`` of ``split=FRACTION``
    holds out (``None``: another dataset, a dataset object, or none); raises
    ``ValueError`` for a fraction outside (0, 1)."""
    if not isinstance(dataset, str) or not dataset.startswith("split="):
        return None
    text = dataset.removeprefix("split=")
    try:
        fraction = float(text)
    except ValueError:
        fraction = -1.0
    if not 0.0 < fraction < 1.0:
        raise ValueError(
            f"validation.dataset: split= takes a fraction between 0 and 1 of the training "
            f"set to hold out (e.g. split=0.1), got {text!r}"
        )
    return fraction


@dataclass(kw_only=True)
class TrainingConfig:
    lr: float = setting(3e-3, gt=0)
    """Peak learning rate of AdamW."""
    weight_decay: float = setting(0.0, ge=0)
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW betas."""
    grad_clip: float = setting(1.0, ge=0)
    """Gradient clipping max norm (0: off); applied after the once-per-step gradient sync."""
    lr_schedule: Literal["constant", "cosine", "linear"] = "cosine"
    """Learning-rate schedule after the linear warm-up; its horizon is this command's step
    count (``cosine``: down to a tenth of the peak; ``linear``: down to 0 at the horizon,
    transformers' default)."""
    warmup_iterations: int = setting(2, ge=0)
    """Warm-up optimizer steps of the learning-rate schedule."""
    epochs: int = setting(1, ge=1)
    """Epochs over the dataset."""
    iterations: int | None = setting(None, ge=1)
    """Stop after this many optimizer steps counted from the run's start (unset: all epochs);
    set, it wins over ``epochs`` (a max_steps: the data repeats or stops early, with a note)."""
    lr_horizon: Literal["extend", "first"] = "extend"
    """Learning-rate horizon of a resumed run: ``extend``: this command's step count (its
    ``iterations``, else its ``epochs``), so a longer resume stretches the schedule;
    ``first``: the horizon the run started with (steps past it run at the minimum rate)."""
    compile: bool = False
    """Compile each transformer block's forward with ``torch.compile`` (inductor; the first
    steps pay the compilation, docs/runtime.md)."""
    caption_dropout: float = setting(0.0, ge=0)
    """Latent datasets: probability (0 to 1) that a sample trains on the pipeline's
    empty-prompt embedding instead of its caption's (for classifier-free guidance),
    drawn per sample and epoch from the sample's generator."""
    timestep_sampling: Literal["uniform", "logit_normal", "shift"] = "uniform"
    """Latent datasets: how the diffusion time ``t`` is drawn: ``uniform`` in [0, 1),
    ``logit_normal`` (the sigmoid of a normal of ``logit_mean``, ``logit_std``) or
    ``shift`` (a uniform ``u`` moved by ``flow_shift`` as the flow-matching schedulers
    do: ``shift * u / (1 + (shift - 1) * u)``)."""
    logit_mean: float = 0.0
    """Mean of the normal whose sigmoid is ``t`` (``timestep_sampling = logit_normal``)."""
    logit_std: float = setting(1.0, gt=0)
    """Its standard deviation (``timestep_sampling = logit_normal``)."""
    flow_shift: float = setting(1.0, gt=0)
    """The schedulers' ``shift`` (``timestep_sampling = shift``; 1 draws uniformly)."""
    fault_inject: str | None = None
    """Tests only: ``RANK:ITERATION`` kills that rank in that step (once per run folder);
    ``RANK:ITERATION:hang`` stalls it; ``RANK:ITERATION:term`` sends SIGTERM to its process
    group; ``RANK:STEP:stop`` SIGSTOPs it inside the checkpoint save of step STEP."""


@dataclass(kw_only=True)
class ParallelismConfig:
    world: int | None = setting(None, ge=1)
    """Local ranks to start (gloo on CPU, one GPU each with CUDA); unset: torchrun's ranks or one
    process."""
    collective_timeout_s: float = setting(300.0, gt=0)
    """Seconds a collective may wait before the run fails with the rank and operation named."""
    shard: ShardMode = DEFAULT_SHARD
    """How model state is held across ranks: ``none`` (plain module, one all-reduce after
    backward), ``ddp``, or ``fsdp2`` (optimizer state sharded); docs/runtime.md."""
    reshard_after_forward: bool = False
    """FSDP2: free gathered parameters after every forward (needs equal micro-batch counts)."""
    device: str | None = None
    """Device of a single process: ``cuda``, ``cuda:N`` or ``cpu`` (unset: cuda when available)."""


@dataclass(kw_only=True)
class CheckpointConfig:
    checkpoint_every: int = setting(500, ge=0)
    """Save a checkpoint every K optimizer steps (0: by wall time only, and at the end);
    with ``checkpoint_every_minutes``, whichever comes first."""
    checkpoint_every_minutes: float = setting(10.0, ge=0)
    """Also save once this many minutes of wall time have passed since the run started or
    last saved (0: by steps only), so an interruption loses at most that much work."""
    resume: bool = False
    """Continue the run in ``out`` from its newest valid checkpoint (a fresh start if it
    has none)."""
    resume_from: str | None = None
    """Continue from this checkpoint: a folder ``.../checkpoints/step-N`` or a step number of
    ``out``."""
    keep_last: int | None = setting(None, ge=1)
    """Keep only the newest N checkpoints (unset: keep all)."""
    keep_best: bool = False
    """Also keep the checkpoint of the step with the lowest validation loss when
    ``keep_last`` prunes (saved at that step: validate at checkpoint steps)."""
    expect_sha256: str | None = None
    """Use a checkpoint (to resume, inspect or export) only if its ``manifest.json`` has
    this SHA-256 (printed at save time and by ``datacentric inspect``); checked before
    anything else in it is read."""
    save_on_signal: bool = True
    """On SIGTERM/SIGINT, finish the step on every rank, save a checkpoint and exit with
    128+signal (preempted); off: stop at once without saving."""
    async_save: bool = False
    """Write each periodic checkpoint in the background
    (``torch.distributed.checkpoint.async_save``: the state is staged to CPU memory, then
    written while training goes on); its manifest and ``latest`` are written only once it
    has completed, at the next save or the end of the run. The final and SIGTERM saves
    stay synchronous."""


LogLevel = Literal["debug", "info", "warning", "error"]


@dataclass(kw_only=True)
class MetricsConfig:
    log_every: int = setting(10, ge=0)
    """Log one line every N optimizer steps (step, loss, grad norm, tokens/s, MFU, memory,
    data wait, estimated vs measured step time), and the run's first and last step; 0:
    none."""
    log_level: LogLevel = "info"
    """Level of the ``datacentric`` logger (``--quiet``: ``warning``, only problems)."""
    log_all_ranks: bool = False
    """Log from every rank (each line names its rank); default: rank 0 only."""
    progress: bool = True
    """Show a progress bar on rank 0 when the output is an interactive terminal."""
    timeline: bool = False
    """Record every rank's micro-batch start/duration per step in metrics.jsonl (one small gather
    per step)."""
    tensorboard: bool = True
    """Write TensorBoard scalars under ``<out>/tb`` when ``tensorboard`` is installed
    (``metrics.jsonl`` is always written)."""
    wandb: bool = False
    """Send the step records to Weights & Biases (the ``wandb`` extra)."""
    wandb_project: str = "datacentric"
    """Weights & Biases project of the run."""
    wandb_mode: Literal["online", "offline"] = "offline"
    """``offline``: W&B writes under ``<out>/wandb`` with no network (``wandb sync`` uploads
    it later); ``online``: it uploads as it runs."""
    plots: bool = True
    """At the end of a run, draw ``plots/*.png`` in the run folder: measured vs estimated
    step time, idle share and loss (needs matplotlib; ``datacentric plot RUN`` redraws)."""


@dataclass(kw_only=True)
class ProfilingConfig:
    """``torch.profiler`` traces of chosen steps (torchtitan's ``[profiling]``); the cost
    profiler's settings are in ``[cost]``."""

    trace_steps: tuple[int, ...] = ()
    """Optimizer steps (numbered from 1) to trace with ``torch.profiler``, e.g. ``3,4``: each
    is written to ``<out>/traces/step-N-rankR.json`` (Chrome trace: Perfetto, chrome://tracing;
    ranges named ``datacentric:`` mark each micro-batch, all-to-all, ring step and the
    gradient sync)."""
    trace_all_ranks: bool = False
    """Trace every rank (default: rank 0 only)."""
    memory_snapshot: bool = True
    """CUDA: also record the allocator's history over the traced steps and write
    ``<out>/traces/memory-step-N-rankR.pickle`` (pytorch.org/memory_viz); ignored on CPU."""


@dataclass(kw_only=True)
class CostConfig:
    """The ``[cost]`` section: the cost model, and how carefully the cost profiler measures
    (:class:`~datacentric.profiling.profiler.ProfileSettings` takes it as it is and adds
    the model, world, device and clock)."""

    cost_model: Literal["profile", "analytic"] = "profile"
    """``profile``: the dual-layer profile measured on this run's ranks (reused from
    ``profile_dir`` when its fingerprint matches); ``analytic``: FLOP/byte model."""
    profile_dir: str | None = None
    """Where the profile is kept (unset: ``<out>/profile``); share it between runs."""
    memory_gb: float | None = setting(None, gt=0)
    """Memory cap per rank in GiB for planning (unset: 70% of device memory; on the CPU, of
    this machine's memory shared by the ranks on it)."""
    warmup: int = 2
    """Unmeasured passes before the measured ones (at least 2: the first allocates
    gradients, the second measures memory)."""
    repeats: int = 3
    """Measured passes per case (the median is kept)."""
    threads_per_rank: int | None = 1
    """Intra-op threads of each rank (ranks share this machine's cores)."""
    timeout_s: float = 900.0
    """Give up when the ranks have not finished by then."""
    interleave: bool = True
    """Cycle the timed passes through all cases (robust to a changing machine load);
    keeps one model per depth in memory."""
