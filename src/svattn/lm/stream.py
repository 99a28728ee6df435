"""``LMStream``: streaming inference of a :class:`~svattn.lm.model.CharLM` on exact memories.

A stream reads bytes with :meth:`LMStream.feed` (any number of calls), gives the
next-token logits (:meth:`~LMStream.logits`), samples (:meth:`~LMStream.generate`),
and forgets a span of what it read (:meth:`~LMStream.forget`, :mod:`svattn.lm.forget`).
Everything runs in float64 on a private copy of the model (eval mode).

State per layer, per position ``t`` of the text it holds (docs/streaming.md):

* ``softmax`` / ``sliding``: the KV cache (keys, rotated when ``rope``; values);
* ``hybrid_sv``: the same cache for the local path (the current chunk and its
  ``lookback`` keys are read from it) and, per head, one incremental
  :class:`svattn.exact.SVDDMemory` for the global path. The memory follows the
  ``"full"`` policy of :class:`~svattn.mixers.hybrid.HybridSVAttention`: when the
  first query of chunk ``c`` arrives, the keys and values of chunk ``c − 1`` are
  added to it, so chunk ``c`` reads the exact optimum over every key of chunks
  ``0 .. c − 1`` (unrotated, as the batched forward solves it);
* the final hidden state of every position (so :meth:`logits` after a forget at
  the end needs no recomputation).

**Equivalence.** ``feed`` gives the logits of ``model(x)`` with every hybrid layer in
``mode="exact"`` (float64) to rounding, however the input is split across calls
(tests/lm/test_stream.py checks ≤ 1e-9).

Models whose hybrid layers use ``policy="support"`` are refused unless
``full_policy=True``: the stream then runs the same weights under ``"full"`` (its
memory keeps every earlier chunk, so ``forget`` can rewind it by exact removals;
the ``"support"`` carry is not a function of the remaining text alone once a
chunk was truncated to ``budget``). The recurrent mixers (``deltanet``,
``linear``) are refused: their state is not streamed yet.
"""

from __future__ import annotations

import bisect
import copy
import dataclasses
import hashlib
import json
import math
import os
import secrets
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import nn

from svattn.exact import SVDDMemory
from svattn.exact.fileformat import sha256_hex, write_atomic
from svattn.exact.signing import fingerprint, sign
from svattn.exact.signing import signing_key as as_signing_key
from svattn.lm.forget import ModelErasureReceipt, chained_digest, forget_entry_hash
from svattn.mixers import HybridSVAttention, SlidingWindowAttention, SoftmaxAttention
from svattn.mixers.rope import apply_rotary
from svattn.nn.common import resolve_gamma

__all__ = ["LMStream", "StreamStateError", "exact_copy", "model_digest"]

FORMAT = "svattn.LMStream"
VERSION = 1
MANIFEST = "stream.json"
F64 = torch.float64


class StreamStateError(ValueError):
    """A saved stream that cannot be loaded: missing, corrupted, or another model's."""


def model_digest(model: nn.Module) -> str:
    """SHA-256 of a model's configuration and parameters (as float64 bytes).

    Two models with the same digest compute the same stream; :meth:`LMStream.load`
    and ``svattn verify-forget`` refuse a stream whose model has another digest.
    """
    h = hashlib.sha256()
    h.update(json.dumps(model.cfg.to_dict(), sort_keys=True).encode())
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().to("cpu", F64).contiguous().numpy().tobytes())
    return h.hexdigest()


def _kind(mix: nn.Module) -> str:
    if type(mix) is HybridSVAttention:
        return "hybrid"
    if type(mix) is SlidingWindowAttention:
        return "sliding"
    if type(mix) is SoftmaxAttention:
        return "softmax"
    raise ValueError(
        f"LMStream streams the softmax, sliding and hybrid_sv mixers; this model's mixer "
        f"{type(mix).__name__} (a recurrent state) is not streamed yet"
    )


def exact_copy(model: nn.Module, *, full_policy: bool = False) -> nn.Module:
    """A float64, eval-mode copy of ``model`` with every hybrid layer in ``mode="exact"``.

    This is the reference the stream equals (``exact_copy(model)(x)``). With
    ``full_policy`` the hybrid layers also switch to ``policy="full"`` (same weights).

    Raises
    ------
    ValueError
        A hybrid layer with ``policy="support"`` and ``full_policy`` False, or a
        recurrent mixer.
    """
    for i, block in enumerate(model.blocks):
        mix = block.mix
        if _kind(mix) == "hybrid" and mix.policy != "full" and not full_policy:
            raise ValueError(
                f"layer {i} of this model uses the hybrid policy {mix.policy!r}; LMStream "
                "follows policy='full' (the memory keeps every earlier chunk, so forget can "
                "rewind it by exact removals). Stream it with full_policy=True (the same "
                "weights under policy='full'), or build the model with policy='full'"
            )
    ref = copy.deepcopy(model).to(dtype=F64).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    for block in ref.blocks:
        if _kind(block.mix) == "hybrid":
            block.mix.mode = "exact"
            if full_policy:
                block.mix.policy = "full"
    return ref


class _Rows:
    """Rows ``[n, *shape]`` (float64 or int) with amortised appends; truncation and
    growth zero what they drop, so no removed row stays in the object."""

    def __init__(self, shape: tuple[int, ...], dtype=F64) -> None:
        self.buf = torch.zeros((0, *shape), dtype=dtype)
        self.n = 0

    def append(self, x: torch.Tensor) -> None:
        need = self.n + x.shape[0]
        if need > self.buf.shape[0]:
            new = torch.zeros((max(need, 2 * self.buf.shape[0], 16), *self.buf.shape[1:]),
                              dtype=self.buf.dtype)
            new[: self.n] = self.buf[: self.n]
            self.buf.zero_()
            self.buf = new
        self.buf[self.n : need] = x
        self.n = need

    def view(self) -> torch.Tensor:
        return self.buf[: self.n]

    def truncate(self, n: int) -> None:
        self.buf[n : self.n] = 0
        self.n = n

    def __getstate__(self) -> dict:  # pickled without the spare capacity
        return {"buf": self.buf[: self.n].clone(), "n": self.n}


class _Layer:
    """One block's stream state: KV cache and, for a hybrid, one memory per head."""

    def __init__(self, mix: nn.Module) -> None:
        self.kind = _kind(mix)
        H, Dh = mix.n_heads, mix.head_dim
        self.rope = bool(mix.rope)
        self.k = _Rows((H, Dh))  # unrotated keys (the memory's; the cache's without rope)
        self.v = _Rows((H, Dh))
        self.kr = _Rows((H, Dh)) if self.rope else None  # rotated keys (local / softmax)
        self.mems: list[SVDDMemory] = []
        self.ids: list[list[int]] = [[] for _ in range(H)]  # ids[h][p]: token id of position p
        self.absorbed = 0  # positions held by the memories (a multiple of the chunk)
        self.chunk = getattr(mix, "chunk", 0)
        self.every = 0  # positions between snapshots of the memories (0: none)
        self.snaps: dict[int, list[SVDDMemory]] = {}  # boundary → copies holding positions < it
        if self.kind == "hybrid":
            gamma = resolve_gamma(mix.kernel, mix.gamma, Dh)
            self.mems = [SVDDMemory(mix.C, mix.kernel, gamma) for _ in range(H)]

    @property
    def n(self) -> int:
        return self.k.n

    def truncate(self, n: int) -> None:
        for rows in (self.k, self.v, self.kr):
            if rows is not None:
                rows.truncate(n)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, t0: int, lo,
            logw: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax attention of queries at positions ``t0 ..`` over cached keys ``[lo(t), t]``.

    ``q`` ``[1, H, m, Dh]``, ``k, v`` ``[1, H, n, Dh]`` (``n >= t0 + m``); scale ``1/sqrt(Dh)``.
    ``logw`` ``[n]`` (optional) shifts the logit of key ``j`` by ``logw[j]``.
    """
    m = q.shape[2]
    t = torch.arange(t0, t0 + m)[:, None]
    first = max(0, int(lo(t0)))
    j = torch.arange(first, t0 + m)[None, :]
    mask = (j <= t) & (j >= lo(t))  # (m, keys)
    if logw is not None:
        mask = torch.where(mask, logw[first : t0 + m][None, :], -math.inf).to(q.dtype)
    return F.scaled_dot_product_attention(q, k[:, :, first : t0 + m], v[:, :, first : t0 + m],
                                          attn_mask=mask)  # (1, H, m, Dh)


class LMStream:
    """Inference state of a :class:`~svattn.lm.model.CharLM`: feed, logits, generate, forget.

    Built by :meth:`CharLM.stream`. Positions given to :meth:`forget` are **fed
    positions**: the index of a byte among every byte ever fed (generated ones
    included), so they do not move when an earlier span is forgotten, and a span
    forgotten before is recognised.

    Parameters
    ----------
    model : CharLM
        Copied (float64, eval, hybrid layers exact); the model itself is untouched.
    full_policy : bool
        Stream a ``policy="support"`` hybrid under ``policy="full"`` (module docstring).
    snapshot_every : int
        Copy each hybrid memory every ``snapshot_every`` chunks (0: never). A forget then
        continues from the first copy at or after the chunk it rewinds to and removes
        at most that many chunks' tokens, instead of every token from there to the end
        (the memory it held and the later copies are released). Costs memory: the
        copies together hold about ``n² / (2·snapshot_every·L)`` tokens per head.
        Copies are not saved; a loaded stream makes new ones as it reads on.
    signing_key : Ed25519PrivateKey or path, optional
        The controller's key (:mod:`svattn.exact.signing`): every
        :class:`~svattn.lm.forget.ModelErasureReceipt` is signed with it. Never saved.

    Examples
    --------
    >>> import torch
    >>> from svattn.lm import CharLM, CharLMConfig
    >>> _ = torch.manual_seed(0)
    >>> cfg = CharLMConfig(n_layer=1, n_embd=16, n_head=2, mixer="hybrid_sv",
    ...                    mixer_options={"chunk": 8, "C": 0.25, "policy": "full"})
    >>> s = CharLM(cfg).stream()
    >>> s.feed(b"hello, world").shape
    torch.Size([12, 256])
    >>> s.text
    b'hello, world'
    >>> receipt = s.forget(5, 7)
    >>> s.text, receipt.n_forgotten
    (b'helloworld', 2)
    """

    def __init__(self, model: nn.Module, *, full_policy: bool = False,
                 snapshot_every: int = 4, signing_key=None) -> None:
        if not isinstance(full_policy, bool):
            raise ValueError(f"full_policy must be a bool, got {full_policy!r}")
        if isinstance(snapshot_every, bool) or not isinstance(snapshot_every, int) or \
                snapshot_every < 0:
            raise ValueError(f"snapshot_every must be an int >= 0, got {snapshot_every!r}")
        self.full_policy = full_policy
        self.snapshot_every = snapshot_every
        self._signing_key = None if signing_key is None else as_signing_key(signing_key)
        self.model = exact_copy(model, full_policy=full_policy)
        self.model_digest = model_digest(model)
        self.layers = [_Layer(b.mix) for b in self.model.blocks]
        for st in self.layers:
            st.every = snapshot_every * st.chunk if st.mems else 0
        self._tokens = bytearray()  # the text held (the forgotten spans removed)
        self._origin: list[int] = []  # fed position of each held byte (increasing)
        self.n_fed = 0  # bytes ever fed
        self._hidden = _Rows((self.model.cfg.n_embd,))  # final hidden state per position
        self.forgotten: list[tuple[int, int]] = []  # fed spans forgotten so far
        # one entry per forget, hash-chained: the span, the SHA-256 of its receipt's
        # body and the state part after it (digest covers the last entry's hash)
        self.forget_log: list[dict] = []
        self._broken: str | None = None  # why the stream refuses work (an interrupted op)

    def _check_usable(self) -> None:
        if self._broken is not None:
            raise RuntimeError(f"this stream is unusable: {self._broken}; load a saved "
                               "stream or feed a new one")

    # ------------------------------------------------------------------ reading
    @property
    def text(self) -> bytes:
        """The bytes the stream holds (what a fresh stream would have been fed)."""
        return bytes(self._tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    @property
    def origin(self) -> list[int]:
        """Fed position of every held byte."""
        return list(self._origin)

    def _as_tokens(self, tokens) -> bytes:
        V = self.model.cfg.vocab_size
        if isinstance(tokens, (bytes, bytearray)):
            out = bytes(tokens)
        elif isinstance(tokens, torch.Tensor):
            if tokens.dim() != 1 or tokens.dtype not in (torch.long, torch.int, torch.uint8):
                raise ValueError(f"tokens must be a 1-D integer tensor, got shape "
                                 f"{tuple(tokens.shape)} and dtype {tokens.dtype}")
            out = tokens.tolist()
        elif isinstance(tokens, (list, tuple)):
            out = list(tokens)
        else:
            raise ValueError(f"tokens must be bytes, a list of ints or a LongTensor, got "
                             f"{type(tokens).__name__}")
        if not isinstance(out, bytes):
            bad = [t for t in out if isinstance(t, bool) or not isinstance(t, int)
                   or not 0 <= t < min(V, 256)]
            if bad:
                raise ValueError(f"tokens must be ints in [0, {min(V, 256)}), got {bad[0]!r}")
            out = bytes(out)
        if self.model.wpe is not None and len(self) + len(out) > self.model.cfg.block_size:
            raise ValueError(f"this model has learned positions up to block_size = "
                             f"{self.model.cfg.block_size}; the stream holds {len(self)} bytes "
                             f"and {len(out)} more were fed")
        return out

    def feed(self, tokens, *, progress=None) -> torch.Tensor:
        """Read ``tokens`` (bytes, a list of ints or a 1-D LongTensor); return the
        logits ``[m, V]`` (float64) at every fed position.

        ``progress(done, total)``, if given, is called after every piece of 256 bytes.
        """
        self._check_usable()
        data = self._as_tokens(tokens)
        outs = []
        for i in range(0, len(data), 256):
            piece = data[i : i + 256]
            try:
                outs.append(self._advance(piece))
            except BaseException as exc:  # caches of some layers grew, others not
                self._broken = f"a feed failed midway ({type(exc).__name__}: {exc})"
                raise
            self._origin.extend(range(self.n_fed, self.n_fed + len(piece)))
            self.n_fed += len(piece)
            if progress is not None:
                progress(i + len(piece), len(data))
        if not outs:
            return torch.zeros(0, self.model.cfg.vocab_size, dtype=F64)
        return torch.cat(outs)

    def logits(self) -> torch.Tensor:
        """Next-token logits ``[V]`` after the last byte held."""
        if not len(self):
            raise ValueError("the stream holds no byte yet: feed some before asking for logits")
        with torch.no_grad():
            return self.model.lm_head(self._hidden.view()[-1])

    def all_logits(self) -> torch.Tensor:
        """Logits ``[n, V]`` at every held position (from the cached final hidden states)."""
        with torch.no_grad():
            return self.model.lm_head(self._hidden.view())

    def generate(self, n: int, *, temperature: float = 1.0, top_k: int | None = None,
                 seed: int | None = None) -> bytes:
        """Sample ``n`` bytes (each fed back); return them.

        ``temperature`` 0 is greedy. ``seed`` fixes the draws (one uniform per byte,
        inverse-CDF sampling: equal logits give equal bytes).
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be an int >= 0, got {n!r}")
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not (
                math.isfinite(temperature) and temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)
                                  or top_k < 1):
            raise ValueError(f"top_k must be an int >= 1 or None, got {top_k!r}")
        if n and not len(self):
            raise ValueError("the stream holds no byte yet: feed a prompt before generating")
        rng = np.random.default_rng(seed)
        out = bytearray()
        for _ in range(n):
            z = self.logits()[: min(256, self.model.cfg.vocab_size)]
            if top_k is not None and top_k < z.numel():
                kth = z.topk(top_k).values[-1]
                z = torch.where(z >= kth, z, torch.full_like(z, -math.inf))
            if temperature == 0:
                tok = int(z.argmax())
            else:
                p = torch.softmax(z / temperature, -1).numpy()
                tok = min(int(np.searchsorted(np.cumsum(p), rng.random() * p.sum())), len(p) - 1)
            out.append(tok)
            self.feed(bytes([tok]))
        return bytes(out)

    # ------------------------------------------------------------------ compute
    def _advance(self, data: bytes) -> torch.Tensor:
        """Run ``data`` through every layer from position ``len(self)`` on."""
        t0 = len(self)
        idx = torch.tensor(list(data), dtype=torch.long)
        m = self.model
        with torch.no_grad():
            x = m.wte(idx)  # (m, D)
            if m.wpe is not None:
                x = x + m.wpe(torch.arange(t0, t0 + len(data)))
            for block, st in zip(m.blocks, self.layers, strict=True):
                x = x + self._mix(block.mix, st, block.ln_1(x), t0)
                x = x + block.mlp(block.ln_2(x))
            h = m.ln_f(x)
        self._hidden.append(h)
        self._tokens.extend(data)
        return m.lm_head(h)

    def _mix(self, mix: nn.Module, st: _Layer, h: torch.Tensor, t0: int) -> torch.Tensor:
        q, k, v = mix.qkv_heads(h[None])  # (1, H, m, Dh)
        st.k.append(k[0].transpose(0, 1))
        st.v.append(v[0].transpose(0, 1))
        qr = q
        if st.rope:
            qr = apply_rotary(q, offset=t0)
            st.kr.append(apply_rotary(k, offset=t0)[0].transpose(0, 1))
        keys = (st.kr if st.rope else st.k).view().permute(1, 0, 2)[None]  # (1, H, n, Dh)
        vals = st.v.view().permute(1, 0, 2)[None]
        if st.kind == "softmax":
            o = _attend(qr, keys, vals, t0, lambda t: 0 * t)
        elif st.kind == "sliding":
            o = _attend(qr, keys, vals, t0, lambda t: t - mix.window + 1)
        else:
            o = self._hybrid(mix, st, q, qr, keys, vals, t0)
        return mix.out(mix.merge_heads(o))[0]  # (m, D)

    def _hybrid(self, mix, st: _Layer, q, qr, keys, vals, t0: int) -> torch.Tensor:
        L, lb, end = mix.chunk, mix.lookback, t0 + q.shape[2]
        g = torch.sigmoid(mix.gate).view(1, -1, 1, 1)  # (1, H, 1, 1)
        logw = self.key_log_weights(keys.shape[2])
        outs = []
        for c in range(t0 // L, (end - 1) // L + 1):
            s, e = max(t0, c * L), min(end, (c + 1) * L)
            a, b = s - t0, e - t0
            local = _attend(qr[:, :, a:b], keys, vals, s, lambda t, c=c: 0 * t + c * L - lb,
                            logw)
            if c == 0:
                outs.append(local)
                continue
            self._absorb(st, c * L)
            glob = torch.stack([
                torch.from_numpy(self.memory_readout(st, hd, q[0, hd, a:b].numpy()))
                for hd in range(len(st.mems))])[None]  # (1, H, m, Dh)
            outs.append(g * glob + (1.0 - g) * local)
        return torch.cat(outs, 2)

    # Read hooks of the hybrid path: a subclass that reweighs what the stream holds
    # (e.g. a decay baseline) overrides these two, not the chunk loop above.
    def key_log_weights(self, n: int) -> torch.Tensor | None:
        """Shifts of the local path's key logits, ``[n]`` over held positions (None: none)."""
        return None

    def memory_readout(self, layer: _Layer, head: int, queries: np.ndarray) -> np.ndarray:
        """The global path's readout of ``head``'s memory in ``layer`` for ``queries``."""
        return layer.mems[head].readout(queries)

    @staticmethod
    def _absorb(st: _Layer, upto: int) -> None:
        """Add chunks to the memories until they hold positions ``< upto``; copy them
        at every ``st.every``-th position (the snapshots :meth:`rewind` starts from)."""
        while st.absorbed < upto:
            lo, hi = st.absorbed, st.absorbed + st.chunk
            K = st.k.view()[lo:hi].numpy()  # (L, H, Dh)
            Vv = st.v.view()[lo:hi].numpy()
            for hd, mem in enumerate(st.mems):
                st.ids[hd].extend(mem.extend(K[:, hd], Vv[:, hd]))
            st.absorbed = hi
            if st.every and hi % st.every == 0:
                st.snaps[hi] = [mem.copy() for mem in st.mems]

    # ------------------------------------------------------------------ digest
    def content_digest(self) -> str:
        """SHA-256 of what the stream holds: the model digest, the text held, and per
        layer the positions its memories hold. A fresh stream fed :attr:`text` has the
        same content digest.

        Floats (caches, alpha) are not hashed: they agree with a fresh stream's to
        rounding only, and alpha is not unique where keys repeat
        (:func:`svattn.lm.forget.verify_forget` compares them).
        """
        h = hashlib.sha256()
        h.update(json.dumps({"format": FORMAT, "model": self.model_digest,
                             "full_policy": self.full_policy,
                             "absorbed": [st.absorbed for st in self.layers],
                             "held": [[len(m) for m in st.mems] for st in self.layers]},
                            sort_keys=True).encode())
        h.update(hashlib.sha256(bytes(self._tokens)).digest())
        return h.hexdigest()

    def state_part(self) -> str:
        """SHA-256 of what the stream holds and what it forgot: :meth:`content_digest`,
        the fed position of every held byte, ``n_fed`` and the forgotten spans."""
        origin = np.asarray(self._origin, dtype="<i8").tobytes()
        return hashlib.sha256(json.dumps({
            "content": self.content_digest(), "n_fed": self.n_fed,
            "forgotten": [[int(a), int(b)] for a, b in self.forgotten],
            "origin": hashlib.sha256(origin).hexdigest()}, sort_keys=True).encode()).hexdigest()

    def digest(self) -> str:
        """SHA-256 of the stream's discrete state: :meth:`state_part` (what it holds,
        its fed positions, ``n_fed`` and the spans it forgot) chained with the hash of
        the last entry of its forget log (one entry per forget: the span, the SHA-256 of
        the receipt's body, the state part after it, the hash of the entry before).

        Two streams of the same text differ in digest when their fed positions or
        forgets differ; :meth:`content_digest` is what a fresh stream of :attr:`text`
        shares.
        """
        head = forget_entry_hash(self.forget_log[-1]) if self.forget_log else None
        return chained_digest(self.state_part(), head)

    # ------------------------------------------------------------------ forget
    def forget(self, start: int, stop: int) -> ModelErasureReceipt:
        """Delete fed positions ``[start, stop)``: afterwards the stream is the stream of
        :attr:`text` without that span (docs/streaming.md).

        Nothing before the span is recomputed. Every hybrid memory loses the tokens of
        positions from the chunk holding ``start − 1`` on by exact decremental removal
        (:meth:`rewind`), the caches are cut at ``start``, and the bytes after the span
        are fed again (:meth:`replay`) under their old fed positions.

        Returns
        -------
        ModelErasureReceipt
            The memories' deletion certificates for the span's tokens, the repair
            record and :meth:`digest` afterwards (:mod:`svattn.lm.forget`).

        Raises
        ------
        ValueError
            Not ints, an empty or out-of-range span, or one forgotten already
            (state unchanged).
        """
        self._check_usable()
        a, b = self.locate(start, stop)
        n_before = len(self)
        t0 = time.perf_counter()
        try:  # past the checks, only a failure inside a memory can interrupt this
            tail, origins = self.cut_text(a)
            removed = self.rewind(a, resume=b < n_before)
            t1 = time.perf_counter()
            span_len = b - a
            self.replay(tail[span_len:], origins[span_len:])
        except BaseException as exc:
            self._broken = f"a forget failed midway ({type(exc).__name__}: {exc})"
            raise
        t2 = time.perf_counter()
        self.forgotten.append((int(start), int(stop)))
        self.forgotten.sort()
        return self._bind_receipt(ModelErasureReceipt.issue(
            self, fed_span=(int(start), int(stop)), span=(a, b), n_before=n_before,
            removed=removed, seconds={"rewind": t1 - t0, "replay": t2 - t1},
            signer=None if self._signing_key is None else fingerprint(
                self._signing_key.public_key())))

    def _bind_receipt(self, receipt: ModelErasureReceipt) -> ModelErasureReceipt:
        """Append the receipt's body to the forget log (chained to the entry before, with
        the state part after the forget); fill in the digest that covers it; sign."""
        prev = forget_entry_hash(self.forget_log[-1]) if self.forget_log else None
        self.forget_log.append({"fed_span": list(receipt.fed_span),
                                "receipt": receipt.body_sha256(), "state": self.state_part(),
                                "prev": prev})
        receipt = dataclasses.replace(receipt, state_digest=self.digest())
        return receipt if self._signing_key is None else sign(receipt, self._signing_key)

    def locate(self, start: int, stop: int) -> tuple[int, int]:
        """Held positions ``[a, b)`` of fed positions ``[start, stop)``; checks the span.

        Raises
        ------
        ValueError
            Not ints, empty, out of range, or (partly) forgotten already.
        """
        for name, val in (("start", start), ("stop", stop)):
            if isinstance(val, bool) or not isinstance(val, (int, np.integer)):
                raise ValueError(f"{name} must be an int, got {val!r}")
        start, stop = int(start), int(stop)
        if not 0 <= start < stop <= self.n_fed:
            raise ValueError(f"span [{start}, {stop}) must be non-empty and inside the fed "
                             f"positions [0, {self.n_fed})")
        a = bisect.bisect_left(self._origin, start)
        b = bisect.bisect_left(self._origin, stop)
        if b - a != stop - start:
            gone = [s for s in self.forgotten if s[0] < stop and start < s[1]]
            raise ValueError(f"fed positions [{start}, {stop}) overlap spans forgotten "
                             f"already {gone}: forgetting twice")
        return a, b

    def rewind(self, a: int, *, resume: bool = False) -> list[dict]:
        """Cut the state back to the first ``a`` held positions; return, per hybrid layer
        and head, the removed positions and certificates.

        The memories lose, by exact decremental removal, every token of positions
        ``>= ((a − 1) // L)·L``: what a fresh stream fed ``text[:a]`` holds. With
        ``resume`` (more bytes follow at once) they keep ``(a // L)·L``: what the next
        query, at position ``a``, reads (the same unless ``a`` ends a chunk, whose
        tokens are then not removed and re-added). Caches are truncated to ``a``."""
        removed = []
        for li, (block, st) in enumerate(zip(self.model.blocks, self.layers, strict=True)):
            if st.kind == "hybrid":
                L = block.mix.chunk
                keep = (a // L) * L if resume else ((a - 1) // L) * L if a else 0
                old = max(keep, st.absorbed)
                start = self._restore(st, keep)  # the memories now hold positions < start
                for hd, mem in enumerate(st.mems):
                    ids = st.ids[hd][keep:]
                    t0 = time.perf_counter()
                    certs = mem.remove_many(reversed(ids)) if ids else []
                    removed.append({"layer": li, "head": hd, "positions": (keep, start),
                                    "released": (start, old), "certificates": certs[::-1],
                                    "seconds": time.perf_counter() - t0})
                    del st.ids[hd][keep:]
                st.absorbed = min(st.absorbed, keep)
            st.truncate(a)
        self._hidden.truncate(a)
        return removed

    @staticmethod
    def _restore(st: _Layer, keep: int) -> int:
        """Continue from the earliest snapshot at or after ``keep``, if it is earlier than
        the memories' end: the memories (and later snapshots) are released, which holds
        fewer tokens to remove. Snapshots after ``keep`` are dropped (they hold positions
        that move). Returns the end of what the memories now hold."""
        later = [b for b in st.snaps if keep <= b < st.absorbed]
        if later:
            b = min(later)
            st.mems = [m.copy() for m in st.snaps[b]] if b == keep else st.snaps.pop(b)
            for ids in st.ids:
                del ids[b:]
            st.absorbed = b
        for b in [b for b in st.snaps if b > keep]:
            del st.snaps[b]
        return max(keep, st.absorbed)

    def replay(self, data: bytes, origins: list[int]) -> None:
        """Feed ``data`` again under its old fed positions (after :meth:`rewind`)."""
        for i in range(0, len(data), 256):
            self._origin.extend(origins[i : i + 256])
            self._advance(data[i : i + 256])

    def cut_text(self, a: int) -> tuple[bytes, list[int]]:
        """Drop the held bytes from ``a`` on (zeroed in place); return them and their
        fed positions."""
        tail, origins = bytes(self._tokens[a:]), self._origin[a:]
        self._tokens[a:] = bytes(len(self._tokens) - a)  # overwrite, then drop
        del self._tokens[a:]
        del self._origin[a:]
        return tail, origins

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | os.PathLike[str]) -> str:
        """Save to the folder ``path``; return the manifest's SHA-256.

        Each memory is its own atomic, checksummed state file
        (:meth:`SVDDMemory.save`); caches, hidden states and the text go to one
        safetensors file; ``stream.json`` lists every file with its SHA-256 and is
        written last, atomically. Files of this save carry a fresh generation in
        their names, so the manifest always names a complete set; files of earlier
        saves are deleted afterwards (they may hold forgotten bytes).
        """
        self._check_usable()
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        gen = secrets.token_hex(6)
        arrays = {"tokens": torch.tensor(list(self._tokens), dtype=torch.uint8),
                  "origin": torch.tensor(self._origin, dtype=torch.int64),
                  "hidden": self._hidden.view().clone()}
        layers = []
        for li, st in enumerate(self.layers):
            for name in ("k", "v", "kr"):
                rows = getattr(st, name)
                if rows is not None:
                    arrays[f"{name}.{li}"] = rows.view().clone()
            mems = []
            for hd, mem in enumerate(st.mems):
                fname = f"memory.{li}.{hd}.{gen}.safetensors"
                mems.append({"file": fname, "sha256": mem.save(folder / fname)})
            layers.append({"absorbed": st.absorbed, "ids": st.ids if st.mems else [],
                           "memories": mems})
        data = st_save({k: v.contiguous() for k, v in arrays.items()})
        aname = f"arrays.{gen}.safetensors"
        write_atomic(folder / aname, data)
        manifest = {"format": FORMAT, "version": VERSION, "model_digest": self.model_digest,
                    "model_config": self.model.cfg.to_dict(), "full_policy": self.full_policy,
                    "snapshot_every": self.snapshot_every,
                    "n_fed": self.n_fed, "forgotten": self.forgotten,
                    "forget_log": self.forget_log, "digest": self.digest(),
                    "arrays": {"file": aname, "sha256": sha256_hex(data)}, "layers": layers}
        body = json.dumps(manifest, sort_keys=True, indent=1).encode()
        write_atomic(folder / MANIFEST, body)
        keep = {aname, MANIFEST} | {m["file"] for lay in layers for m in lay["memories"]}
        for f in folder.iterdir():
            if f.name not in keep and f.name.endswith(".safetensors") and \
                    f.name.startswith(("memory.", "arrays.")):
                f.unlink()
        return sha256_hex(body)

    @classmethod
    def load(cls, path: str | os.PathLike[str], model: nn.Module) -> LMStream:
        """Load a stream saved by :meth:`save` for ``model`` (bit-exact continuation).

        Raises
        ------
        FileNotFoundError
            No saved stream at ``path``.
        StreamStateError
            Another model (digest), or a file missing, corrupted or inconsistent.
        """
        folder = Path(path)
        if not (folder / MANIFEST).is_file():
            raise FileNotFoundError(f"no saved stream at {folder} (no {MANIFEST})")
        try:
            man = json.loads((folder / MANIFEST).read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise StreamStateError(f"{folder / MANIFEST}: not a stream manifest ({exc})") from None
        if not isinstance(man, dict) or (man.get("format"), man.get("version")) != (FORMAT,
                                                                                   VERSION):
            raise StreamStateError(f"{folder / MANIFEST}: not an {FORMAT} version {VERSION} "
                                   "manifest")
        got = model_digest(model)
        if man["model_digest"] != got:
            raise StreamStateError(f"{folder}: the stream was read by the model with digest "
                                   f"{man['model_digest'][:16]}…, not this one ({got[:16]}…)")
        s = cls(model, full_policy=bool(man["full_policy"]),
                snapshot_every=int(man.get("snapshot_every", 0)))
        data = _read_checked(folder / man["arrays"]["file"], man["arrays"]["sha256"])
        try:
            arr = st_load(data)
            s._tokens = bytearray(arr["tokens"].numpy().tobytes())
            s._origin = [int(t) for t in arr["origin"]]
            s._hidden.append(arr["hidden"])
            for li, (st, lay) in enumerate(zip(s.layers, man["layers"], strict=True)):
                for name in ("k", "v", "kr"):
                    rows = getattr(st, name)
                    if rows is not None:
                        rows.append(arr[f"{name}.{li}"])
                if st.mems:
                    st.mems = [_load_memory(folder, m) for m in lay["memories"]]
                    st.ids = [[int(i) for i in ids] for ids in lay["ids"]]
                    st.absorbed = int(lay["absorbed"])
                    if any(mem.ids != ids for mem, ids in zip(st.mems, st.ids, strict=True)):
                        raise StreamStateError(f"{folder}: layer {li}: the memories' tokens "
                                               "are not the positions the manifest lists")
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            if isinstance(exc, StreamStateError):
                raise
            raise StreamStateError(f"{folder}: inconsistent stream state "
                                   f"({type(exc).__name__}: {exc})") from None
        s.n_fed = int(man["n_fed"])
        s.forgotten = [tuple(x) for x in man["forgotten"]]
        s.forget_log = [dict(e) for e in man.get("forget_log", [])]
        # a save from before the forget log (#35) recorded what is now the content digest
        got = s.digest() if "forget_log" in man else s.content_digest()
        if got != man["digest"]:
            raise StreamStateError(f"{folder}: the loaded state's digest differs from the "
                                   "manifest's")
        return s


def _read_checked(path: Path, sha: str) -> bytes:
    if not path.is_file():
        raise StreamStateError(f"{path}: missing (the manifest lists it)")
    data = path.read_bytes()
    if sha256_hex(data) != sha:
        raise StreamStateError(f"{path}: SHA-256 differs from the manifest's (corrupted or "
                               "replaced)")
    return data


def _load_memory(folder: Path, entry: dict) -> SVDDMemory:
    _read_checked(folder / entry["file"], entry["sha256"])
    try:
        return SVDDMemory.load(folder / entry["file"])
    except ValueError as exc:
        raise StreamStateError(str(exc)) from None
