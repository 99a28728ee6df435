"""``CharLM``: a small decoder-only byte-level language model with a pluggable mixer.

nanoGPT-shaped (pre-LayerNorm blocks, GELU MLP, tied input/output embedding),
readable top to bottom: :class:`CharLMConfig`, :class:`MLP`, :class:`Block`,
:class:`CharLM`. The sequence mixer of every block comes from
:data:`svattn.mixers.MIXERS` (``softmax``, ``sliding``, ``hybrid_sv``,
``deltanet``, ``linear``), so models that differ only in the mixer have the
same width, depth and (up to a handful of gate or beta parameters) the same
parameter count.

Positions: by default none (``pos_emb=False``, ``rope=False``, "NoPE"). A full
causal softmax tells positions apart through its mask, but a window of fixed
size (``sliding``, and the chunk-local path of ``hybrid_sv``) does not: inside
a full window the keys are an unordered set. ``rope=True`` rotates queries and
keys by position in the softmax mixers (for ``hybrid_sv`` on its local path
only; the SV memory compares keys by content), without adding parameters;
``pos_emb=True`` adds learned absolute positions.
"""

from __future__ import annotations

import inspect
import math
import numbers
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from svattn.lm.stream import LMStream
from svattn.mixers import MIXERS

__all__ = ["CharLMConfig", "CharLM", "MLP", "Block", "build_mixer", "positions_of"]


@dataclass
class CharLMConfig:
    """Shape of a :class:`CharLM`.

    Examples
    --------
    >>> cfg = CharLMConfig(n_layer=2, n_embd=32, n_head=2, block_size=64)
    >>> cfg.mixer, cfg.vocab_size
    ('softmax', 256)
    """

    vocab_size: int = 256  # bytes
    block_size: int = 256  # context length T (training windows, and the eval context)
    n_layer: int = 4
    n_embd: int = 256  # d_model
    n_head: int = 4
    mlp_ratio: int = 4  # MLP hidden width = mlp_ratio · n_embd
    bias: bool = True  # biases in the Linear layers (LayerNorms have none)
    pos_emb: bool = False  # learned absolute positions (False: none, "NoPE")
    rope: bool = False  # rotary positions in the softmax mixers (hybrid_sv: local path)
    dropout: float = 0.0  # on the embedding and each residual branch, in training only
    mixer: str = "softmax"  # a key of svattn.mixers.MIXERS
    mixer_options: dict = field(default_factory=dict)  # e.g. {"window": 128}

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_embd", "n_head", "mlp_ratio"):
            val = getattr(self, name)
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise ValueError(f"CharLMConfig.{name} must be an int >= 1, got {val!r}")
        for name in ("bias", "pos_emb", "rope"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"CharLMConfig.{name} must be a bool, got {getattr(self, name)!r}")
        if isinstance(self.dropout, bool) or not (
            isinstance(self.dropout, (int, float)) and 0.0 <= self.dropout < 1.0
        ):
            raise ValueError(
                f"CharLMConfig.dropout must be a number in [0, 1), got {self.dropout!r}"
            )
        if self.n_embd % self.n_head:
            raise ValueError(
                f"CharLMConfig.n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})"
            )
        if self.mixer not in MIXERS:
            raise ValueError(
                f"CharLMConfig.mixer must be one of {sorted(MIXERS)}, got {self.mixer!r}"
            )
        if not isinstance(self.mixer_options, dict):
            raise ValueError(
                f"CharLMConfig.mixer_options must be a dict, got {type(self.mixer_options)}"
            )

    def to_dict(self) -> dict:
        """Plain-data form (JSON-serialisable)."""
        return asdict(self)


def positions_of(cfg: CharLMConfig | dict) -> str:
    """How a model knows token positions: ``"rope"``, ``"learned"`` or ``"none"`` (NoPE).

    Takes a :class:`CharLMConfig` or its dict form (e.g. a log's ``model_config``).

    Examples
    --------
    >>> positions_of(CharLMConfig(rope=True)), positions_of({"pos_emb": False})
    ('rope', 'none')
    """
    d = cfg.to_dict() if isinstance(cfg, CharLMConfig) else cfg
    if d.get("rope"):
        return "rope"
    return "learned" if d.get("pos_emb") else "none"


def build_mixer(cfg: CharLMConfig) -> nn.Module:
    """The mixer of one block: ``MIXERS[cfg.mixer](n_embd, n_head, **options)``.

    ``bias`` is passed when the mixer takes it (and the options do not set it);
    ``rope=True`` is passed to mixers that take it and refused by the others.
    """
    cls = MIXERS[cfg.mixer]
    opts = dict(cfg.mixer_options)
    takes = inspect.signature(cls).parameters
    if "bias" in takes:
        opts.setdefault("bias", cfg.bias)
    if cfg.rope:
        if "rope" not in takes:
            raise ValueError(
                f"CharLMConfig.rope = True, but mixer {cfg.mixer!r} has no rotary option "
                "(rope applies to the softmax mixers: softmax, sliding, hybrid_sv)"
            )
        opts.setdefault("rope", True)
    try:
        return cls(d_model=cfg.n_embd, n_heads=cfg.n_head, **opts)
    except TypeError as exc:  # an unknown option: say which mixer refused it
        raise ValueError(f"mixer {cfg.mixer!r} rejected options {opts}: {exc}") from None


class MLP(nn.Module):
    """``Linear(d, r·d) → GELU → Linear(r·d, d)``."""

    def __init__(self, cfg: CharLMConfig) -> None:
        super().__init__()
        hidden = cfg.mlp_ratio * cfg.n_embd
        self.fc = nn.Linear(cfg.n_embd, hidden, bias=cfg.bias)
        self.proj = nn.Linear(hidden, cfg.n_embd, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    """Pre-norm residual block: ``x + mix(ln(x))``, then ``x + mlp(ln(x))``."""

    def __init__(self, cfg: CharLMConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=False)
        self.mix = build_mixer(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=False)
        self.mlp = MLP(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.mix(self.ln_1(x)))  # (B, T, D)
        return x + self.drop(self.mlp(self.ln_2(x)))


class CharLM(nn.Module):
    """Decoder-only byte-level language model.

    Parameters
    ----------
    cfg : CharLMConfig

    Examples
    --------
    >>> import torch
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> cfg = CharLMConfig(n_layer=2, n_embd=32, n_head=2, block_size=16)
    >>> model = CharLM(cfg)
    >>> idx = torch.randint(0, 256, (3, 16))
    >>> logits, loss = model(idx, targets=torch.randint(0, 256, (3, 16)))
    >>> logits.shape, round(loss.item(), 1)  # about ln 256 = 5.5 at init
    (torch.Size([3, 16, 256]), 5.5)
    >>> model.num_params()
    33504
    """

    def __init__(self, cfg: CharLMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd) if cfg.pos_emb else None
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=False)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2: scaled residual projections
            if name.endswith(("mlp.proj.weight", "mix.out.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def stream(self, *, full_policy: bool = False, snapshot_every: int = 4,
               signing_key=None) -> LMStream:
        """Streaming inference state (:class:`svattn.lm.stream.LMStream`): ``feed``,
        ``logits``, ``generate``, ``forget``, ``save``; float64 on exact memories.

        ``full_policy``: stream ``policy="support"`` hybrid layers under ``"full"``;
        ``snapshot_every``: copy the memories every that many chunks (faster forgets);
        ``signing_key``: the controller's Ed25519 key (or a PEM path), which signs every
        erasure receipt of ``forget``.
        """
        return LMStream(self, full_policy=full_policy, snapshot_every=snapshot_every,
                        signing_key=signing_key)

    def num_params(self) -> int:
        """Number of parameters (the tied embedding counted once)."""
        return sum(p.numel() for p in self.parameters())

    def hidden(self, idx: torch.Tensor) -> torch.Tensor:
        """Final hidden states ``[B, T, D]`` (after ``ln_f``, before the head) of tokens
        ``idx`` ``[B, T]``: a task scored at a few positions applies ``lm_head`` there only."""
        if idx.dim() != 2:
            raise ValueError(f"idx must be [B, T], got shape {tuple(idx.shape)}")
        T = idx.shape[1]
        if self.wpe is not None and T > self.cfg.block_size:
            raise ValueError(
                f"sequence of {T} tokens is longer than block_size = {self.cfg.block_size}"
            )
        x = self.wte(idx)  # (B, T, D)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(T, device=idx.device))
        x = self.drop(x)
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)  # (B, T, D)

    # ------------------------------------------------------------ incremental inference
    def init_state(self) -> list:
        """The inference state of one sequence: every block's mixer state
        (:meth:`svattn.mixers.SequenceMixer.init_state`), no position read yet.

        Raises
        ------
        ValueError
            A mixer that does not stream.
        """
        return [block.mix.init_state() for block in self.blocks]

    @torch.no_grad()
    def extend(self, states: list, idx: torch.Tensor, *, reads=None) -> torch.Tensor:
        """Read the next tokens ``idx`` ``[m]`` of one sequence into ``states`` (from
        :meth:`init_state`); return their final hidden states ``[m, D]`` (after ``ln_f``).

        Rows ``n .. n + m − 1`` of :meth:`hidden` of the whole sequence (``n``: the
        positions ``states`` hold) for a model whose mixers run their
        ``stream_settings`` (:func:`svattn.lm.stream.exact_copy`: the hybrid's exact
        mode), each block's mixer running its own incremental form
        (:meth:`~svattn.mixers.SequenceMixer.extend`; ``reads`` goes to it). Dropout is
        not applied (inference). :class:`~svattn.lm.stream.LMStream` is built on it.
        """
        if not isinstance(idx, torch.Tensor) or idx.dim() != 1 or idx.is_floating_point() \
                or idx.is_complex() or idx.dtype == torch.bool:
            what = (f"shape {tuple(idx.shape)} and dtype {idx.dtype}"
                    if isinstance(idx, torch.Tensor) else type(idx).__name__)
            raise ValueError(f"idx must be a 1-D tensor of token ids [m] (integer), got {what}")
        V = self.cfg.vocab_size
        out = ((idx < 0) | (idx >= V)).nonzero()
        if len(out):
            i = int(out[0, 0])
            raise ValueError(f"idx: token {int(idx[i])} at offset {i} is outside this model's "
                             f"vocabulary of {V} tokens (0..{V - 1})")
        if len(states) != len(self.blocks):
            raise ValueError(f"states holds {len(states)} layers, the model has "
                             f"{len(self.blocks)} (use init_state)")
        t0 = states[0].n
        if any(st.n != t0 for st in states):
            raise ValueError(f"the layers' states hold {[st.n for st in states]} positions: "
                             "not one sequence's")
        if self.wpe is not None and t0 + len(idx) > self.cfg.block_size:
            raise ValueError(f"position {t0 + len(idx) - 1} is past block_size = "
                             f"{self.cfg.block_size} (learned positions)")
        for st in states:
            st.check_usable()
        x = self.wte(idx)  # (m, D)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(t0, t0 + len(idx)))
        try:
            for block, st in zip(self.blocks, states, strict=True):
                x = x + block.mix.extend(st, block.ln_1(x), reads=reads)
                x = x + block.mlp(block.ln_2(x))
        except BaseException as exc:  # the layers before it read the positions: none goes on
            for st in states:
                st.broken = st.broken or (f"the model's extend failed midway "
                                          f"({type(exc).__name__}: {exc})")
            raise
        return self.ln_f(x)  # (m, D)

    @torch.no_grad()
    def step(self, states: list, token: int, *, reads=None) -> torch.Tensor:
        """Read one token into ``states``; return the next-token logits ``[V]``."""
        if isinstance(token, bool) or not isinstance(token, numbers.Integral):
            raise ValueError(f"token must be an int, got {token!r}")
        idx = torch.tensor([int(token)], dtype=torch.long)
        return self.lm_head(self.extend(states, idx, reads=reads)[0])

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits ``[B, T, 256]`` for bytes ``idx`` ``[B, T]``; with ``targets`` also the
        mean cross-entropy (nats)."""
        B, T = idx.shape if idx.dim() == 2 else (0, 0)
        logits = self.lm_head(self.hidden(idx))  # (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().reshape(B * T, -1), targets.reshape(B * T))
        return logits, loss
