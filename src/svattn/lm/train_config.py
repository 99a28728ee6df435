"""One training run's settings: :class:`TrainConfig`, every field checked by name
when it is built, and :func:`apply_overrides`, ``svattn train``'s ``--set KEY=VALUE``
applied to a config mapping before :meth:`TrainConfig.from_dict`.

The model a config names is a preset of :mod:`svattn.lm.configs` with its mixer; its
optimiser settings are :class:`svattn.lm.loop.OptimConfig`'s.
"""

from __future__ import annotations

import copy
import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields

import torch

from svattn.lm.configs import PRESETS, mixer_config, preset
from svattn.lm.loop import OptimConfig
from svattn.lm.model import CharLM, CharLMConfig

__all__ = ["TrainConfig", "apply_overrides"]


@dataclass
class TrainConfig:
    """One training run. Load from JSON with :meth:`from_dict`.

    ``model`` is a preset name (``paper-3m``, ``10m``, ``tiny``); ``mixer`` and
    ``hybrid`` (options of the hybrid's memory; the ``sliding`` window is matched
    to them) pick the mixer; ``model_overrides`` change preset fields.
    """

    model: str = "tiny"
    mixer: str = "softmax"
    hybrid: dict = field(default_factory=dict)  # chunk, C, budget, policy, ...
    model_overrides: dict = field(default_factory=dict)  # e.g. {"block_size": 128}
    data: str | None = None  # enwik8 file (raw or .zip); None = the shipped slice
    out_dir: str = "runs/lm"
    seed: int = 0
    steps: int = 1000
    batch_size: int = 16  # global, over all ranks
    lr: float = 2e-3
    min_lr: float = 2e-4
    warmup: int = 100
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.99)
    grad_clip: float = 1.0
    # "auto" | "bf16" | "fp32" | "fp64" (float64 weights: for exactness checks, e.g. DDP)
    precision: str = "auto"
    device: str = "auto"  # "auto" | "cpu" | "cuda"
    threads: int = 0  # torch CPU threads (0: leave torch's default)
    log_every: int = 10
    eval_every: int = 0  # quick validation estimate every N steps (0: never)
    eval_batches: int = 8  # batches of that quick estimate
    ckpt_every: int = 0  # checkpoint every N steps (0: only at the end)
    final_eval: bool = True  # BPC on every byte of val and test at the end
    eval_batch_size: int = 32
    eval_max_bytes: int | None = None  # cap per split (None: every byte)
    progress: bool = True  # tqdm bar on rank 0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every field's type and range, naming the field.

        Raises
        ------
        ValueError
            ``"steps must be an int >= 1, got 'ten'"`` and the like.
        """
        for name, kind in _FIELD_KINDS.items():
            _check_field(name, getattr(self, name), kind)
        betas = self.betas
        if (not isinstance(betas, tuple | list) or len(betas) != 2
                or not all(_is_number(b) and 0 <= b < 1 for b in betas)):
            raise ValueError(f"betas must be two numbers in [0, 1), got {betas!r}")
        for name, allowed in _CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {list(allowed)}, got "
                                 f"{getattr(self, name)!r}")
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr ({self.min_lr}) must be <= lr ({self.lr})")

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        """Build from a dict, rejecting unknown keys and ill-typed values by name.

        Examples
        --------
        >>> TrainConfig.from_dict({"steps": "ten"})
        Traceback (most recent call last):
            ...
        ValueError: steps must be an int >= 1, got 'ten'
        """
        if not isinstance(d, dict):
            raise ValueError(f"a training config is a JSON object (a mapping of keys of "
                             f"TrainConfig), got a {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown training config keys {unknown}; known: {sorted(known)}")
        d = dict(d)
        if isinstance(d.get("betas"), list):
            d["betas"] = tuple(d["betas"])
        return cls(**d)

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> TrainConfig:
        """Read a JSON config file."""
        with open(path) as fh:
            return cls.from_dict(json.load(fh))

    def model_config(self) -> CharLMConfig:
        """The :class:`CharLMConfig` this run trains.

        Raises
        ------
        ValueError
            Naming the config key at fault (``model``, ``model_overrides``,
            ``mixer`` or ``hybrid``).
        """
        try:
            shape = preset(self.model, **self.model_overrides)
        except TypeError as exc:  # an unknown CharLMConfig field
            raise ValueError(f"model_overrides: {exc}") from None
        except ValueError as exc:
            key = "model" if self.model not in PRESETS else "model_overrides"
            raise ValueError(f"{key}: {exc}") from None
        return mixer_config(shape, self.mixer, self.hybrid)

    def check_model(self) -> CharLMConfig:
        """:meth:`model_config`, and build the model once on the meta device, so that
        bad mixer options fail here (naming ``hybrid``) before a run starts.

        Returns
        -------
        CharLMConfig
        """
        mcfg = self.model_config()
        key = "hybrid" if self.mixer == "hybrid_sv" else "model_overrides"
        try:
            with torch.device("meta"):
                CharLM(mcfg)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{key}: {exc}") from None
        return mcfg

    def optim_config(self) -> OptimConfig:
        """The run's AdamW, schedule and clipping (:mod:`svattn.lm.loop`)."""
        return OptimConfig(lr=self.lr, min_lr=self.min_lr, warmup=self.warmup, steps=self.steps,
                           weight_decay=self.weight_decay, betas=tuple(self.betas),
                           grad_clip=self.grad_clip)

    def to_dict(self) -> dict:
        """Plain-data form (JSON-serialisable)."""
        return asdict(self)


_FIELD_KINDS = {
    "model": "str", "mixer": "str", "hybrid": "dict", "model_overrides": "dict",
    "data": "str?", "out_dir": "str", "seed": "int>=0", "steps": "int>=1",
    "batch_size": "int>=1", "lr": "float>0", "min_lr": "float>=0", "warmup": "int>=0",
    "weight_decay": "float>=0", "grad_clip": "float>=0", "precision": "str", "device": "str",
    "threads": "int>=0", "log_every": "int>=1", "eval_every": "int>=0",
    "eval_batches": "int>=1", "ckpt_every": "int>=0", "final_eval": "bool",
    "eval_batch_size": "int>=1", "eval_max_bytes": "int>=1?", "progress": "bool",
}


_CHOICES = {"precision": ("auto", "bf16", "fp32", "fp64"), "device": ("auto", "cpu", "cuda")}


def _is_number(x) -> bool:
    return not isinstance(x, bool) and isinstance(x, int | float) and math.isfinite(x)


def _check_field(name: str, value, kind: str) -> None:
    if kind.endswith("?"):
        if value is None:
            return
        kind = kind[:-1]
    base, _, bound = kind.partition(">")
    ok = {
        "str": lambda v: isinstance(v, str),
        "dict": lambda v: isinstance(v, dict),
        "bool": lambda v: isinstance(v, bool),
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "float": _is_number,
    }[base](value)
    if ok and bound:  # ">=1", ">=0" or ">0"
        strict, limit = not bound.startswith("="), float(bound.lstrip("="))
        ok = value > limit if strict else value >= limit
    if not ok:
        what = {"str": "a string", "dict": "a mapping (JSON object)", "bool": "true or false",
                "int": "an int", "float": "a number"}[base]
        if bound:
            what += (" >= " if bound.startswith("=") else " > ") + bound.lstrip("=")
        what += " or null" if kind != _FIELD_KINDS[name] else ""
        raise ValueError(f"{name} must be {what}, got {value!r}")


def _merge(base: dict, extra: dict) -> dict:
    """``base`` with ``extra`` merged in key by key (mappings recursively); an empty
    mapping in ``extra`` replaces (empties) its key."""
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and v and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def apply_overrides(config: dict, items: Sequence[str]) -> dict:
    """The config with ``--set KEY=VALUE`` overrides applied, in order.

    VALUE is parsed as JSON, else taken as a string. A dotted KEY names an entry
    of a mapping (created if absent); a mapping VALUE merges into the existing
    mapping key by key; ``{}`` empties it.

    Parameters
    ----------
    config : dict
        The config file's mapping (not modified).
    items : sequence of str
        The ``KEY=VALUE`` texts.

    Returns
    -------
    dict

    Raises
    ------
    ValueError
        If an item is not ``KEY=VALUE`` or a dotted KEY runs through a value
        that is not a mapping.

    Examples
    --------
    >>> cfg = {"steps": 10, "hybrid": {"chunk": 64, "C": 0.0625, "budget": 64}}
    >>> apply_overrides(cfg, ['hybrid={"C": 0.1}', "steps=20"])
    {'steps': 20, 'hybrid': {'chunk': 64, 'C': 0.1, 'budget': 64}}
    >>> apply_overrides(cfg, ["hybrid.budget=32"])["hybrid"]
    {'chunk': 64, 'C': 0.0625, 'budget': 32}
    >>> apply_overrides(cfg, ["hybrid={}"])["hybrid"]
    {}
    """
    out = copy.deepcopy(config)
    for item in items:
        key, sep, text = item.partition("=")
        parts = key.split(".")
        if not sep or not all(parts):
            raise ValueError(f"--set expects KEY=VALUE (KEY may be dotted: hybrid.C=0.1), "
                             f"got {item!r}")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        node = out
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ValueError(f"--set {key}: {'.'.join(parts[:i + 1])} is {child!r}, "
                                 "not a mapping")
            node = child
        last = parts[-1]
        if isinstance(value, dict) and value and isinstance(node.get(last), dict):
            node[last] = _merge(node[last], value)
        else:
            node[last] = value
    return out
