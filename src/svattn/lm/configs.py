"""Named model shapes and the matched-state sliding-window baseline.

=============  ======  =====  =====  =====  =================================
name           layers  d      heads  T      parameters (softmax mixer)
=============  ======  =====  =====  =====  =================================
``paper-3m``   4       256    4      256    3,222,784 (the paper's 3.22M)
``10m``        8       320    5      256    9,940,800
``tiny``       2       32     2      64     33,504 (tests, smoke runs)
=============  ======  =====  =====  =====  =================================

The hybrid adds ``n_head`` gate logits per layer (16 for ``paper-3m``).

Matched state (docs/design.md §5): the hybrid with the ``"support"`` policy keeps
at most ``budget`` support tokens plus the current chunk of ``L``, so the
baseline is sliding-window softmax with ``W = budget + L``
(:func:`matched_sliding`), same width, depth, data and steps.
"""

from __future__ import annotations

from dataclasses import replace

from svattn.lm.model import CharLMConfig

__all__ = ["PRESETS", "HYBRID_DEFAULTS", "preset", "matched_sliding", "mixer_config"]

PRESETS: dict[str, CharLMConfig] = {
    "paper-3m": CharLMConfig(n_layer=4, n_embd=256, n_head=4, block_size=256),
    "10m": CharLMConfig(n_layer=8, n_embd=320, n_head=5, block_size=256),
    "tiny": CharLMConfig(n_layer=2, n_embd=32, n_head=2, block_size=64),
}

# The hybrid's memory for the LM: chunks of 64, C = 1/16 (>= 16 tokens carry
# weight), at most 64 support tokens carried ("support" policy: bounded state).
# Training solver: 20 FISTA iterations, then the default finish (each boundary
# problem's verified SVDD optimum, docs/design.md §5). refine and ridge_steps apply to
# the paper's approximate finish only (finish="approximate": the active set read off the
# iterate, one ridged margin solve, no repair rounds, no ridge refinement), which
# checkpoints trained before the optimum finish used.
# The solver fields stay flat keywords of HybridSVAttention (not a SolverOptions):
# mixer_options is saved as JSON in configs, logs and checkpoints.
HYBRID_DEFAULTS = {
    "chunk": 64,
    "C": 1.0 / 16,
    "budget": 64,
    "policy": "support",
    "max_iter": 20,
    "refine": 0,
    "ridge_steps": 0,
}


def preset(name: str, **overrides) -> CharLMConfig:
    """A named shape (table above), with field overrides.

    Examples
    --------
    >>> preset("paper-3m").n_embd
    256
    >>> preset("tiny", mixer="sliding", mixer_options={"window": 16}).mixer
    'sliding'
    """
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; choose from {sorted(PRESETS)}")
    return replace(PRESETS[name], **overrides)


def matched_sliding(hybrid_options: dict) -> dict:
    """Sliding-window options with the state of a ``"support"``-policy hybrid:
    ``W = budget + lookback + L`` (``lookback`` 0 unless set).

    Examples
    --------
    >>> matched_sliding({"chunk": 64, "C": 1 / 16, "budget": 64})
    {'window': 128}
    >>> matched_sliding({"chunk": 64, "budget": 32, "lookback": 32})
    {'window': 128}
    """
    opts = {**HYBRID_DEFAULTS, **hybrid_options}
    return {"window": int(opts["budget"]) + int(opts.get("lookback", 0)) + int(opts["chunk"])}


def mixer_config(cfg: CharLMConfig, mixer: str, hybrid_options: dict | None = None) -> CharLMConfig:
    """``cfg`` with ``mixer`` and its options: hybrid defaults for ``hybrid_sv``, the
    matched window for ``sliding``, chunk 64 for the recurrent mixers.

    Examples
    --------
    >>> mixer_config(preset("tiny"), "sliding", {"chunk": 16, "budget": 16}).mixer_options
    {'window': 32}
    """
    hyb = {**HYBRID_DEFAULTS, **(hybrid_options or {})}
    hyb["chunk"] = min(hyb["chunk"], cfg.block_size)
    options = {
        "hybrid_sv": hyb,
        "sliding": matched_sliding(hyb),
        "deltanet": {"chunk_size": 64},
        "linear": {"chunk_size": 64},
        "softmax": {},
    }
    if mixer not in options:
        raise ValueError(f"mixer must be one of {sorted(options)}, got {mixer!r}")
    return replace(cfg, mixer=mixer, mixer_options=options[mixer])
