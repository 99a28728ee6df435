"""``LMStream``: streaming inference of a :class:`~svattn.lm.model.CharLM` on exact memories.

A stream reads bytes with :meth:`LMStream.feed` (any number of calls), gives the
next-token logits (:meth:`~LMStream.logits`), samples (:meth:`~LMStream.generate`),
and forgets bytes of what it holds, named by their place in :attr:`~LMStream.text` or by
their content (:meth:`~LMStream.forget`, :meth:`~LMStream.forget_text`,
:mod:`svattn.lm.spans`; receipts in :mod:`svattn.lm.forget`).
Everything runs in float64 on a private copy of the model (eval mode).

The stream runs the model's own step (:meth:`CharLM.extend`): every layer's state is
what its mixer's ``init_state`` returns and its ``extend`` grows
(:mod:`svattn.mixers.base`; docs/streaming.md), so a mixer option or a new streaming
mixer is written once, in the mixer:

* ``softmax`` / ``sliding``: the KV cache (keys, rotated when ``rope``; values);
* ``hybrid_sv``: the same cache for the local path and, per head, one incremental
  :class:`svattn.exact.SVDDMemory` for the global path
  (:class:`svattn.mixers.hybrid_state.HybridState`, ``"full"`` policy: chunk ``c``
  reads the exact optimum over every key of chunks ``0 .. c − 1``);
* ``deltanet`` / ``linear``: the recurrent state (it holds no position apart, so a
  forget replays the text from the start).

What is the stream's own: the text and the fed position of every held byte, the final
hidden state of every position (so :meth:`logits` after a forget at the end needs no
recomputation), rewind and replay, the digest and forget log, and persistence.

**Equivalence.** ``feed`` gives the logits of ``model(x)`` with every mixer's
``stream_settings`` applied (hybrid layers in ``mode="exact"``, float64) to rounding,
however the input is split across calls (tests/lm/test_stream.py checks ≤ 1e-9).

Models whose hybrid layers use ``policy="support"`` are refused unless
``full_policy=True``: the stream then runs the same weights under ``"full"`` (its
memory keeps every earlier chunk, so ``forget`` can rewind it by exact removals; the
``"support"`` carry is not a function of the remaining text alone once a chunk was
truncated to ``budget``).
"""

from __future__ import annotations

import bisect
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
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import nn

from svattn.exact.records.fileformat import sha256_hex, write_atomic
from svattn.exact.records.signing import fingerprint, sign
from svattn.exact.records.signing import signing_key as as_signing_key
from svattn.lm.exact_model import exact_copy, model_digest
from svattn.lm.forget import ModelErasureReceipt, chained_digest, forget_entry_hash
from svattn.lm.forget_log import checkpoint_of
from svattn.lm.spans import (
    ForgetResult,
    ForgottenSpan,
    as_needle,
    choose,
    fed_runs,
    span_ints,
    text_sha256,
)
from svattn.lm.stream_folder import (
    FILE_NAME,
    FORMAT,
    LOAD_WAIT,
    MANIFEST,
    VERSION,
    FolderLock,
    StreamBusyError,
    StreamIntegrityError,
    StreamStateError,
    check_fed,
    check_origin,
    files_of,
    load_memory,
    read_checked,
    read_manifest,
    recover,
    remove_named,
    v1_files,
    write_manifest,
)
from svattn.mixers.hybrid_state import MemoryReads
from svattn.mixers.state import Rows

__all__ = ["ForgetResult", "LMStream", "StreamBusyError", "StreamIntegrityError",
           "StreamStateError", "exact_copy", "model_digest"]

F64 = torch.float64


class LMStream(MemoryReads):
    """Inference state of a :class:`~svattn.lm.model.CharLM`: feed, logits, generate, forget.

    Built by :meth:`CharLM.stream`. :meth:`forget` takes positions in :attr:`text` as
    it is now (the *held* text), :meth:`forget_text` an exact byte string found there;
    :meth:`forget_fed` takes *fed* positions (the index of a byte among every byte ever
    fed, generated ones included: they do not move when an earlier span is forgotten).
    Each returns a :class:`~svattn.lm.spans.ForgetResult`: the removed bytes and the
    receipts.

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
        The controller's key (:mod:`svattn.exact.records.signing`): every
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
    >>> r = s.forget(5, 7)
    >>> r.removed, s.text, r.receipt.n_forgotten
    (b', ', b'helloworld', 2)
    >>> s.forget_text(b"wor").spans[0].fed_span  # held [5, 8) was fed at [7, 10)
    (7, 10)
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
        self.layers = self.model.init_state()  # every layer's mixer state
        for st in self.layers:
            st.every = snapshot_every * st.chunk if st.mems else 0
        self._tokens = bytearray()  # the text held (the forgotten spans removed)
        self._origin: list[int] = []  # fed position of each held byte (increasing)
        self.n_fed = 0  # bytes ever fed
        self._hidden = Rows((self.model.cfg.n_embd,))  # final hidden state per position
        self.forgotten: list[tuple[int, int]] = []  # fed spans forgotten so far
        # one entry per forget, hash-chained: the span, the SHA-256 of its receipt's
        # body and the state part after it (digest covers the last entry's hash)
        self.forget_log: list[dict] = []
        self.forget_checkpoint: str | None = None  # its checkpoint (svattn.lm.forget_log)
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
        elif out and max(out) >= V:  # checked before anything changes
            i = next(i for i, t in enumerate(out) if t >= V)
            raise ValueError(f"tokens: byte {out[i]} (0x{out[i]:02x}) at offset {i} is outside "
                             f"this model's vocabulary of {V} tokens (bytes 0..{V - 1})")
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
        """Run ``data`` through the model's own step from position ``len(self)`` on
        (:meth:`CharLM.extend`; the hybrid layers read through this stream's
        :class:`~svattn.mixers.hybrid_state.MemoryReads` hooks)."""
        idx = torch.tensor(list(data), dtype=torch.long)
        with torch.no_grad():
            h = self.model.extend(self.layers, idx, reads=self)
            self._hidden.append(h)
            self._tokens.extend(data)
            return self.model.lm_head(h)

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
    def forget(self, start: int, stop: int) -> ForgetResult:
        """Delete held positions ``[start, stop)``: the bytes ``self.text[start:stop]``
        as the caller sees them now. Afterwards the stream is the stream of
        :attr:`text` without them (docs/streaming.md).

        A span across the place of an earlier forget was not fed in one run: each run
        is forgotten with its own receipt, right to left. Nothing before a run is
        recomputed: every hybrid memory loses the tokens from the chunk holding its
        start − 1 on by exact removals (:meth:`rewind`), the caches are cut, and the
        bytes after it are fed again (:meth:`replay`) under their old fed positions.

        Returns
        -------
        ForgetResult
            The removed bytes (for the caller; no receipt holds them), held and fed
            spans, one :class:`~svattn.lm.forget.ModelErasureReceipt` per run (the
            memories' deletion certificates, the repair record and :meth:`digest`
            afterwards) and the remaining text's SHA-256 (:mod:`svattn.lm.spans`).

        Raises
        ------
        ValueError
            Not ints, or an empty or out-of-range span (state unchanged).
        """
        self._check_usable()
        start, stop = span_ints(start, stop)
        if not 0 <= start < stop <= len(self):
            raise ValueError(f"span [{start}, {stop}) must be non-empty and inside the held "
                             f"text [0, {len(self)}) (positions in stream.text)")
        return self._forget_runs(fed_runs(self._origin, start, stop))

    def forget_text(self, needle, *, occurrence=None) -> ForgetResult:
        """Delete an exact byte string found in :attr:`text` (a ``str`` is UTF-8).

        ``occurrence``: None (it must occur exactly once), ``"all"``, or ``n`` (the n-th,
        from 0; occurrences counted left to right, not overlapping). Each occurrence is
        forgotten as :meth:`forget` forgets its span.

        Raises
        ------
        ValueError
            ``needle`` empty or absent, ambiguous (several occurrences and no
            ``occurrence``: the message gives the count and offsets), or ``occurrence``
            out of range (state unchanged).
        """
        self._check_usable()
        needle = as_needle(needle)
        offsets = choose(self.text, needle, occurrence)
        return self._forget_runs([run for a in offsets
                                  for run in fed_runs(self._origin, a, a + len(needle))])

    def forget_fed(self, start: int, stop: int) -> ForgetResult:
        """Delete fed positions ``[start, stop)`` (a byte's index among every byte ever
        fed: earlier forgets do not move them; ``origin`` maps held positions to them),
        as :meth:`forget` does. ``ValueError``: not ints, empty, out of ``[0, n_fed)``
        or (partly) forgotten already (state unchanged)."""
        self._check_usable()
        a, b = self.locate(start, stop)
        return self._forget_runs([((a, b), (int(start), int(stop)))])

    def _forget_runs(self, runs: list[tuple[tuple[int, int], tuple[int, int]]]
                     ) -> ForgetResult:
        """Forget each ``(held, fed)`` run, checked by the caller, right to left."""
        done = []
        for held, fed in sorted(runs, reverse=True):
            removed = bytes(self._tokens[held[0]: held[1]])
            done.append(ForgottenSpan(held, fed, removed, self._forget_run(held, fed)))
        return ForgetResult(tuple(reversed(done)), text_sha256(self.text))

    def _forget_run(self, span: tuple[int, int], fed: tuple[int, int]) -> ModelErasureReceipt:
        """Forget held ``span`` (fed positions ``fed``, one run); return its receipt."""
        (a, b), n_before = span, len(self)
        t0 = time.perf_counter()
        keep = self.rewind_point(a)  # a, or 0 where a recurrent layer cannot cut back
        try:  # past the checks, only a failure inside a memory can interrupt this
            tail, origins = self.cut_text(keep)
            removed = self.rewind(keep, resume=b < n_before or keep < a)
            t1 = time.perf_counter()
            cut = slice(a - keep, b - keep)  # the span, inside the tail
            self.replay(tail[: cut.start] + tail[cut.stop :],
                        origins[: cut.start] + origins[cut.stop :])
        except BaseException as exc:
            self._broken = f"a forget failed midway ({type(exc).__name__}: {exc})"
            raise
        t2 = time.perf_counter()
        self.forgotten.append(fed)
        self.forgotten.sort()
        return self._bind_receipt(ModelErasureReceipt.issue(
            self, fed_span=fed, span=(a, b), n_before=n_before,
            removed=removed, kept=keep, seconds={"rewind": t1 - t0, "replay": t2 - t1},
            signer=None if self._signing_key is None else fingerprint(
                self._signing_key.public_key())))

    def _bind_receipt(self, receipt: ModelErasureReceipt) -> ModelErasureReceipt:
        """Append the receipt's body to the forget log (chained to the entry before, with
        the state part after the forget); fill in the digest that covers it; sign."""
        prev = forget_entry_hash(self.forget_log[-1]) if self.forget_log else None
        self.forget_log.append({"fed_span": list(receipt.fed_span),
                                "receipt": receipt.body_sha256(), "state": self.state_part(),
                                "prev": prev})
        self.forget_checkpoint = checkpoint_of(self.forget_log, self._signing_key)
        receipt = dataclasses.replace(receipt, state_digest=self.digest())
        return receipt if self._signing_key is None else sign(receipt, self._signing_key)

    def locate(self, start: int, stop: int) -> tuple[int, int]:
        """Held positions ``[a, b)`` of fed positions ``[start, stop)``; checks the span.

        Raises
        ------
        ValueError
            Not ints, empty, out of range, or (partly) forgotten already.
        """
        start, stop = span_ints(start, stop)
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
        """Cut the state back to the first ``a`` held positions (a rewind point of every
        layer, :meth:`rewind_point`); return, per hybrid layer and head, the removed
        positions and certificates.

        Each layer's state cuts itself back (:meth:`svattn.mixers.state.MixerState.rewind`):
        caches are truncated to ``a``; the hybrid memories lose, by exact decremental
        removal, every token of positions ``>= ((a − 1) // L)·L``, what a fresh stream
        fed ``text[:a]`` holds (with ``resume``, more bytes following at once, they keep
        ``(a // L)·L``: what the next query, at position ``a``, reads)."""
        if self.rewind_point(a) != a:
            raise ValueError(f"position {a} is not a rewind point of every layer (the "
                             f"furthest is {self.rewind_point(a)})")
        removed = []
        for li, st in enumerate(self.layers):
            removed += st.rewind(a, resume=resume, layer=li)
        self._hidden.truncate(a)
        return removed

    def rewind_point(self, a: int) -> int:
        """The furthest held position ``<= a`` every layer can be cut back to: ``a``,
        or 0 for a recurrent layer (its fixed state holds no position apart), which
        :meth:`forget` then replays from."""
        return min(st.rewind_point(a) for st in self.layers)

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
        safetensors file; ``stream.json`` (the manifest, checksummed) lists every file
        with its SHA-256. The folder format and its crash guarantees are in
        :data:`svattn.lm.stream_folder.FOLDER`: one writer at a time (``flock`` on
        ``stream.lock``), the files of an interrupted save and of the save before are
        named in the manifest and removed (overwritten, then deleted) at the next save or
        load, and no file the manifests never named is touched.

        Raises
        ------
        StreamBusyError
            Another process is saving into this folder (nothing written).
        RuntimeError
            The stream is unusable (an interrupted operation).
        """
        self._check_usable()
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        with FolderLock(folder, wait=0.0) as lock:
            cur, leftovers = recover(folder, lock)
            gen = secrets.token_hex(6)
            arrays = {"tokens": torch.tensor(list(self._tokens), dtype=torch.uint8),
                      "origin": torch.tensor(self._origin, dtype=torch.int64),
                      "hidden": self._hidden.view().clone()}
            aname = f"arrays.{gen}.safetensors"
            mnames = [[f"memory.{li}.{hd}.{gen}.safetensors" for hd in range(len(st.mems))]
                      for li, st in enumerate(self.layers)]
            new_files = [aname, *(n for names in mnames for n in names)]
            old_files = files_of(cur) if cur is not None and "arrays" in cur else \
                v1_files(folder)
            leftovers = {n for n in leftovers if FILE_NAME.fullmatch(n)}
            # 1. name the files this save will write before any exists: a save killed
            # from here on leaves only files the manifest names as pending
            base = cur if cur is not None else {"format": FORMAT, "version": VERSION}
            write_manifest(folder, {**base, "pending": sorted(set(new_files) | leftovers),
                                     "superseded": []})
            # 2. the new generation's files
            layers = []
            for li, st in enumerate(self.layers):
                for name, t in st.arrays().items():
                    arrays[f"{name}.{li}"] = t.clone()
                mems = [{"file": fname, "sha256": mem.save(folder / fname)}
                        for fname, mem in zip(mnames[li], st.mems, strict=True)]
                layers.append({"absorbed": st.absorbed, "ids": st.ids if st.mems else [],
                               "memories": mems})
            data = st_save({k: v.contiguous() for k, v in arrays.items()})
            write_atomic(folder / aname, data)
            # 3. commit: the manifest names the new files, and the old ones as superseded
            manifest = {"format": FORMAT, "version": VERSION,
                        "model_digest": self.model_digest,
                        "model_config": self.model.cfg.to_dict(),
                        "full_policy": self.full_policy,
                        "snapshot_every": self.snapshot_every, "n_fed": self.n_fed,
                        "forgotten": [list(x) for x in self.forgotten],
                        "forget_log": self.forget_log, "digest": self.digest(),
                        "forget_checkpoint": self.forget_checkpoint,
                        "signer": None if self._signing_key is None else fingerprint(
                            self._signing_key.public_key()),
                        "arrays": {"file": aname, "sha256": sha256_hex(data)},
                        "layers": layers, "pending": [],
                        "superseded": sorted((set(old_files) | leftovers) - set(new_files))}
            body = write_manifest(folder, manifest)
            # 4. the old generation (it may hold forgotten bytes) is overwritten and
            # deleted; killed before this ends, the next save or load finishes it
            remove_named(folder, manifest["superseded"])
            return sha256_hex(body)

    @classmethod
    def load(cls, path: str | os.PathLike[str], model: nn.Module, *,
             signing_key=None) -> LMStream:
        """Load a stream saved by :meth:`save` for ``model`` (bit-exact continuation).

        ``signing_key`` (Ed25519 private key or path): the controller's key, so that the
        loaded stream goes on signing its receipts. It must be the key the stream was
        saved with (the manifest records its fingerprint): another controller's key is
        refused. Without it the stream loads, and its receipts are unsigned.

        First finishes what an interrupted save left (under the folder's lock, waiting
        up to :data:`LOAD_WAIT` seconds for a live save): the files it names as pending
        or superseded and their temporary files are overwritten and deleted.

        Raises
        ------
        FileNotFoundError
            No saved stream at ``path``.
        StreamStateError
            Another model (digest); a file missing, corrupted or inconsistent; a
            manifest whose checksum, fed count or forgotten spans do not hold; a folder
            holding an interrupted save's files that cannot be removed (read-only).
        StreamBusyError
            A save into the folder did not finish within :data:`LOAD_WAIT` seconds.
        """
        folder = Path(path)
        if not (folder / MANIFEST).is_file():
            raise FileNotFoundError(f"no saved stream at {folder} (no {MANIFEST})")
        with FolderLock(folder, wait=LOAD_WAIT) as lock:
            man, leftovers = recover(folder, lock)
            if man is None:
                man = read_manifest(folder)  # raises the precise reason
            if leftovers:
                raise StreamStateError(
                    f"{folder}: files of an interrupted save remain and could not be removed "
                    f"(read-only?): {sorted(leftovers)}; they may hold forgotten bytes: "
                    "load the stream where it can be cleaned")
            if "arrays" not in man:
                raise StreamStateError(f"{folder}: the first save into this folder was "
                                       "interrupted: it holds no stream")
            key = None if signing_key is None else as_signing_key(signing_key)
            if key is not None and man.get("signer") != fingerprint(key.public_key()):
                raise StreamStateError(
                    f"{folder}: signing_key is not the key this stream was saved with "
                    f"(saved by {str(man.get('signer'))[:16]}…, given "
                    f"{fingerprint(key.public_key())[:16]}…): another controller's key")
            s = cls._from_manifest(folder, man, model)
            s._signing_key = key
            return s

    @classmethod
    def _from_manifest(cls, folder: Path, man: dict, model: nn.Module) -> LMStream:
        got = model_digest(model)
        if man.get("model_digest") != got:
            raise StreamStateError(f"{folder}: the stream was read by the model with digest "
                                   f"{str(man.get('model_digest'))[:16]}…, not this one "
                                   f"({got[:16]}…)")
        try:
            n_fed, forgotten = check_fed(man)
            s = cls(model, full_policy=man["full_policy"], snapshot_every=man["snapshot_every"])
            if man["model_config"] != json.loads(json.dumps(s.model.cfg.to_dict())):
                raise ValueError("the manifest's model_config is not the model's")
            data = read_checked(folder, man["arrays"])
            arr = st_load(data)
            s._tokens = bytearray(arr["tokens"].numpy().tobytes())
            if s._tokens and max(s._tokens) >= model.cfg.vocab_size:  # a replay would fail
                raise ValueError(f"a held byte ({max(s._tokens)}) is outside the model's "
                                 f"vocabulary of {model.cfg.vocab_size} tokens")
            s._origin = [int(t) for t in arr["origin"]]
            check_origin(s._origin, n_fed, forgotten, len(s._tokens))
            s._hidden.append(arr["hidden"])
            if len(man["layers"]) != len(s.layers):
                raise ValueError(f"{len(man['layers'])} layers listed, the model has "
                                 f"{len(s.layers)}")
            for li, (st, lay) in enumerate(zip(s.layers, man["layers"], strict=True)):
                try:
                    st.load_arrays({name: arr[f"{name}.{li}"] for name in st.arrays()},
                                   len(s._tokens))
                except ValueError as exc:
                    raise ValueError(f"layer {li}: {exc}") from None
                if st.mems:
                    if len(lay["memories"]) != len(st.mems):
                        raise ValueError(f"layer {li}: {len(lay['memories'])} memories "
                                         f"listed, the model has {len(st.mems)} heads")
                    fresh, Dh = st.mems, st.k.buf.shape[-1]
                    st.mems = [load_memory(folder, m) for m in lay["memories"]]
                    for hd, (mem, want) in enumerate(zip(st.mems, fresh, strict=True)):
                        # a memory of other dimensions would fail a later replay midway
                        if (mem.C, mem.kernel, mem.gamma) != (
                                want.C, want.kernel, want.gamma) or mem.dim not in (
                                None, Dh) or (len(mem) and mem.values.shape[1] != Dh):
                            raise ValueError(f"layer {li} head {hd}: the memory's parameters "
                                             "or dimensions are not this model's")
                    st.ids = [[int(i) for i in ids] for ids in lay["ids"]]
                    st.absorbed = lay["absorbed"]
                    if not (isinstance(st.absorbed, int) and 0 <= st.absorbed <= len(s._tokens)
                            and st.absorbed % st.chunk == 0
                            and all(len(ids) == st.absorbed for ids in st.ids)):
                        raise ValueError(f"layer {li}: absorbed {st.absorbed!r} is not a "
                                         "whole number of chunks of the positions held")
                    if any(mem.ids != ids for mem, ids in zip(st.mems, st.ids, strict=True)):
                        raise StreamIntegrityError(f"{folder}: layer {li}: the memories' "
                                                   "tokens are not the positions the manifest "
                                                   "lists")
            if s._hidden.n != len(s._tokens):
                raise ValueError(f"{s._hidden.n} hidden states for {len(s._tokens)} bytes held")
        except (KeyError, TypeError, ValueError, RuntimeError, SafetensorError) as exc:
            if isinstance(exc, StreamStateError):
                raise
            raise StreamIntegrityError(f"{folder}: inconsistent stream state "
                                   f"({type(exc).__name__}: {exc})") from None
        s.n_fed = n_fed
        s.forgotten = forgotten
        log = man.get("forget_log")
        if not isinstance(log, list) or not all(isinstance(e, dict) for e in log):
            raise StreamIntegrityError(f"{folder}: the manifest's forget_log is not a list "
                                       "of records")
        s.forget_log = [dict(e) for e in log]
        s.forget_checkpoint = man.get("forget_checkpoint")  # checked by verify_forget
        if not isinstance(s.forget_checkpoint, (str, type(None))):
            raise StreamIntegrityError(f"{folder}: the manifest's forget_checkpoint is not text")
        if s.digest() != man.get("digest"):
            raise StreamIntegrityError(f"{folder}: the loaded state's digest differs from "
                                       "the manifest's")
        return s
