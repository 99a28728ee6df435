"""LMStream: streaming equals the exact-mode forward; forget equals a fresh stream.

The reference is always built independently: ``exact_copy(model)(x)`` (the batched
forward with every boundary re-solved from scratch) for ``feed``, and a fresh stream
fed the text without the span for ``forget``.
"""

from __future__ import annotations

import pickle
import re

import numpy as np
import pytest
import torch

from svattn.lm import CharLM, CharLMConfig
from svattn.lm.forget import ModelErasureReceipt, verify_forget
from svattn.lm.stream import LMStream, StreamStateError, exact_copy

TOL = 1e-9
HYB = {"chunk": 8, "C": 0.25, "policy": "full"}
MODELS = {
    "hybrid": dict(mixer="hybrid_sv", mixer_options=HYB),
    "hybrid-rope-lookback": dict(mixer="hybrid_sv", mixer_options={**HYB, "lookback": 3},
                                 rope=True),
    "hybrid-exp": dict(mixer="hybrid_sv", mixer_options={**HYB, "kernel": "exp"}),
    "softmax-rope": dict(mixer="softmax", rope=True),
    "sliding": dict(mixer="sliding", mixer_options={"window": 6}),
    "sliding-posemb": dict(mixer="sliding", mixer_options={"window": 6}, pos_emb=True),
}


def make(name: str = "hybrid-rope-lookback", seed: int = 0) -> CharLM:
    torch.manual_seed(seed)
    cfg = CharLMConfig(n_layer=2, n_embd=16, n_head=2, block_size=96, **MODELS[name])
    model = CharLM(cfg)
    with torch.no_grad():  # larger gates and projections than at init: layers that matter
        for block in model.blocks:
            if hasattr(block.mix, "gate"):
                block.mix.gate.fill_(0.5)
            block.mix.qkv.weight.mul_(10.0)
    return model


def text_of(n: int, seed: int = 1) -> bytes:
    return bytes(np.random.default_rng(seed).integers(97, 110, n).tolist())  # repeats bytes


def splits(n: int, rng: np.random.Generator) -> list[int]:
    cuts = sorted(set(rng.integers(1, n, rng.integers(1, 6)).tolist()))
    return [0, *cuts, n]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_feed_equals_the_exact_forward_for_any_split(name):
    model = make(name)
    text = text_of(45)
    ref = exact_copy(model)(torch.tensor(list(text))[None])[0][0]  # (T, V)
    rng = np.random.default_rng(0)
    for trial in range(3):
        s = model.stream()
        cuts = splits(len(text), rng) if trial else list(range(len(text) + 1))  # 1 at a time
        out = torch.cat([s.feed(text[a:b]) for a, b in zip(cuts, cuts[1:], strict=False)])
        assert (out - ref).abs().max() <= TOL
        assert (s.logits() - ref[-1]).abs().max() <= TOL
    assert ref.abs().max() > 0.1  # not a trivially zero model


def test_feed_takes_bytes_lists_and_tensors_alike():
    model = make("hybrid")
    a, b, c = model.stream(), model.stream(), model.stream()
    text = text_of(20)
    assert torch.equal(a.feed(text), b.feed(list(text)))
    assert torch.equal(a.all_logits(), c.feed(torch.tensor(list(text))))
    assert a.feed(b"").shape == (0, 256)


@pytest.mark.parametrize("bad, words", [
    ("abc", "bytes, a list of ints"), ([1, 256], "ints in [0, 256)"), ([True], "ints in"),
    (torch.zeros(2, 2, dtype=torch.long), "1-D integer tensor"),
])
def test_feed_rejects_bad_tokens_and_keeps_state(bad, words):
    s = make("hybrid").stream()
    s.feed(b"abcdefghij")
    before = (s.digest(), s.all_logits().clone())
    with pytest.raises(ValueError, match=re.escape(words)):
        s.feed(bad)
    assert s.digest() == before[0] and torch.equal(s.all_logits(), before[1])


def test_learned_positions_stop_at_block_size():
    s = make("sliding-posemb").stream()
    s.feed(text_of(90))
    with pytest.raises(ValueError, match="block_size = 96"):
        s.feed(text_of(7))
    assert len(s) == 90


def test_support_policy_is_refused_unless_streamed_as_full():
    torch.manual_seed(0)
    cfg = CharLMConfig(n_layer=1, n_embd=16, n_head=2, mixer="hybrid_sv",
                       mixer_options={**HYB, "policy": "support", "budget": 8})
    model = CharLM(cfg)
    with pytest.raises(ValueError, match="policy='full'.*full_policy=True"):
        model.stream()
    s = model.stream(full_policy=True)
    text = text_of(30)
    ref = exact_copy(model, full_policy=True)(torch.tensor(list(text))[None])[0][0]
    assert (s.feed(text) - ref).abs().max() <= TOL
    assert model.blocks[0].mix.policy == "support"  # the model itself is untouched


def test_a_mixer_that_does_not_stream_is_refused_precisely():
    from svattn.mixers import SoftmaxAttention

    class Reversed(SoftmaxAttention):  # changes mix, declares no incremental form
        def mix(self, x):
            return super().mix(x.flip(1)).flip(1)

    model = CharLM(CharLMConfig(n_layer=2, n_embd=16, n_head=2))
    model.blocks[1].mix = Reversed(16, 2)
    with pytest.raises(ValueError, match="layer 1 of this model: mixer Reversed is not streamed"):
        model.stream()


# ---------------------------------------------------------------------- forget

def fresh_of(model: CharLM, text: bytes, snapshot_every: int = 4) -> LMStream:
    s = model.stream(snapshot_every=snapshot_every)
    s.feed(text)
    return s


def assert_same_stream(s: LMStream, f: LMStream) -> None:
    assert s.text == f.text and s.content_digest() == f.content_digest()
    if len(f):
        assert (s.all_logits() - f.all_logits()).abs().max() <= TOL
        assert (s.logits() - f.logits()).abs().max() <= TOL


# spans: at the start, inside the first chunk, across chunk boundaries, ending a chunk,
# in the chunk the stream has not finished, at the end, and everything
SPANS = [(0, 5), (3, 4), (8, 16), (13, 30), (20, 33), (50, 53), (60, 70), (0, 70)]


@pytest.mark.parametrize("every", [0, 1, 4], ids=lambda e: f"snapshot{e}")
@pytest.mark.parametrize("span", SPANS, ids=[f"{a}-{b}" for a, b in SPANS])
def test_forget_equals_a_fresh_stream_of_the_text_without_the_span(span, every):
    model = make()
    text = text_of(70)
    s = fresh_of(model, text, every)
    a, b = span
    result = s.forget(a, b)
    receipt = result.receipt
    assert result.removed == text[a:b] and result.spans[0].fed_span == (a, b)
    f = fresh_of(model, text[:a] + text[b:])
    assert_same_stream(s, f)
    if len(f):  # and the exact forward of the remaining text, every boundary re-solved
        ref = exact_copy(model)(torch.tensor(list(f.text))[None])[0][0]
        assert (s.all_logits() - ref).abs().max() <= TOL
    assert receipt.n_forgotten == b - a and receipt.state_digest == s.digest()
    assert s.digest() != f.digest()  # the digest covers what was forgotten, and where
    assert receipt.repair["kept_prefix"] == a and receipt.repair["replayed"] == 70 - b
    if len(f):  # every later feed and generate too
        more = text_of(19, seed=5)
        assert (s.feed(more) - f.feed(more)).abs().max() <= TOL
        assert s.generate(12, seed=3, top_k=20) == f.generate(12, seed=3, top_k=20)
        assert_same_stream(s, f)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_forget_equals_a_fresh_stream_for_every_mixer(name):
    model = make(name)
    text = text_of(60)
    s = fresh_of(model, text)
    s.forget(13, 30)
    f = fresh_of(model, text[:13] + text[30:])
    assert_same_stream(s, f)
    assert s.generate(8, seed=0) == f.generate(8, seed=0)


def test_forget_rewinds_only_from_the_chunk_of_the_span():
    model = make("hybrid")  # chunk 8
    s = fresh_of(model, text_of(70), snapshot_every=0)
    r = s.forget_fed(20, 33).receipt  # chunk of position 19 starts at 16: the memories keep [0, 16)
    assert r.repair["rewound"] == {"0": [16, 64], "1": [16, 64]}
    n_span = sum(len(m["span_certificates"]) for m in r.memories)
    assert n_span == 2 * 2 * 13  # 13 span tokens held, in 2 layers × 2 heads
    assert all(m["rewound"] == 48 - 13 and m["released"] == 0 for m in r.memories)
    r = s.forget_fed(40, 45).receipt  # held position 27: its chunk [24, 32) is rewound
    assert r.repair["rewound"] == {"0": [24, 56], "1": [24, 56]}
    r = s.forget_fed(16, 20).receipt  # held 16 ends a chunk and bytes follow: [0, 16) stays
    assert r.repair["rewound"] == {"0": [16, 48], "1": [16, 48]}
    assert r.repair["kept_prefix"] == 16
    text = text_of(70)
    assert_same_stream(s, fresh_of(model, text[:16] + text[33:40] + text[45:]))


def test_snapshots_bound_the_rewind_and_release_the_rest():
    model = make("hybrid")  # chunk 8; snapshots every 2 chunks: at 16, 32, 48, 64
    s = fresh_of(model, text_of(70), snapshot_every=2)
    assert sorted(s.layers[0].snaps) == [16, 32, 48, 64]
    r = s.forget_fed(20, 33).receipt  # rewind to 16: the snapshot at 16 is the memory from now on
    assert r.repair["rewound"] == {"0": [16, 16], "1": [16, 16]}
    assert r.repair["released"] == {"0": [16, 64], "1": [16, 64]}
    assert all(m["span_certificates"] == [] and m["span_released"] == 13 for m in r.memories)
    # held 27: from the snapshot at 32 (made by the replay), remove 24..31
    r = s.forget_fed(40, 45).receipt
    assert r.repair["rewound"] == {"0": [24, 32], "1": [24, 32]}
    assert [len(m["span_certificates"]) for m in r.memories] == [5, 5, 5, 5]
    text = text_of(70)
    f = fresh_of(model, text[:20] + text[33:40] + text[45:], snapshot_every=2)
    assert_same_stream(s, f)
    for st, fst in zip(s.layers, f.layers, strict=True):  # snapshots: the fresh stream's
        assert sorted(st.snaps) == sorted(fst.snaps) == [16, 32, 48]
        for b in st.snaps:
            for mem, fmem in zip(st.snaps[b], fst.snaps[b], strict=True):
                probes = fmem.keys
                assert len(mem) == len(fmem) == b
                assert np.abs(mem.readout(probes) - fmem.readout(probes)).max() <= TOL


def test_repeated_forgets_use_fed_positions_and_refuse_forgetting_twice():
    model = make()
    text = text_of(70)
    s = fresh_of(model, text)
    s.forget_fed(40, 50)
    s.forget_fed(10, 20)  # fed positions: the first forget does not shift them
    assert_same_stream(s, fresh_of(model, text[:10] + text[20:40] + text[50:]))
    before = (s.digest(), s.all_logits().clone(), s.origin)
    for start, stop in [(45, 46), (5, 12), (19, 41)]:
        with pytest.raises(ValueError, match="forgetting twice"):
            s.forget_fed(start, stop)
    assert (s.digest(), s.origin) == (before[0], before[2])
    assert torch.equal(s.all_logits(), before[1])
    s.forget_fed(20, 40)  # between the forgotten spans: now one gap
    assert_same_stream(s, fresh_of(model, text[:10] + text[50:]))
    assert s.forgotten == [(10, 20), (20, 40), (40, 50)]


@pytest.mark.parametrize("fed", [False, True], ids=["held", "fed"])
@pytest.mark.parametrize("start, stop, words", [
    (5, 5, "non-empty"), (7, 3, "non-empty"), (-1, 3, "inside the (fed positions|held text)"),
    (10, 71, r"\[0, 70\)"), (1.0, 3, "start must be an int"), (0, True, "stop must be an int"),
])
def test_bad_spans_raise_and_leave_the_state_unchanged(start, stop, words, fed):
    s = fresh_of(make(), text_of(70))
    before = (s.digest(), s.all_logits().clone(), pickle.dumps([s.layers[1].mems[0].ids]))
    with pytest.raises(ValueError, match=words):
        (s.forget_fed if fed else s.forget)(start, stop)
    assert s.digest() == before[0] and torch.equal(s.all_logits(), before[1])
    assert pickle.dumps([s.layers[1].mems[0].ids]) == before[2]


def test_a_forget_interrupted_inside_a_memory_leaves_a_stream_that_refuses_work(
        monkeypatch, tmp_path):
    s = fresh_of(make(), text_of(70), snapshot_every=0)
    mem = s.layers[1].mems[1]

    def fail(ids):
        raise MemoryError("simulated")

    monkeypatch.setattr(mem, "remove_many", fail)
    with pytest.raises(MemoryError):
        s.forget(20, 30)
    for call in (lambda: s.feed(b"a"), lambda: s.forget(0, 1), lambda: s.save(tmp_path)):
        with pytest.raises(RuntimeError, match="unusable: a forget failed midway"):
            call()


SECRET = bytes(range(200, 216))  # bytes the rest of the text never holds


def span_rows(model: CharLM, text: bytes, a: int, b: int) -> list[bytes]:
    """float64 bytes of every key, value and hidden state of positions [a, b), per layer
    and head, from an independent stream of the whole text (tests/persist_helpers' scan)."""
    s = fresh_of(model, text)
    rows = []
    for st in s.layers:
        for name in ("k", "v", "kr"):
            cache = getattr(st, name)
            if cache is not None:
                for hd in range(cache.view().shape[1]):
                    rows += [cache.view()[p, hd].numpy().tobytes() for p in range(a, b)]
    rows += [s.all_logits()[p].numpy().tobytes() for p in range(a, b)]
    return rows


def test_no_byte_of_the_forgotten_span_remains_in_the_stream_or_its_saved_state(tmp_path):
    model = make()
    text = text_of(30) + SECRET + text_of(30, seed=2)
    a, b = 30, 30 + len(SECRET)
    rows = span_rows(model, text, a, b)
    s = fresh_of(model, text)
    s.save(tmp_path / "before")
    blob = pickle.dumps(s)
    saved = b"".join(p.read_bytes() for p in sorted((tmp_path / "before").iterdir()))
    # the scan sees the span while it is held: it can fail
    assert SECRET in blob and SECRET in saved
    assert sum(r in blob for r in rows) > len(rows) // 2
    assert any(r in saved for r in rows)
    receipt = s.forget(a, b).receipt
    s.save(tmp_path / "before")  # the same folder: the earlier save's files must go
    s.save(tmp_path / "after")
    blob = pickle.dumps(s) + receipt.to_json().encode()
    for folder in ("before", "after"):
        saved = b"".join(p.read_bytes() for p in sorted((tmp_path / folder).iterdir()))
        assert SECRET not in saved and not [r for r in rows if r in saved]
    assert SECRET not in blob and not [r for r in rows if r in blob]
    for i in range(0, len(SECRET) - 3):  # nor any 4 bytes of it
        assert SECRET[i : i + 4] not in blob


def test_receipt_verifies_and_a_changed_stream_or_receipt_does_not(tmp_path):
    model = make()
    s = fresh_of(model, text_of(70), snapshot_every=0)
    receipt = s.forget(20, 33).receipt
    again = ModelErasureReceipt.from_json(receipt.to_json())
    assert again == receipt and len(again.certificates()) == 52
    rep = verify_forget(s, again)
    assert rep.ok, rep.summary()
    assert rep.max_logit_deviation <= TOL and rep.n_certificates == 52
    s.save(tmp_path / "st")
    loaded = LMStream.load(tmp_path / "st", model)
    assert verify_forget(loaded, receipt).ok
    loaded.feed(b"x")  # the stream moved on: checked later, through its forget log
    rep = verify_forget(loaded, receipt)
    assert rep.ok and rep.later and rep.logged_at == 0, rep.summary()
    loaded.forget_fed(40, 45)
    rep = verify_forget(loaded, receipt)
    assert rep.ok and rep.later and rep.logged_at == 0, rep.summary()
    forged = ModelErasureReceipt.from_json(receipt.to_json().replace(
        receipt.model_digest, "0" * 64))
    assert not verify_forget(s, forged).ok
    with pytest.raises(ValueError, match="not a svattn.ModelErasureReceipt"):
        ModelErasureReceipt.from_json('{"kind": "other"}')


# ---------------------------------------------------------------- save / load

def test_save_load_continues_bit_exactly(tmp_path):
    model = make()
    s = fresh_of(model, text_of(37))
    s.forget(3, 9)
    s.save(tmp_path / "st")
    t = LMStream.load(tmp_path / "st", model)
    assert t.text == s.text and t.origin == s.origin and t.forgotten == s.forgotten
    more = text_of(25, seed=7)
    assert torch.equal(s.feed(more), t.feed(more))
    assert s.generate(10, seed=1) == t.generate(10, seed=1)
    s.forget(40, 50)
    t.forget(40, 50)
    assert torch.equal(s.all_logits(), t.all_logits())


def test_load_refuses_another_model_and_a_damaged_save(tmp_path):
    model = make()
    s = fresh_of(model, text_of(30))
    s.save(tmp_path / "st")
    with pytest.raises(StreamStateError, match="model with digest"):
        LMStream.load(tmp_path / "st", make(seed=1))
    with pytest.raises(FileNotFoundError, match="no saved stream"):
        LMStream.load(tmp_path / "nothing", model)
    mem = next((tmp_path / "st").glob("memory.1.0.*"))
    data = bytearray(mem.read_bytes())
    data[-5] ^= 1
    mem.write_bytes(bytes(data))
    with pytest.raises(StreamStateError, match="SHA-256 differs"):
        LMStream.load(tmp_path / "st", model)


# ---------------------------------------------------------------- generate

def test_generate_is_seeded_greedy_at_zero_and_checks_its_arguments():
    model = make()
    s, t = fresh_of(model, b"abcabc"), fresh_of(model, b"abcabc")
    assert s.generate(8, seed=4) == t.generate(8, seed=4)
    u = fresh_of(model, b"abcabc")
    nxt = int(u.logits().argmax())
    assert u.generate(1, temperature=0)[0] == nxt
    for kwargs, words in [({"n": -1}, "n must be"), ({"n": 2, "temperature": -1.0},
                          "temperature"), ({"n": 2, "top_k": 0}, "top_k")]:
        with pytest.raises(ValueError, match=words):
            u.generate(**kwargs)
    with pytest.raises(ValueError, match="feed a prompt"):
        model.stream().generate(1)


@pytest.mark.slow
def test_the_paper_shape_streams_and_forgets_exactly():
    """The 3.22M shape (4 layers, d = 256, chunk 64, C = 1/16), rope and lookback, on text."""
    from svattn.data.enwik8 import slice_path
    from svattn.lm import mixer_config, preset

    torch.manual_seed(0)
    cfg = mixer_config(preset("paper-3m", rope=True), "hybrid_sv",
                       {"policy": "full", "lookback": 16})
    model = CharLM(cfg)
    text = slice_path().read_bytes()[:300]
    ref = exact_copy(model)(torch.tensor(list(text))[None])[0][0]
    s = model.stream(snapshot_every=1)
    out = torch.cat([s.feed(text[:100]), s.feed(text[100:101]), s.feed(text[101:])])
    assert (out - ref).abs().max() <= TOL
    s.forget(120, 150)
    assert_same_stream(s, fresh_of(model, text[:120] + text[150:], snapshot_every=0))


def test_cli_generate_forgets_and_verify_forget_checks_it(tmp_path, capsys):
    from svattn.cli import main
    from svattn.lm.train import TrainConfig

    model = make()
    ckpt = tmp_path / "ckpt.pt"
    torch.save({"config": TrainConfig().to_dict(), "model_config": model.cfg.to_dict(),
                "model": model.state_dict(), "step": 0}, ckpt)
    prompt = "the cat sat on the mat; the dog sat on the log"
    argv = ["generate", str(ckpt), "--prompt", prompt, "-n", "6", "--seed", "2",
            "--forget", "4:8", "--receipt", str(tmp_path / "r.json"), "--save",
            str(tmp_path / "st")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "before forgetting: " in out and "after forgetting [4, 8): " in out
    assert "receipt: 4 bytes forgotten" in out
    after = out.split("after forgetting [4, 8): ")[1].split("\n")[0]
    f = fresh_of(model, (prompt[:4] + prompt[8:]).encode())  # the fresh stream's sample
    assert f.generate(6, seed=2).decode("utf-8", "backslashreplace") == after
    # every field checked; the unsigned stream's forget log: authenticity unchecked (3)
    assert main(["verify-forget", str(ckpt), str(tmp_path / "st"), str(tmp_path / "r.json")]) == 3
    out = capsys.readouterr().out
    assert "nothing failed and the stream equals a fresh stream" in out
    assert "the forget log's authenticity" in out and "FAILED" not in out
