"""Every figure docs/design.md §7 (scale) quotes is in the record it cites: each is read
back from ``results/`` and formatted as the text prints it, and the figures the text marks
*arithmetic* are recomputed from the recorded ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SECTION_START = "## 7. Scale: what one machine holds"


def _section() -> str:
    text = (ROOT / "docs" / "design.md").read_text()
    start = text.index(SECTION_START)
    end = text.index("\n## ", start + 1)
    return " ".join(text[start:end].split())


def _record(rel: str) -> dict:
    return json.loads((ROOT / rel).read_text())


def _row(rel: str, **match) -> dict:
    rows = [r for r in _record(rel)["rows"] if all(r.get(k) == v for k, v in match.items())]
    assert len(rows) == 1, f"{rel}: {len(rows)} rows match {match}"
    return rows[0]


def _rows(rel: str, **match) -> list[dict]:
    return [r for r in _record(rel)["rows"] if all(r.get(k) == v for k, v in match.items())]


LARGE = "results/bench_large_support.json"
SCALING = "results/bench_scaling.json"
SYN = "results/verify_cost/synthetic_128k.json"
MIMIC = "results/verify_cost/mimic_gamma1.json"
PICKLE = "results/bench_pickle.json"
SCALE = "results/bench_memory_scale.json"
MIB = 2 ** 20


def _bytes_per_row_per_vector() -> tuple[float, float]:
    wide = _row(LARGE, n=32000, gamma=0.1)
    per_32k = wide["state_bytes_per_token"] / (wide["margin"] + wide["error"])
    syn = _record(SYN)
    per_128k = syn["cli_parts"]["kernel_cache_MiB"] * MIB / syn["n_rows"] / syn["support_after"]
    return per_32k, per_128k


def _figures() -> list[tuple[str, str]]:
    """(the phrase as the text prints it, the same phrase built from the record)."""
    wide = _row(LARGE, n=32000, gamma=0.1)
    narrow = sorted(_rows(LARGE, gamma=0.01), key=lambda r: r["n"])
    scal = [r for r in _record(SCALING)["rows"] if r["n"] == 64000 and r["stream"] == "redundant"]
    assert len(scal) == 1
    scal = scal[0]
    exponent = _record(SCALING)["exponents"]["redundant"]["bytes_per_token"]
    syn, mimic, pick = _record(SYN), _record(MIMIC), _record(PICKLE)
    lo, hi = sorted(_bytes_per_row_per_vector())
    margins = [r["margin"] for r in narrow]
    per_row_bounded = scal["bytes_per_token"]
    rule = 12.5

    def need_gb(n: int, per: float) -> float:
        return n * (wide["margin"] + 0.05 * n) * per / 1e9

    return [
        (f"{lo:.0f}–{hi:.1f} bytes per row", "11–12.5 bytes per row"),
        (f"{wide['state_bytes_per_token']:,.0f} bytes per row over {wide['margin']:,} margin "
         f"and {wide['error']:,} error vectors at n = {wide['n']:,}",
         "28,066 bytes per row over 1,144 margin and 1,095 error vectors at n = 32,000"),
        (f"a {syn['cli_parts']['kernel_cache_MiB']:.1f} MiB cache over {syn['n_rows']:,} rows "
         f"and {syn['support_after']} support vectors",
         "a 698.2 MiB cache over 128,000 rows and 520 support vectors"),
        (f"error set grows from {narrow[0]['error']} to {narrow[-1]['error']:,} vectors and the "
         f"state from {narrow[0]['state_bytes_per_token']:,.0f} to "
         f"{narrow[-1]['state_bytes_per_token']:,.0f} bytes per row between "
         f"{narrow[0]['n']:,} and {narrow[-1]['n']:,} rows, while the margin stays at "
         f"{min(margins)}–{max(margins)}",
         "error set grows from 87 to 1,590 vectors and the state from 2,220 to 18,981 bytes "
         "per row between 2,000 and 32,000 rows, while the margin stays at 20–27"),
        (f"{per_row_bounded:,.0f} bytes per row at {scal['n']:,} rows of d = {scal['d']} with "
         f"{scal['margin']} margin and {scal['error']} error vectors, fitted exponent "
         f"{exponent:.2f}".replace("-", "−"),
         "2,774 bytes per row at 64,000 rows of d = 64 with 37 margin and 83 error vectors, "
         "fitted exponent −0.05"),
        (f"about {24e9 / per_row_bounded / 1e6:.2f} million rows in 24 GB",
         "about 8.65 million rows in 24 GB"),
        (f"about {need_gb(256_000, rule):.1f} GB at 256,000 rows",
         "about 44.6 GB at 256,000 rows"),
        (f"at {syn['cli']['peak_rss_MiB']:,.1f} MiB peak resident memory",
         "at 1,131.0 MiB peak resident memory"),
        (f"the {mimic['n_after']:,} MIMIC-III demo rows left after one patient's erasure, at "
         f"ν = {mimic['nu']} ({mimic['support_after']:,} support vectors",
         "the 13,497 MIMIC-III demo rows left after one patient's erasure, at ν = 0.5 "
         "(6,903 support vectors"),
        (f"at {mimic['cli']['peak_rss_MiB']:,.1f} MiB, of which the kernel cache is "
         f"{mimic['cli_parts']['kernel_cache_MiB']:,.1f} MiB",
         "at 1,269.5 MiB, of which the kernel cache is 1,024.0 MiB"),
        (f"a pickled {pick['n']:,}-row `SVDD` is {pick['pickle_bytes']:,} bytes against "
         f"{pick['cache_bytes']:,} bytes of cache",
         "a pickled 20,000-row `SVDD` is 14,507,260 bytes against 183,840,000 bytes of cache"),
    ] + _scale_figures()


def _scale_figures() -> list[tuple[str, str]]:
    """The measured fit at each size (``results/bench_memory_scale.json``), as the text
    prints it."""
    return [(f"{r['n']:,} rows: {r['svdd_peak_rss_MiB']:,.0f} MiB peak against libsvm's "
             f"{r['ocsvm_peak_rss_MiB']:,.0f} MiB, a state of {r['svdd_state_bytes_per_row']:,.0f} "
             f"bytes per row with {r['svdd_margin']:,} margin and {r['svdd_error']:,} error "
             f"vectors, the fit {r['fit_wall_ratio']:.2f}× libsvm's time", QUOTED_SCALE[r["n"]])
            for r in _record(SCALE)["rows"]]


QUOTED_SCALE = {  # the text's phrases
    32000: ("32,000 rows: 638 MiB peak against libsvm's 358 MiB, a state of 12,313 bytes "
        "per row with 1,149 margin and 1,099 error vectors, the fit 1.56× libsvm's time"),
    64000: ("64,000 rows: 1,013 MiB peak against libsvm's 365 MiB, a state of 12,983 bytes "
        "per row with 1,219 margin and 2,617 error vectors, the fit 0.86× libsvm's time"),
    128000: ("128,000 rows: 1,556 MiB peak against libsvm's 380 MiB, a state of 11,932 bytes "
        "per row with 1,131 margin and 5,841 error vectors, the fit 0.85× libsvm's time"),
}


@pytest.mark.parametrize("index", range(11 + 3))
def test_each_quoted_figure_is_the_cited_records(index):
    from_record, quoted = _figures()[index]
    assert from_record == quoted, "the record no longer says what the text quotes"
    assert quoted in _section(), f"docs/design.md §7 no longer quotes: {quoted}"


def test_the_figure_table_covers_every_cited_record():
    section = _section()
    for rel in (LARGE, SCALING, SYN, MIMIC, PICKLE, SCALE):
        assert f"`{rel}`" in section
        assert (ROOT / rel).is_file()
    assert len(_figures()) == 11 + len(_record(SCALE)["rows"])


def test_the_rule_of_12_5_bytes_is_the_large_n_value():
    """The section's 12.5·n·(|M| + |E|) rule: bytes per row per support vector fall with n
    at each γ and are at most 12.5 (to the rounding the text prints) from 32,000 rows on;
    the small-n figure the text gives (25.7 at 2,000 rows) is the record's."""
    section = _section()
    assert "12.5·n·(|M| + |E|)" in section
    rows = _record(LARGE)["rows"]
    for gamma in {r["gamma"] for r in rows}:
        series = sorted((r for r in rows if r["gamma"] == gamma), key=lambda r: r["n"])
        per = [r["state_bytes_per_token"] / (r["margin"] + r["error"]) for r in series]
        assert per == sorted(per, reverse=True), f"gamma={gamma}: not falling with n: {per}"
        assert all(round(p, 1) <= 12.5 for p, r in zip(per, series, strict=True)
                   if r["n"] >= 32000)
    small = _row(LARGE, n=2000, gamma=0.1)
    quoted = (f"{small['state_bytes_per_token'] / (small['margin'] + small['error']):.1f} bytes "
              f"at {small['n']:,} rows with {small['margin']} margin vectors")
    assert quoted == "25.7 bytes at 2,000 rows with 560 margin vectors"
    assert quoted in section
