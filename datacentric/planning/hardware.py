"""Named hardware presets for the analytic cost model.

A :class:`Hardware` holds the few constants the analytic model needs: peak dense
matmul rate, device memory and its bandwidth, the per-device bandwidth of the
intra-node (NVLink) and inter-node (InfiniBand) networks, and *efficiency
factors*, the fraction of each peak that a training step reaches in practice.
Peaks come from public datasheets (named beside each number); efficiency factors
are approximate, stated with their reasoning, and are the knobs a calibration
fits (:func:`calibrate_hardware`).

``cpu-local`` describes this machine; its constants are fitted from measured
points and stored in ``cpu_local.json`` next to this file (regenerate with
``python -m datacentric.profiling.cpu_calibration``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from datacentric.planning.lsq import nonnegative_least_squares
from datacentric.regular_files import read_json_file

GB = 10**9
GIB = 2**30


def gib_to_bytes(gib: float | None) -> int | None:
    """``gib`` GiB in bytes (``None`` stays ``None``): the one place a cap given in GiB
    becomes bytes."""
    return None if gib is None else int(gib * GIB)


def gib_text(size_bytes: int) -> str:
    """``size_bytes`` in GiB to two significant digits, never as zero (``0.0010``,
    ``0.040``, ``1.5``, ``120``), as the planner and the check before ranks start print it."""
    gib = float(f"{size_bytes / GIB:.2g}")  # two significant digits, then no exponent
    if gib <= 0:
        return "0"
    digits = max(0, 1 - math.floor(math.log10(gib)))
    return f"{gib:.{digits}f}"


CPU_LOCAL_JSON = Path(__file__).with_name("cpu_local.json")
H200_SXM_JSON = Path(__file__).with_name("h200_sxm.json")
#: Attention paths the analytic model prices (``Hardware.attention_path``).
ATTENTION_PATHS = ("varlen", "sdpa-per-sample")


@dataclass(frozen=True, kw_only=True)
class Hardware:
    """Per-device constants of one accelerator type and its networks."""

    name: str
    """Preset name (``h100-sxm``, ...)."""
    gpus_per_node: int
    """Devices per node; SP groups larger than this cross the inter-node network."""
    peak_flops: float
    """Dense matmul peak in FLOP/s at the training dtype (bf16 on GPUs, fp32 on CPU)."""
    memory_bytes: int
    """Device memory per rank in bytes (HBM, or host RAM for ``cpu-local``)."""
    memory_bandwidth: float
    """Device memory bandwidth in bytes/s."""
    intra_node_bandwidth: float
    """Per-device, one-direction bandwidth inside a node in bytes/s (NVLink)."""
    inter_node_bandwidth: float
    """Per-device, one-direction bandwidth across nodes in bytes/s (InfiniBand)."""
    matmul_efficiency: float
    """Fraction of ``peak_flops`` that large linear layers reach (approximate)."""
    attention_efficiency: float
    """Fraction of ``peak_flops`` that fused attention kernels reach (approximate)."""
    memory_efficiency: float
    """Fraction of ``memory_bandwidth`` that element-wise kernels reach (approximate)."""
    network_efficiency: float
    """Fraction of link bandwidth that all-to-all and all-reduce reach (approximate)."""
    collective_latency_s: float
    """Fixed cost of one collective call in seconds (approximate)."""
    block_overhead_s: float
    """Fixed cost of one block's forward pass (kernel launches, Python) in seconds."""
    half_efficiency_tokens: float = 0.0
    """Tokens per rank of a pass at which matmul efficiency is half of
    ``matmul_efficiency`` (small GEMMs under-fill the device); 0 disables."""
    attention_path: str = "varlen"
    """Attention kernel the runtime uses: ``varlen`` (one kernel over all segments of a
    micro-batch) or ``sdpa-per-sample`` (one SDPA call per segment)."""
    attention_backward_efficiency: float = 0.0
    """Fraction of ``peak_flops`` attention's backward reaches; 0: ``attention_efficiency``."""
    segment_overhead_s: float = 0.0
    """Per-sample SDPA path: seconds per segment and attention pass (forward, recomputed
    forward, or each of backward's two units)."""
    segment_copy_s_per_byte: float = 0.0
    """Per-sample SDPA path: seconds per byte of the full-size gradient copy each
    segment's slice backward writes (``segments x tokens x (q + k + v)`` per backward)."""
    varlen_segment_overhead_s: float = 0.0
    """Varlen path: seconds per segment and attention pass."""
    scatter_s_per_element: float = 0.0
    """Seconds per element of a per-sample row's backward scatter-add, serialised along
    the sample (DiT modulation gathered per token; see ``ModelSpec.per_token_modulation``)."""
    modulation_s_per_element: float = 0.0
    """Seconds per element of per-token modulation traffic (gather, modulate, gate)."""
    recompute_overhead_s: float = 0.0
    """Fixed seconds each recomputed block adds beyond its forward (checkpoint bookkeeping)."""
    op_launch_s: float = 0.0
    """Seconds per operator launched outside the blocks (``ModelSpec.outer_ops``)."""
    ring_overlap: float = 0.8
    """Share of a ring step's attention compute its K/V transfer hides behind (1: perfect
    overlap). Conservative by default: a measured hybrid ring pass calibrates it."""
    source: str = ""
    """Where the numbers come from."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.ring_overlap <= 1.0:
            raise ValueError(
                f"{self.name}: ring_overlap must be in [0, 1], got {self.ring_overlap}"
            )
        if self.attention_path not in ATTENTION_PATHS:
            raise ValueError(
                f"{self.name}: attention_path must be one of {ATTENTION_PATHS}, "
                f"got {self.attention_path!r}"
            )

    def seconds_per_unit(self) -> np.ndarray:
        """Seconds per unit of each entry of ``Work.as_array`` (the analytic model's time
        is a dot product of its work with this vector): matmul FLOP, attention forward
        FLOP, memory byte, NVLink byte, InfiniBand byte, collective call, block pass,
        attention backward FLOP, segment pass, segment-copy byte, scattered element,
        modulation element, recomputed block, outer operator."""
        backward_eff = self.attention_backward_efficiency or self.attention_efficiency
        per_sample = self.attention_path == "sdpa-per-sample"
        return np.array(
            [
                1.0 / (self.peak_flops * self.matmul_efficiency),
                1.0 / (self.peak_flops * self.attention_efficiency),
                1.0 / (self.memory_bandwidth * self.memory_efficiency),
                1.0 / (self.intra_node_bandwidth * self.network_efficiency),
                1.0 / (self.inter_node_bandwidth * self.network_efficiency),
                self.collective_latency_s,
                self.block_overhead_s,
                1.0 / (self.peak_flops * backward_eff),
                self.segment_overhead_s if per_sample else self.varlen_segment_overhead_s,
                self.segment_copy_s_per_byte if per_sample else 0.0,
                self.scatter_s_per_element,
                self.modulation_s_per_element,
                self.recompute_overhead_s,
                self.op_launch_s,
            ]
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Hardware:
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown hardware fields {sorted(unknown)}")
        return cls(**d)


def _h100_datasheet() -> Hardware:
    return Hardware(
        name="h100-sxm",
        gpus_per_node=8,  # DGX/HGX H100: 8 GPUs per node
        # NVIDIA H100 Tensor Core GPU datasheet (SXM): BF16 1,979 TFLOPS *with
        # sparsity*, i.e. 989.5 TFLOPS dense.
        peak_flops=989.5e12,
        memory_bytes=80 * GB,  # datasheet: 80 GB HBM3
        memory_bandwidth=3.35e12,  # datasheet: 3.35 TB/s
        # datasheet: NVLink 900 GB/s per GPU, total of both directions -> 450 GB/s each way.
        intra_node_bandwidth=450e9,
        # DGX H100 user guide: 8x ConnectX-7 400 Gb/s InfiniBand per node, one per GPU
        # -> 50 GB/s per GPU each way.
        inter_node_bandwidth=50e9,
        # Approximate: Megatron-LM/torchtitan report 40-55% MFU for dense transformer
        # training on H100 in bf16; we use 0.5 for large GEMMs.
        matmul_efficiency=0.50,
        # Approximate: FlashAttention-2 forward+backward reaches ~35-45% of H100 peak
        # (FlashAttention-3 paper, Dao et al. 2024, baseline figures).
        attention_efficiency=0.40,
        memory_efficiency=0.70,  # approximate: element-wise kernels at ~70% of HBM peak
        # Approximate: NCCL all-to-all/all-reduce bus bandwidth ~70-80% of link peak
        # (nccl-tests results published for DGX H100).
        network_efficiency=0.75,
        collective_latency_s=20e-6,  # approximate NCCL small-message latency inside a node
        block_overhead_s=100e-6,  # approximate: ~20 kernel launches of ~5 us per block
        half_efficiency_tokens=512.0,  # approximate: GEMMs with M < ~1k rows under-fill 132 SMs
        source="NVIDIA H100 datasheet; DGX H100 user guide; efficiencies approximate",
    )


def _h200_datasheet() -> Hardware:
    h100 = _h100_datasheet()
    return replace(
        h100,
        name="h200-sxm",
        # NVIDIA H200 datasheet (SXM): same Hopper compute as H100 SXM, BF16 1,979
        # TFLOPS with sparsity (989.5 dense).
        peak_flops=989.5e12,
        memory_bytes=141 * GB,  # datasheet: 141 GB HBM3e
        memory_bandwidth=4.8e12,  # datasheet: 4.8 TB/s
        intra_node_bandwidth=450e9,  # datasheet: NVLink 900 GB/s total per GPU
        inter_node_bandwidth=50e9,  # DGX H200: 8x ConnectX-7 400 Gb/s, one per GPU
        # measured on one H200: attention alone over 228 segments of 144 tokens (24 heads
        # of 64, bf16) took 2.5 ms forward + backward with torch's varlen_attn; a segment
        # pass (forward, or half of backward) is at most 2.5 ms / 228 / 3 (FLOPs included)
        varlen_segment_overhead_s=2.5e-3 / 228 / 3,
        source="NVIDIA H200 datasheet; DGX H200 user guide; efficiencies as h100-sxm",
    )


def load_hardware_file(path: str | Path) -> Hardware:
    """The hardware stored at ``path`` (a ``{"hardware": {...}}`` file, as
    ``datacentric calibrate --out`` and ``python -m datacentric.profiling.cpu_calibration``
    write)."""
    data = read_json_file(path)  # one line naming the file: not JSON, a FIFO, ...
    try:
        return Hardware.from_json(data["hardware"])
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise ValueError(f"{path}: not a hardware file ({err})") from err


def load_cpu_local(path: str | Path = CPU_LOCAL_JSON) -> Hardware:
    """The calibrated ``cpu-local`` preset stored at ``path``."""
    if not Path(path).exists():
        raise FileNotFoundError(
            f"{path}: no cpu-local calibration; run "
            "`python -m datacentric.profiling.cpu_calibration`"
        )
    return load_hardware_file(path)


def datasheet_hardware(name: str) -> Hardware:
    """``h100-sxm`` or ``h200-sxm`` from datasheet peaks and approximate efficiencies
    (the starting point of ``datacentric calibrate``)."""
    makers = {"h100-sxm": _h100_datasheet, "h200-sxm": _h200_datasheet}
    if name not in makers:
        raise KeyError(f"no datasheet preset {name!r}; choose one of {sorted(makers)}")
    return makers[name]()


#: Rates bound by memory bandwidth (they scale with it between devices).
MEMORY_BOUND_RATES = (
    "segment_copy_s_per_byte",
    "scatter_s_per_element",
    "modulation_s_per_element",
)


def scaled_to(calibrated: Hardware, name: str) -> Hardware:
    """``calibrated`` carried over to the device ``name`` by the ratio of datasheet
    peaks: efficiencies and fixed overheads are kept (same Hopper compute and software),
    memory-bound rates scale with ``memory_bandwidth``. Approximate: no measurement of
    ``name`` enters."""
    target = datasheet_hardware(name)
    ratio = calibrated.memory_bandwidth / target.memory_bandwidth
    peaks = {
        f: getattr(target, f)
        for f in (
            "gpus_per_node",
            "peak_flops",
            "memory_bytes",
            "memory_bandwidth",
            "intra_node_bandwidth",
            "inter_node_bandwidth",
        )
    }
    scaled = {f: getattr(calibrated, f) * ratio for f in MEMORY_BOUND_RATES}
    return replace(
        calibrated,
        name=name,
        **peaks,
        **scaled,
        source=f"{calibrated.name} calibration scaled by datasheet peaks ({target.source})",
    )


def _h200_sxm() -> Hardware:
    return load_hardware_file(H200_SXM_JSON)


def _h100_sxm() -> Hardware:
    return scaled_to(_h200_sxm(), "h100-sxm")


_PRESETS = {"h100-sxm": _h100_sxm, "h200-sxm": _h200_sxm, "cpu-local": load_cpu_local}


def list_hardware() -> list[str]:
    """Names of the hardware presets."""
    return sorted(_PRESETS)


@cache
def get_hardware(name: str) -> Hardware:
    """The hardware preset called ``name``."""
    try:
        factory = _PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown hardware {name!r}; choose one of {list_hardware()}") from None
    return factory()


def resolve_hardware(hardware: str | Hardware) -> Hardware:
    """A preset name, a ``.json`` file ``datacentric calibrate --out`` wrote, or constants."""
    if isinstance(hardware, Hardware):
        return hardware
    if hardware.endswith(".json"):
        return load_hardware_file(hardware)
    return get_hardware(hardware)


# --- calibration -----------------------------------------------------------------------------


@dataclass(frozen=True)
class CalibrationPoint:
    """One measured pass, decomposed into the work the analytic model charges for.

    ``matmul_flops`` should already be divided by the matmul efficiency curve's
    saturation factor when ``half_efficiency_tokens`` is used (the analytic model's
    :meth:`~datacentric.planning.analytic.AnalyticCostModel.work` does this).
    """

    matmul_flops: float
    attention_flops: float
    memory_bytes: float
    network_bytes: float
    collectives: int
    block_passes: int
    seconds: float


CALIBRATION_COLUMNS = (
    "matmul_flops",
    "attention_flops",
    "memory_bytes",
    "network_bytes",
    "collectives",
    "block_passes",
)
DEFAULT_FIT_COLUMNS = (
    "matmul_flops",
    "attention_flops",
    "network_bytes",
    "collectives",
    "block_passes",
)
MAX_EFFICIENCY = 1e3  # a fitted rate of zero seconds per unit: "free", capped to stay finite


def calibrate_hardware(
    base: Hardware,
    points: Sequence[CalibrationPoint],
    *,
    name: str | None = None,
    fit_columns: Sequence[str] = DEFAULT_FIT_COLUMNS,
) -> Hardware:
    """Fit ``base``'s efficiency and overhead constants to measured points.

    Solves ``seconds ~ a*matmul_flops + b*attention_flops + c*memory_bytes +
    d*network_bytes + e*collectives + f*block_passes`` for the coefficients of
    ``fit_columns`` by non-negative least squares on *relative* error (each row divided
    by its measured time, so short and long passes count alike); the other columns keep
    ``base``'s constants and their predicted seconds are subtracted first. Element-wise
    traffic (``memory_bytes``) is not fitted by default: it grows with tokens exactly as
    linear-layer FLOPs do, so the two cannot be told apart and the matmul rate absorbs
    it. Peaks are kept; efficiencies become ``1/(coef*peak)`` (a zero coefficient maps to
    ``MAX_EFFICIENCY``). A fitted column that is zero in every point keeps ``base``.
    """
    unknown = set(fit_columns) - set(CALIBRATION_COLUMNS)
    if unknown:
        raise ValueError(f"unknown calibration columns {sorted(unknown)}")
    if len(points) < 2:
        raise ValueError(f"calibration needs at least 2 measured points, got {len(points)}")
    feats = np.array(
        [[float(getattr(p, c)) for c in CALIBRATION_COLUMNS] for p in points], dtype=float
    )
    secs = np.array([p.seconds for p in points], dtype=float)
    if np.any(secs <= 0):
        raise ValueError("calibration points need positive measured seconds")
    # the first seven rates, less the inter-node one (calibration has no such column)
    rates = np.delete(base.seconds_per_unit()[:7], 4)
    fit = [i for i, c in enumerate(CALIBRATION_COLUMNS) if c in fit_columns]
    fixed = [i for i in range(len(CALIBRATION_COLUMNS)) if i not in fit]
    target = secs - feats[:, fixed] @ rates[fixed]
    used = [i for i in fit if feats[:, i].max() > 0]
    scale = feats[:, used].max(axis=0)
    rows = feats[:, used] / scale / secs[:, None]
    coef = rates.copy()
    coef[used] = nonnegative_least_squares(rows, target / secs) / scale

    def eff(value: float, peak: float) -> float:
        return MAX_EFFICIENCY if value <= 0 else float(min(1.0 / (value * peak), MAX_EFFICIENCY))

    return replace(
        base,
        name=name or base.name,
        matmul_efficiency=eff(coef[0], base.peak_flops),
        attention_efficiency=eff(coef[1], base.peak_flops),
        memory_efficiency=eff(coef[2], base.memory_bandwidth),
        network_efficiency=eff(coef[3], base.intra_node_bandwidth),
        collective_latency_s=float(coef[4]),
        block_overhead_s=float(coef[5]),
    )
