"""docs/usage.md, "Choosing C": the rule it states holds in the code, the numbers it
quotes are those of its record, and the record is what its script writes now."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics.pairwise import rbf_kernel

from script_helpers import load_script
from svattn.exact.core.conventions import warmup_threshold
from svattn.nn import sv_attention_state

ROOT = Path(__file__).resolve().parents[1]


def _section() -> str:
    text = (ROOT / "docs" / "usage.md").read_text()
    start = text.index("## Choosing C")
    return " ".join(text[start:text.index("\n## ", start + 1)].split())


def _record() -> dict:
    return json.loads((ROOT / "results" / "choosing_c.json").read_text())


def test_the_rule_holds_in_attention_and_in_svdd():
    """At most ⌊1/C⌋ items at the box, at least ⌈1/C⌉ with weight, C = 1/k lets k
    items carry all the mass: checked on random keys and on the figure's SVDD fits."""
    assert "at most ⌊1/C⌋ items can sit at the box, and at least ⌈1/C⌉ must carry weight" \
        in _section()
    g = torch.Generator().manual_seed(0)
    k = torch.randn(4, 2, 40, 3, generator=g, dtype=torch.float64)
    for C in (1 / 3, 1 / 8, 0.07, 1 / 40):
        _, alpha, part, _ = sv_attention_state(k, k, k, C=C, mode="exact")
        assert (part.error.sum(-1) <= math.floor(1 / C + 1e-9)).all()
        assert ((alpha > 0).sum(-1) >= warmup_threshold(C)).all()
    _, alpha, part, _ = sv_attention_state(k, k, k, C=1 / 40, mode="exact")  # k = n = 40
    torch.testing.assert_close(alpha, torch.full_like(alpha, 1 / 40), rtol=0, atol=1e-12)
    for row in _record()["svdd"]["rows"]:
        assert row["at_box"] <= math.floor(1 / row["C"] + 1e-9)
        assert row["support"] >= warmup_threshold(row["C"])


def test_the_record_is_what_the_script_writes():
    script = load_script("scripts/plot_choosing_c.py")
    assert script.record(ROOT) == _record()
    assert (ROOT / "results" / "choosing_c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "![Choosing C](../results/choosing_c.png)" in _section()


def test_the_numbers_quoted_are_the_records():
    text, rec = _section(), _record()
    hyb = {round(1 / r["C"]): r for r in rec["grid"]["hybrid"]}
    assert f"**{rec['grid']['num_data']} data tokens**" in text
    assert "({})".format(", ".join(f"{a:.3f}" for a in hyb[8]["accuracy"])) in text
    assert f"one seed falls to {min(hyb[16]['accuracy']):.3f}" in text
    assert f"8·C = {hyb[16]['data_mass_cap']:g}" in text
    lo, hi = min(hyb[16]["data_mass"]), max(hyb[16]["data_mass"])
    assert f"observed {math.floor(lo * 100) / 100:.2f}–{math.ceil(hi * 100) / 100:.2f}" in text
    assert (f"({min(hyb[4]['accuracy']):.3f}–{max(hyb[4]['accuracy']):.3f})") in text
    count = [s for r in hyb.values() for s in r["support_per_head"]]
    assert f"({min(count):.1f}–{max(count):.1f} per head)" in text
    assert all(min(r["support_per_head"]) >= r["least_support"] for r in hyb.values())
    support = [s for r in hyb.values() for s in r["distinct_support_per_head"]]
    assert f"{math.floor(min(support))}–{math.ceil(max(support))} distinct keys" in text
    # copies of one key share the weight: by distinct keys fewer than the box's least count
    assert min(hyb[16]["distinct_support_per_head"]) < hyb[16]["least_support"]
    assert f"fewer than ⌈1/C⌉ = {hyb[16]['least_support']} at C = 1/16" in text
    assert max(np.mean(hyb[8]["accuracy"]), np.mean(hyb[4]["accuracy"]),
               np.mean(hyb[16]["accuracy"])) == np.mean(hyb[8]["accuracy"])
    small, mid, wide = rec["svdd"]["rows"]
    assert f"C = 1/4 (ν = {small['nu_']:.2f}) has {small['support']} support vectors" in text
    outside = round(small["outlier_fraction"] * rec["svdd"]["n"])
    said = "no row" if outside == 0 else f"{outside} rows"
    assert small["at_box"] == 0 and f"none at the box, and {said} outside" in text
    assert (f"C = 1/40 (ν = {mid['nu_']:.2f}) has {mid['support']} support vectors and calls "
            f"{mid['outlier_fraction']:.0%} of the rows outliers") in text
    assert (f"C = 1/150 (ν = {wide['nu_']:.2f}) has {wide['support']} support vectors and "
            f"{wide['outlier_fraction']:.0%} outliers") in text


def test_the_warning_it_names_is_the_code_s():
    text = _section()
    assert "`svattn.estimators.InfeasibleBoxWarning`" in text
    m = re.search(r"`SVDD\(C=([0-9.]+)\)` on (\d+) rows: it needs ([0-9,]+)", text)
    C, n, need = float(m.group(1)), int(m.group(2)), int(m.group(3).replace(",", ""))
    assert n * C < 1 and warmup_threshold(C) == need
    from svattn import SVDD
    from svattn.estimators import InfeasibleBoxWarning
    assert "`(2·mean_i k(x_i, x) − 1)/(2C)`" in text
    outside = []
    for seed in range(4):
        X = np.random.default_rng(seed).normal(size=(n, 2))
        with pytest.warns(InfeasibleBoxWarning, match=f"until it holds {need} rows"):
            model = SVDD(C=C).fit(X)
        mean_k = rbf_kernel(X, X, gamma=model.gamma_).mean(1)
        np.testing.assert_allclose(model.decision_function(X), (2 * mean_k - 1) / (2 * C),
                                   rtol=0, atol=1e-9)
        outside.append(np.mean(model.predict(X) == -1))
    assert "usually leaves most rows, often all, outliers" in text
    assert min(outside) > 0.5 and max(outside) == 1.0
