"""Profiles on disk: JSON with a fingerprint of everything that changes the numbers.

A profile is valid only for the model configuration, device, torch version, world
size and dtype it was measured with; :func:`fingerprint` collects them and
:func:`load_profile` checks them. A missing or stale profile is re-measured by the
caller (:func:`~datacentric.profiling.autoprofile.ensure_profile`); a corrupt one is
a :class:`ProfileError` that names the file and what is wrong with it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from datacentric.log import get_logger
from datacentric.planning.fitted import ProfilePoint
from datacentric.planning.plan import Plan
from datacentric.planning.spec_derivation import identity_of_model, json_sha256

if TYPE_CHECKING:
    from torch import nn

FORMAT_VERSION = 1
PROFILE_FILE = "profile.json"
PLAN_FILE = "plan.json"
PROBE_FILE = "probe.json"


class ProfileError(ValueError):
    """A profile file that exists but cannot be used (corrupt or of another format)."""


@dataclass(frozen=True)
class Profile:
    """Measured dual-layer profile points of one model on one device and world."""

    fingerprint: dict[str, Any]
    model: str
    num_blocks: int
    attention_kind: str
    points: tuple[ProfilePoint, ...]
    gpus_per_node: int
    grad_sync_seconds: dict[int, float] = field(default_factory=dict)
    profile_seconds: float = 0.0
    validation: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "fingerprint": self.fingerprint,
            "fingerprint_sha256": json_sha256(self.fingerprint),
            "model": self.model,
            "num_blocks": self.num_blocks,
            "attention_kind": self.attention_kind,
            "gpus_per_node": self.gpus_per_node,
            "grad_sync_seconds": {str(k): v for k, v in self.grad_sync_seconds.items()},
            "profile_seconds": self.profile_seconds,
            "validation": self.validation,
            "points": [p.to_json() for p in self.points],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Profile:
        if d.get("format") != FORMAT_VERSION:
            raise ProfileError(f"format {d.get('format')!r}, expected {FORMAT_VERSION}")
        if d.get("fingerprint_sha256") != json_sha256(d["fingerprint"]):
            raise ProfileError("fingerprint does not match its checksum (edited or damaged)")
        return cls(
            fingerprint=dict(d["fingerprint"]),
            model=str(d["model"]),
            num_blocks=int(d["num_blocks"]),
            attention_kind=str(d["attention_kind"]),
            points=tuple(ProfilePoint.from_json(p) for p in d["points"]),
            gpus_per_node=int(d["gpus_per_node"]),
            grad_sync_seconds={int(k): float(v) for k, v in d["grad_sync_seconds"].items()},
            profile_seconds=float(d["profile_seconds"]),
            validation=d.get("validation"),
        )


def device_name(backend: str) -> tuple[str, str]:
    """(device type, device name) that ranks of ``backend`` compute on."""
    import torch

    if "nccl" in backend.lower() and torch.cuda.is_available():  # pragma: no cover - GPU
        return "cuda", torch.cuda.get_device_name(0)
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return "cpu", f"{name} x{os.cpu_count()}"


#: How the profiler measures (bumped when its method changes: 2 runs every case on every
#: rank at once); a profile of another method is stale.
PROFILER_METHOD = 2
#: The method of a ``bfloat16`` profile: 3 measures the run as it trains, float32
#: weights under bfloat16 autocast (2 held bfloat16 weights: half the state bytes, no
#: casts). A ``float32`` profile is measured as under 2 and stays fresh.
BFLOAT16_PROFILER_METHOD = 3


def fingerprint(
    model: str,
    world_size: int,
    dtype: str,
    backend: str,
    model_args: dict[str, Any] | None = None,
    *,
    identity: Mapping[str, Any] | None = None,
    ranks_per_node: int | None = None,
) -> dict[str, Any]:
    """What a profile's numbers depend on: model config (a preset's fields, or any
    other model's ``identity``: its class, config and parameter shapes as the caller
    read them once, off the model it built or by :func:`model_identity`), device,
    torch, world, its ranks on each node (``ranks_per_node``; None: the whole world on
    one machine, as a spawn starts it), dtype and the profiler's method: a profile
    measured on 1 node of 4 ranks is not reused on 2 nodes of 2, whose groups of 4
    cross nodes."""
    import torch

    from datacentric.models.configs import MODEL_PRESETS, model_config

    if model in MODEL_PRESETS:
        config = model_config(model, **(model_args or {}))
        described = {"class": type(config).__name__, **dataclasses.asdict(config)}
    elif identity is None:
        raise ValueError(f"a profile of {model!r} needs its identity (model_identity)")
    else:
        described = dict(identity)
    device_type, name = device_name(backend)
    return {
        "model": model,
        "model_config": described,
        "device_type": device_type,
        "device_name": name,
        "torch": torch.__version__,
        "world_size": world_size,
        "ranks_per_node": world_size if ranks_per_node is None else ranks_per_node,
        "dtype": dtype,
        "backend": backend,
        "profiler_method": BFLOAT16_PROFILER_METHOD if dtype == "bfloat16" else PROFILER_METHOD,
    }


def save_profile(profile: Profile, directory: str | os.PathLike[str]) -> Path:
    """Write ``profile.json`` into ``directory`` atomically; returns its path."""
    return _write_json(Path(directory) / PROFILE_FILE, profile.to_json())


def load_profile(directory: str | os.PathLike[str]) -> Profile | None:
    """The profile in ``directory``; ``None`` if there is none; :class:`ProfileError`
    if the file is corrupt or cannot be read (a folder, no permission)."""
    path = Path(directory) / PROFILE_FILE
    if not path.exists():
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        return Profile.from_json(data)
    except ProfileError as err:
        raise ProfileError(f"{path}: corrupt profile: {err}; delete it to re-profile") from err
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as err:
        raise ProfileError(
            f"{path}: corrupt profile ({type(err).__name__}: {err}); delete it to re-profile"
        ) from err
    except OSError as err:  # a folder of that name, or unreadable: one line, every rank
        raise ProfileError(
            f"{path}: cannot read the profile ({err.strerror or err}); make it a readable "
            "file or remove it to re-profile"
        ) from err


def fresh_profile(
    directory: str | os.PathLike[str], current: dict[str, Any]
) -> tuple[Profile | None, float]:
    """The profile in ``directory`` if its fingerprint is ``current`` (else ``None``:
    none, or stale: measured for another model, device, torch, world, node size, dtype or
    method), and when it was last measured or probed (:func:`last_checked`; 0 without
    a fresh one), read together: what a caller needs to decide on reuse."""
    checked = last_checked(directory)
    saved = load_profile(directory)
    if saved is None:
        return None, 0.0
    if saved.fingerprint != current:
        # measured with another number of ranks per node (its groups crossed other nodes)
        was, now = saved.fingerprint.get("ranks_per_node"), current.get("ranks_per_node")
        if now is not None and was != now:
            had = "an unrecorded number of" if was is None else str(was)
            get_logger().warning(
                f"datacentric: the profile in {directory} was measured with {had} ranks per "
                f"node and this run has {now}: measuring it again"
            )
        return None, 0.0
    return saved, checked


def save_probe(directory: str | os.PathLike[str], worst_rel_diff: float) -> Path:
    """Record that the profile in ``directory`` was checked now (``probe.json``)."""
    data = {"checked_unix": time.time(), "worst_rel_diff": worst_rel_diff}
    return _write_json(Path(directory) / PROBE_FILE, data)


def last_checked(directory: str | os.PathLike[str]) -> float:
    """When the profile in ``directory`` was last measured or probed (Unix seconds; 0
    when there is none or the probe record is unreadable)."""
    root = Path(directory)
    times = [0.0]
    if (root / PROFILE_FILE).exists():
        times.append((root / PROFILE_FILE).stat().st_mtime)
    try:
        with open(root / PROBE_FILE, encoding="utf-8") as handle:
            times.append(float(json.load(handle)["checked_unix"]))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return max(times)


def save_plan(plan: Plan, fingerprint_: dict[str, Any], directory: str | os.PathLike[str]) -> Path:
    """Write ``plan.json`` (the plan and the profile fingerprint it came from)."""
    data = {"fingerprint": fingerprint_, "plan": plan.to_json()}
    return _write_json(Path(directory) / PLAN_FILE, data)


def load_plan(directory: str | os.PathLike[str]) -> Plan:
    """The plan saved in ``directory`` (:class:`ProfileError` if corrupt or missing)."""
    path = Path(directory) / PLAN_FILE
    try:
        with open(path, encoding="utf-8") as handle:
            return Plan.from_json(json.load(handle)["plan"])
    except FileNotFoundError:
        raise ProfileError(f"{path}: no saved plan (run `datacentric profile` first)") from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise ProfileError(f"{path}: corrupt plan ({type(err).__name__}: {err})") from err


def _write_json(path: Path, data: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=1)
    os.replace(tmp, path)
    return path


def model_identity(
    name: str, model_args: Mapping[str, Any] | None = None, *, module: nn.Module | None = None
) -> dict[str, Any] | None:
    """What a profile of the model ``name`` means depends on, the one place it is read:
    ``None`` for a preset (:func:`fingerprint` records its config's fields), else
    :func:`~datacentric.planning.spec_derivation.identity_of_model` of ``module`` (the
    model without its adapters, as the caller built it, on any device), or of the model
    built here on the meta device for a caller that has not built it."""
    from datacentric.models.configs import MODEL_PRESETS

    if name in MODEL_PRESETS:
        return None
    args = dict(model_args or {})
    if module is None:
        from datacentric.models.source import build_model_named

        module = build_model_named(name, args, device="meta")
    return identity_of_model(module, args)
