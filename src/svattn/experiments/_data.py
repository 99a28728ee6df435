"""Data the experiments read: ICU stays and text, quick (shipped) or full (``--data-dir``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from svattn.experiments._common import Context


def icu_population(ctx: Context, *, physionet: bool = False, max_stays: int | None = None):
    """Standardised hourly ICU stays and a label of where they came from.

    Quick mode, or no data folder: the MIMIC-III demo slice shipped with the
    package (30 stays). Full mode: ``<data_dir>/icu/mimic3_demo_vitals.csv.gz``
    (136 stays) or, with ``physionet=True``, PhysioNet 2012 set A.

    Returns
    -------
    (IcuStays, str)
    """
    from svattn.data.icu import default_slice_path, load_mimic3_vitals, load_physionet2012

    if not ctx.quick and ctx.data_dir is not None:
        if physionet:
            path = ctx.data_dir / "icu" / "physionet2012_set-a.tar.gz"
            if path.exists():
                data = load_physionet2012(path, max_stays=max_stays)
                return data.standardised(), f"PhysioNet 2012 set A ({len(data.stays())} stays)"
        path = ctx.data_dir / "icu" / "mimic3_demo_vitals.csv.gz"
        if path.exists():
            data = load_mimic3_vitals(path)
            return data.standardised(), f"MIMIC-III demo v1.4 ({len(data.stays())} stays)"
    data = load_mimic3_vitals(default_slice_path())
    label = f"MIMIC-III demo slice shipped with svattn ({len(data.stays())} stays)"
    return data.standardised(), label


def unique_rows(x: np.ndarray) -> np.ndarray:
    """The distinct rows of ``x`` in first-occurrence order."""
    _, first = np.unique(x, axis=0, return_index=True)
    return x[np.sort(first)]


def text_corpus(ctx: Context, n_bytes: int) -> tuple[bytes, str]:
    """Bytes of text to train a small character model on, and their label.

    Full mode with ``<data_dir>/enwik8/enwik8_prefix.bin``: the first
    ``n_bytes`` of the enwik8 prefix's documented training split (first 90 %).
    Otherwise (quick): the svattn package's own Python sources and docs, which
    ship with it (no enwik8).
    """
    if not ctx.quick and ctx.data_dir is not None:
        path = ctx.data_dir / "enwik8" / "enwik8_prefix.bin"
        if path.exists():
            raw = path.read_bytes()
            train = raw[: int(0.9 * len(raw))]
            return train[:n_bytes], f"enwik8 prefix, first {min(n_bytes, len(train)):,} bytes"
    import svattn

    root = Path(svattn.__file__).parent
    parts = [p.read_bytes() for p in sorted(root.rglob("*.py"))]
    text = b"\n".join(parts)
    return text[:n_bytes], f"svattn's own source text, {min(n_bytes, len(text)):,} bytes"
