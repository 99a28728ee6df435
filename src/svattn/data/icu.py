"""Hourly vital-sign vectors from real ICU data (MIMIC-III demo, PhysioNet 2012).

Both loaders produce the same thing: one row per (stay, hour) with seven vital
signs, in :class:`IcuStays`. They read the files as published (no extraction,
no pandas) and apply the same cleaning, binning and filling, stated here once.

Features (:data:`FEATURES`, in this order)
------------------------------------------
``heart_rate`` (bpm), ``spo2`` (%), ``resp_rate`` (breaths/min), ``sys_bp``,
``dia_bp``, ``mean_bp`` (mmHg), ``temp_c`` (degrees Celsius).

Blood pressure has two sources, invasive arterial (``abp_*`` in MIMIC-III,
``SysABP``/``DiasABP``/``MAP`` in PhysioNet) and the non-invasive cuff
(``nbp_*``; ``NISysABP``/``NIDiasABP``/``NIMAP``). Within an hour the arterial
line is used when it has a value, the cuff otherwise. Temperatures in
Fahrenheit (MIMIC-III ``temp_f``) are converted, ``(F - 32) * 5 / 9``, and
merged with ``temp_c``.

Cleaning
--------
Rows flagged ``error = 1`` (MIMIC-III) and ``-1`` placeholders (PhysioNet) are
dropped. Values outside :data:`VALID_RANGES` (closed intervals, checked after
the Fahrenheit conversion) are taken as charting artefacts and dropped: zeros
used as placeholders, ``11647`` mmHg typos, an SpO2 of 5 %. The ranges are
what a monitored adult can physically show, wide enough to keep every
critical value of :func:`critical_mask`:

=========== ============ =========================================
feature     kept range   why
=========== ============ =========================================
heart_rate  20 - 300     below 20 the monitor is counting artefact
spo2        50 - 100     a saturation reading below 50 % is a probe off
resp_rate   1 - 80       0 is "not counted"; above 80 is artefact
sys_bp      30 - 300
dia_bp      10 - 200
mean_bp     20 - 250
temp_c      25 - 45      covers deliberate hypothermia and hyperpyrexia
=========== ============ =========================================

Hourly binning
--------------
Hour ``h`` of a stay covers ``[t0 + h, t0 + h + 1)`` hours, where ``t0`` is the
stay's first chart time rounded down to the whole hour (MIMIC-III), or the
ICU admission (time ``00:00``, PhysioNet). A feature's value for the hour is
the mean of its kept measurements in that hour. Only hours with at least one
kept measurement become rows (``hour`` keeps the true index, so gaps are
visible): an hour with nothing charted would be an exact copy of the one
before it, and duplicate keys make the memory's optimum non-unique.

Filling
-------
A feature missing from an hour is forward-filled from the last hour of the
*same stay* that had it. What is still missing (a feature not yet charted in
that stay) gets the population median: the median over all observed hourly
values of that feature among the loaded stays, or the ``fill_values`` passed
in (use a training set's ``IcuStays.fill_values`` for a test set). A feature
never observed in any loaded stay falls back to :data:`NORMAL_VALUES`.
``IcuStays.observed`` records which entries were measured in their own hour.

Critical hours
--------------
See :func:`critical_mask`: an hour is critical when, among the values
*measured in that hour* (not filled), heart rate > 130 or < 40, SpO2 < 88,
respiratory rate > 30 or < 8, systolic pressure < 90 or mean arterial
pressure < 65. :mod:`svattn.data.news2` gives a clinical alternative, NEWS2's
high-risk band, scored from the same measured values.
"""

from __future__ import annotations

import csv
import gzip
import io
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from importlib import resources
from pathlib import Path

import numpy as np

__all__ = [
    "FEATURES",
    "MIMIC3_COLUMNS",
    "NORMAL_VALUES",
    "VALID_RANGES",
    "IcuStays",
    "critical_mask",
    "default_slice_path",
    "load_mimic3_vitals",
    "load_physionet2012",
]

FEATURES: tuple[str, ...] = (
    "heart_rate",
    "spo2",
    "resp_rate",
    "sys_bp",
    "dia_bp",
    "mean_bp",
    "temp_c",
)
"""Feature order of every key vector."""

VALID_RANGES: dict[str, tuple[float, float]] = {
    "heart_rate": (20.0, 300.0),
    "spo2": (50.0, 100.0),
    "resp_rate": (1.0, 80.0),
    "sys_bp": (30.0, 300.0),
    "dia_bp": (10.0, 200.0),
    "mean_bp": (20.0, 250.0),
    "temp_c": (25.0, 45.0),
}
"""Closed ranges of physiologically possible values; anything outside is dropped."""

NORMAL_VALUES: dict[str, float] = {
    "heart_rate": 80.0,
    "spo2": 97.0,
    "resp_rate": 18.0,
    "sys_bp": 120.0,
    "dia_bp": 65.0,
    "mean_bp": 83.0,
    "temp_c": 37.0,
}
"""Last-resort fill for a feature that no loaded stay ever measured."""

MIMIC3_COLUMNS: tuple[str, ...] = (
    "icustay_id",
    "charttime",
    "vital",
    "itemid",
    "subject_id",
    "hadm_id",
    "valuenum",
    "valueuom",
    "error",
)
"""Columns of ``mimic3_demo_vitals.csv.gz``."""

# Source channels: (feature, priority). Lower priority wins within an hour.
_SOURCES: dict[str, tuple[str, int]] = {
    "heart_rate": ("heart_rate", 0),
    "spo2": ("spo2", 0),
    "resp_rate": ("resp_rate", 0),
    "abp_sys": ("sys_bp", 0),
    "nbp_sys": ("sys_bp", 1),
    "abp_dia": ("dia_bp", 0),
    "nbp_dia": ("dia_bp", 1),
    "abp_mean": ("mean_bp", 0),
    "nbp_mean": ("mean_bp", 1),
    "temp_c": ("temp_c", 0),
    "temp_f": ("temp_c", 0),
}
_SOURCE_NAMES: tuple[str, ...] = tuple(_SOURCES)
_SOURCE_INDEX: dict[str, int] = {name: i for i, name in enumerate(_SOURCE_NAMES)}

_PHYSIONET_PARAMETERS: dict[str, str] = {
    "HR": "heart_rate",
    "SaO2": "spo2",
    "RespRate": "resp_rate",
    "SysABP": "abp_sys",
    "NISysABP": "nbp_sys",
    "DiasABP": "abp_dia",
    "NIDiasABP": "nbp_dia",
    "MAP": "abp_mean",
    "NIMAP": "nbp_mean",
    "Temp": "temp_c",
}

_SLICE_PACKAGE = "svattn.data"
_SLICE_NAME = "mimic3_demo_vitals_slice.csv.gz"


# ---------------------------------------------------------------------------
# The container
# ---------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class IcuStays:
    """Hourly vital-sign vectors of a set of ICU stays, one row per (stay, hour).

    Rows are grouped by stay (stays in increasing id order) and ordered by
    hour within a stay.

    Attributes
    ----------
    keys : ndarray of float64, shape (N, F)
        The vectors to use as memory keys: the raw vitals, or their z-scores
        after :meth:`standardised`. Never NaN.
    raw : ndarray of float64, shape (N, F)
        The filled vitals in physical units (always; use as memory values).
    observed : ndarray of bool, shape (N, F)
        True where the entry was measured in its own hour, False where it was
        forward-filled or median-filled.
    stay_id, subject_id, hour : ndarray of int64, shape (N,)
        ICU stay, patient, and hour index since the start of the stay.
    critical : ndarray of bool, shape (N,)
        The critical-hour flag of :func:`critical_mask`.
    feature_names : tuple of str
        Column names of ``keys`` (:data:`FEATURES`).
    fill_values : ndarray of float64, shape (F,)
        The per-feature values used for gaps that forward fill could not close.
    mean, std : ndarray of float64, shape (F,), or None
        Set by :meth:`standardised`: ``keys = (raw - mean) / std``.
    source : str
        Where the rows came from (a file name, for reports).

    Examples
    --------
    >>> from svattn.data.icu import default_slice_path, load_mimic3_vitals
    >>> data = load_mimic3_vitals(default_slice_path())
    >>> data.keys.shape[1] == len(data.feature_names) == 7
    True
    >>> z = data.standardised()
    >>> bool(abs(z.keys.mean(axis=0)).max() < 1e-9)
    True
    >>> first = data.select(data.stays()[:2])
    >>> len(first.stays())
    2
    """

    keys: np.ndarray
    raw: np.ndarray
    observed: np.ndarray
    stay_id: np.ndarray
    subject_id: np.ndarray
    hour: np.ndarray
    critical: np.ndarray
    feature_names: tuple[str, ...] = FEATURES
    fill_values: np.ndarray = field(default_factory=lambda: np.array(list(NORMAL_VALUES.values())))
    mean: np.ndarray | None = None
    std: np.ndarray | None = None
    source: str = ""

    def __post_init__(self) -> None:
        n = self.keys.shape[0] if self.keys.ndim == 2 else -1
        f = len(self.feature_names)
        if self.keys.shape != (n, f):
            raise ValueError(f"IcuStays: keys must have shape (N, {f}), got {self.keys.shape}")
        for name in ("raw", "observed"):
            if getattr(self, name).shape != (n, f):
                raise ValueError(
                    f"IcuStays: {name} must have shape ({n}, {f}) like keys, "
                    f"got {getattr(self, name).shape}"
                )
        for name in ("stay_id", "subject_id", "hour", "critical"):
            if getattr(self, name).shape != (n,):
                raise ValueError(
                    f"IcuStays: {name} must have shape ({n},), got {getattr(self, name).shape}"
                )

    def __len__(self) -> int:
        return int(self.keys.shape[0])

    @property
    def n_features(self) -> int:
        """Number of features ``F``."""
        return len(self.feature_names)

    def stays(self) -> np.ndarray:
        """Stay ids in row order (each once).

        Returns
        -------
        ndarray of int64
            The distinct ``stay_id`` values, in the order their rows appear.

        Examples
        --------
        >>> from svattn.data.icu import default_slice_path, load_mimic3_vitals
        >>> ids = load_mimic3_vitals(default_slice_path()).stays()
        >>> bool((ids[1:] > ids[:-1]).all())
        True
        """
        _, first = np.unique(self.stay_id, return_index=True)
        return self.stay_id[np.sort(first)]

    def select(self, stay_ids: Iterable[int]) -> IcuStays:
        """The rows of the given stays (row order kept, standardisation kept).

        Parameters
        ----------
        stay_ids : iterable of int
            Stay ids, each of which must occur in ``self.stay_id``.

        Returns
        -------
        IcuStays
            A new container with only those stays' rows. ``mean``, ``std`` and
            ``fill_values`` are carried over unchanged.

        Raises
        ------
        ValueError
            If a requested stay id is not present.

        Examples
        --------
        >>> from svattn.data.icu import default_slice_path, load_mimic3_vitals
        >>> data = load_mimic3_vitals(default_slice_path())
        >>> one = data.select([data.stays()[0]])
        >>> bool((one.stay_id == data.stays()[0]).all())
        True
        """
        wanted = np.asarray(list(stay_ids), dtype=np.int64).reshape(-1)
        missing = np.setdiff1d(wanted, self.stay_id)
        if missing.size:
            raise ValueError(
                f"select: stay_ids {missing.tolist()} are not in this IcuStays "
                f"({len(self.stays())} stays, e.g. {self.stays()[:3].tolist()})"
            )
        return self._take(np.isin(self.stay_id, wanted))

    def standardised(
        self, mean: np.ndarray | None = None, std: np.ndarray | None = None
    ) -> IcuStays:
        """Z-score the keys per feature with a stored mean and standard deviation.

        Parameters
        ----------
        mean, std : array_like of shape (F,), optional
            Statistics to use, e.g. those of a training set, so that keys of
            different sets are comparable. By default the population mean and
            (population) standard deviation of ``raw`` over all rows. A
            feature with zero spread gets ``std = 1``.

        Returns
        -------
        IcuStays
            A copy whose ``keys`` are ``(raw - mean) / std`` and whose ``mean``
            and ``std`` are set; ``raw`` is unchanged.

        Raises
        ------
        ValueError
            If ``mean`` or ``std`` has the wrong shape, or ``std`` is not
            positive and finite.

        Examples
        --------
        >>> from svattn.data.icu import default_slice_path, load_mimic3_vitals
        >>> data = load_mimic3_vitals(default_slice_path())
        >>> z = data.standardised()
        >>> import numpy as np
        >>> bool(np.allclose(z.keys * z.std + z.mean, data.raw))
        True
        """
        f = self.n_features
        if mean is None:
            mean = self.raw.mean(axis=0) if len(self) else np.zeros(f)
        if std is None:
            std = self.raw.std(axis=0) if len(self) else np.ones(f)
            std = np.where(std > 0, std, 1.0)
        mean = np.asarray(mean, dtype=np.float64)
        std = np.asarray(std, dtype=np.float64)
        if mean.shape != (f,):
            raise ValueError(f"standardised: mean must have shape ({f},), got {mean.shape}")
        if std.shape != (f,):
            raise ValueError(f"standardised: std must have shape ({f},), got {std.shape}")
        if not (np.all(np.isfinite(std)) and np.all(std > 0)):
            raise ValueError(f"standardised: std must be finite and > 0, got {std.tolist()}")
        if not np.all(np.isfinite(mean)):
            raise ValueError(f"standardised: mean must be finite, got {mean.tolist()}")
        return replace(self, keys=(self.raw - mean) / std, mean=mean.copy(), std=std.copy())

    def _take(self, rows: np.ndarray) -> IcuStays:
        return replace(
            self,
            keys=self.keys[rows],
            raw=self.raw[rows],
            observed=self.observed[rows],
            stay_id=self.stay_id[rows],
            subject_id=self.subject_id[rows],
            hour=self.hour[rows],
            critical=self.critical[rows],
        )


# ---------------------------------------------------------------------------
# The critical rule
# ---------------------------------------------------------------------------


def critical_mask(vitals: np.ndarray, feature_names: tuple[str, ...] = FEATURES) -> np.ndarray:
    """Flag critical hours with the thresholds of the project's data README.

    An hour is critical when any of these holds among its values (NaN means
    "not measured" and never triggers):

    * heart rate > 130 or < 40 bpm,
    * SpO2 < 88 %,
    * respiratory rate > 30 or < 8 per minute,
    * systolic pressure < 90 mmHg or mean arterial pressure < 65 mmHg.

    The loaders apply it to the values measured in the hour itself (hourly
    means before any filling), so a single low reading is not carried into
    later hours by the forward fill.

    Parameters
    ----------
    vitals : ndarray, shape (N, F)
        Vital signs in physical units; NaN for missing.
    feature_names : tuple of str
        Column names; must contain all of :data:`FEATURES` except ``dia_bp``
        and ``temp_c``, which the rule does not use.

    Returns
    -------
    ndarray of bool, shape (N,)

    Raises
    ------
    ValueError
        If ``vitals`` is not 2-D with ``len(feature_names)`` columns, or a
        feature the rule needs is missing from ``feature_names``.

    Examples
    --------
    >>> import numpy as np
    >>> nan = np.nan
    >>> rows = np.array([
    ...     [80, 97, 16, 120, 70, 85, 37.0],     # normal
    ...     [135, 97, 16, 120, 70, 85, 37.0],    # tachycardia
    ...     [80, 97, 16, 120, 70, 60, 37.0],     # MAP < 65
    ...     [nan, nan, nan, nan, nan, nan, nan], # nothing measured
    ... ])
    >>> critical_mask(rows).tolist()
    [False, True, True, False]
    """
    vitals = np.asarray(vitals, dtype=np.float64)
    if vitals.ndim != 2 or vitals.shape[1] != len(feature_names):
        raise ValueError(
            f"critical_mask: vitals must have shape (N, {len(feature_names)}), got {vitals.shape}"
        )
    needed = ("heart_rate", "spo2", "resp_rate", "sys_bp", "mean_bp")
    missing = [name for name in needed if name not in feature_names]
    if missing:
        raise ValueError(f"critical_mask: feature_names lacks {missing}, needed by the rule")
    col = {name: vitals[:, feature_names.index(name)] for name in needed}
    with np.errstate(invalid="ignore"):  # NaN comparisons are False, as wanted
        return (
            (col["heart_rate"] > 130)
            | (col["heart_rate"] < 40)
            | (col["spo2"] < 88)
            | (col["resp_rate"] > 30)
            | (col["resp_rate"] < 8)
            | (col["sys_bp"] < 90)
            | (col["mean_bp"] < 65)
        )


# ---------------------------------------------------------------------------
# Loaders
# ---------------------------------------------------------------------------


def default_slice_path() -> Path:
    """Path of the MIMIC-III demo slice shipped with the package.

    The slice holds whole stays of ``mimic3_demo_vitals.csv.gz`` (see
    ``scripts/make_slices.py`` and the ``SLICE.md`` next to it for how it was
    cut). Its licence is the ODbL 1.0 (``MIMIC3_DEMO_LICENSE.md`` beside it).

    Returns
    -------
    pathlib.Path

    Examples
    --------
    >>> from svattn.data.icu import default_slice_path
    >>> default_slice_path().name
    'mimic3_demo_vitals_slice.csv.gz'
    """
    return Path(str(resources.files(_SLICE_PACKAGE).joinpath("slices", _SLICE_NAME)))


def load_mimic3_vitals(
    path: str | Path, *, fill_values: np.ndarray | None = None
) -> IcuStays:
    """Load hourly vital-sign vectors from the MIMIC-III demo vitals file.

    Reads ``mimic3_demo_vitals.csv.gz`` (or a slice of it, or the same CSV
    uncompressed) with columns :data:`MIMIC3_COLUMNS`, then cleans, bins to
    hours, forward-fills and median-fills as described in the module
    docstring.

    The critical flag: an hour is critical when, among the values measured in
    that hour, heart rate > 130 or < 40, SpO2 < 88, respiratory rate > 30 or
    < 8, systolic < 90 or mean arterial pressure < 65 (:func:`critical_mask`).

    Parameters
    ----------
    path : str or Path
        The CSV file, gzip-compressed or not (detected from its first bytes).
    fill_values : array_like of shape (7,), optional
        Values for gaps forward fill cannot close; by default the median of
        the observed hourly values of these stays.

    Returns
    -------
    IcuStays
        Unstandardised: ``keys`` equals ``raw``.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If the header lacks a required column, a row cannot be parsed, or
        ``fill_values`` has the wrong shape.

    Examples
    --------
    >>> from svattn.data.icu import default_slice_path, load_mimic3_vitals
    >>> data = load_mimic3_vitals(default_slice_path())
    >>> data.feature_names
    ('heart_rate', 'spo2', 'resp_rate', 'sys_bp', 'dia_bp', 'mean_bp', 'temp_c')
    >>> import numpy as np
    >>> bool(np.isnan(data.keys).any())
    False
    """
    path = _existing_file(path, "load_mimic3_vitals")
    stays: list[int] = []
    subjects: list[int] = []
    hours: list[int] = []
    sources: list[int] = []
    values: list[float] = []
    t0: dict[int, datetime] = {}
    with _open_text(path) as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"load_mimic3_vitals: '{path}' is empty, expected a CSV header")
        header = [h.strip() for h in header]
        missing = [c for c in MIMIC3_COLUMNS if c not in header]
        if missing:
            raise ValueError(
                f"load_mimic3_vitals: '{path}' lacks columns {missing}; expected a header "
                f"with {list(MIMIC3_COLUMNS)}"
            )
        ix = {c: header.index(c) for c in MIMIC3_COLUMNS}
        for line_no, row in enumerate(reader, start=2):
            if not row:
                continue
            try:
                vital = row[ix["vital"]]
                if vital not in _SOURCE_INDEX:
                    continue
                if row[ix["error"]].strip() not in ("", "0"):
                    continue
                text = row[ix["valuenum"]].strip()
                if not text:
                    continue
                value = float(text)
                stay = int(row[ix["icustay_id"]])
                subject = int(row[ix["subject_id"]])
                when = datetime.fromisoformat(row[ix["charttime"]].strip())
            except (ValueError, IndexError) as exc:
                raise ValueError(
                    f"load_mimic3_vitals: cannot parse line {line_no} of '{path}': {row!r} ({exc})"
                ) from exc
            if vital == "temp_f":
                value = (value - 32.0) * 5.0 / 9.0
            start = t0.get(stay)
            if start is None:
                start = t0[stay] = when.replace(minute=0, second=0, microsecond=0)
            elif when < start:
                raise ValueError(
                    f"load_mimic3_vitals: line {line_no} of '{path}' goes back in time "
                    f"({when} before the stay's first hour {start}); rows must be sorted by "
                    "stay and time"
                )
            stays.append(stay)
            subjects.append(subject)
            hours.append(int((when - start).total_seconds() // 3600))
            sources.append(_SOURCE_INDEX[vital])
            values.append(value)
    return _bin_hourly(
        np.array(stays, dtype=np.int64),
        np.array(subjects, dtype=np.int64),
        np.array(hours, dtype=np.int64),
        np.array(sources, dtype=np.int64),
        np.array(values, dtype=np.float64),
        fill_values=fill_values,
        source=path.name,
        caller="load_mimic3_vitals",
    )


def load_physionet2012(
    path: str | Path,
    max_stays: int | None = None,
    *,
    fill_values: np.ndarray | None = None,
) -> IcuStays:
    """Load hourly vital-sign vectors from PhysioNet Challenge 2012 (set A).

    Reads the ``Time,Parameter,Value`` record files straight from the
    ``.tar.gz`` (nothing is extracted to disk). Parameters map to the
    features as ``HR`` -> heart_rate, ``SaO2`` -> spo2 (an arterial blood-gas
    saturation, the only saturation the challenge provides, so rarely
    measured), ``RespRate``, ``SysABP``/``NISysABP`` -> sys_bp,
    ``DiasABP``/``NIDiasABP`` -> dia_bp, ``MAP``/``NIMAP`` -> mean_bp,
    ``Temp`` -> temp_c. Hour ``h`` covers minutes ``[60 h, 60 h + 60)`` after ICU
    admission. The challenge has no patient id: ``subject_id`` is the
    ``RecordID``, like ``stay_id``. Cleaning, binning, filling and the
    critical flag are those of the module docstring.

    Parameters
    ----------
    path : str or Path
        ``physionet2012_set-a.tar.gz`` (or a tar of the same layout: one
        ``<RecordID>.txt`` per stay; other members are ignored).
    max_stays : int, optional
        Load only the first ``max_stays`` records in increasing ``RecordID``
        order.
    fill_values : array_like of shape (7,), optional
        As for :func:`load_mimic3_vitals`.

    Returns
    -------
    IcuStays

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If ``path`` is not a readable tar archive, it has no record files,
        a record cannot be parsed, or ``max_stays`` is not a positive int.

    Examples
    --------
    >>> from svattn.data.icu import load_physionet2012
    >>> data = load_physionet2012(
    ...     "/work/shared/data/icu/physionet2012_set-a.tar.gz", max_stays=5
    ... )  # doctest: +SKIP
    >>> len(data.stays())  # doctest: +SKIP
    5
    """
    path = _existing_file(path, "load_physionet2012")
    if max_stays is not None and (
        isinstance(max_stays, bool) or not isinstance(max_stays, int) or max_stays < 1
    ):
        raise ValueError(f"load_physionet2012: max_stays must be a positive int, got {max_stays!r}")
    stays: list[int] = []
    hours: list[int] = []
    sources: list[int] = []
    values: list[float] = []
    # One sequential pass in stream mode: random access into a .tar.gz would
    # re-decompress from the start for every member.
    records: dict[int, tuple[str, bytes]] = {}
    try:
        with tarfile.open(path, mode="r|*") as archive:
            for member in archive:
                record = _record_id(member.name) if member.isfile() else None
                handle = archive.extractfile(member) if record is not None else None
                if handle is not None and record is not None:
                    records[record] = (member.name, handle.read())
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ValueError(
            f"load_physionet2012: '{path}' is not a readable tar archive ({exc})"
        ) from exc
    if not records:
        raise ValueError(f"load_physionet2012: '{path}' holds no '<RecordID>.txt' record files")
    chosen = sorted(records)[:max_stays] if max_stays is not None else sorted(records)
    for record in chosen:
        name, payload = records[record]
        text = io.StringIO(payload.decode("utf-8"), newline="")
        for stay, hour, channel, value in _parse_physionet_record(text, name):
            stays.append(stay)
            hours.append(hour)
            sources.append(channel)
            values.append(value)
    stay_arr = np.array(stays, dtype=np.int64)
    return _bin_hourly(
        stay_arr,
        stay_arr.copy(),
        np.array(hours, dtype=np.int64),
        np.array(sources, dtype=np.int64),
        np.array(values, dtype=np.float64),
        fill_values=fill_values,
        source=path.name,
        caller="load_physionet2012",
    )


# ---------------------------------------------------------------------------
# Internals
# ---------------------------------------------------------------------------


def _existing_file(path: str | Path, caller: str) -> Path:
    if not isinstance(path, str | Path):
        raise TypeError(f"{caller}: path must be a str or pathlib.Path, got {type(path).__name__}")
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{caller}: path '{p}' does not exist")
    if not p.is_file():
        raise ValueError(f"{caller}: path '{p}' is not a regular file")
    return p


def _open_text(path: Path) -> io.TextIOBase:
    with open(path, "rb") as probe:
        magic = probe.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, mode="rt", encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def _record_id(name: str) -> int | None:
    stem = name.rsplit("/", 1)[-1]
    if not stem.endswith(".txt"):
        return None
    stem = stem[: -len(".txt")]
    return int(stem) if stem.isdigit() else None


def _parse_physionet_record(
    handle: Iterable[str], name: str
) -> Iterator[tuple[int, int, int, float]]:
    reader = csv.reader(handle)
    header = next(reader, None)
    if header is None or [h.strip() for h in header[:3]] != ["Time", "Parameter", "Value"]:
        raise ValueError(
            f"load_physionet2012: member '{name}' must start with the header "
            f"'Time,Parameter,Value', got {header!r}"
        )
    stay = _record_id(name)
    assert stay is not None
    for line_no, row in enumerate(reader, start=2):
        if not row:
            continue
        try:
            parameter = row[1].strip()
            if parameter == "RecordID":
                stay = int(float(row[2]))
                continue
            channel = _PHYSIONET_PARAMETERS.get(parameter)
            if channel is None:
                continue
            value = float(row[2])
            hh, mm = row[0].strip().split(":")
            minutes = int(hh) * 60 + int(mm)
        except (ValueError, IndexError) as exc:
            raise ValueError(
                f"load_physionet2012: cannot parse line {line_no} of member '{name}': "
                f"{row!r} ({exc})"
            ) from exc
        if value == -1.0:  # the challenge's "missing"
            continue
        yield stay, minutes // 60, _SOURCE_INDEX[channel], value


def _bin_hourly(
    stay: np.ndarray,
    subject: np.ndarray,
    hour: np.ndarray,
    channel: np.ndarray,
    value: np.ndarray,
    *,
    fill_values: np.ndarray | None,
    source: str,
    caller: str,
) -> IcuStays:
    """Clean, bin, fill: the steps of the module docstring, shared by both loaders."""
    n_features = len(FEATURES)
    if fill_values is not None:
        fill_values = np.asarray(fill_values, dtype=np.float64)
        if fill_values.shape != (n_features,) or not np.all(np.isfinite(fill_values)):
            raise ValueError(
                f"{caller}: fill_values must be {n_features} finite numbers (one per feature "
                f"{FEATURES}), got {fill_values.tolist()}"
            )

    # Cleaning: drop values outside the physiological ranges.
    feature_of_channel = np.array([FEATURES.index(_SOURCES[c][0]) for c in _SOURCE_NAMES])
    lo = np.array([VALID_RANGES[f][0] for f in FEATURES])[feature_of_channel[channel]]
    hi = np.array([VALID_RANGES[f][1] for f in FEATURES])[feature_of_channel[channel]]
    keep = np.isfinite(value) & (value >= lo) & (value <= hi)
    stay, subject, hour, channel, value = (a[keep] for a in (stay, subject, hour, channel, value))
    if stay.size == 0:
        raise ValueError(f"{caller}: '{source}' has no valid vital-sign measurements")

    # Hourly bins: one group per (stay, hour), sorted by stay then hour.
    groups, inverse = np.unique(np.stack([stay, hour], axis=1), axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    n_groups = groups.shape[0]
    sums = np.zeros((n_groups, len(_SOURCE_NAMES)))
    counts = np.zeros((n_groups, len(_SOURCE_NAMES)))
    np.add.at(sums, (inverse, channel), value)
    np.add.at(counts, (inverse, channel), 1.0)

    # Per feature: the mean over the best-priority source present in the hour.
    hourly = np.full((n_groups, n_features), np.nan)  # (G, F)
    for j, name in enumerate(FEATURES):
        priorities = sorted({p for c, (f, p) in _SOURCES.items() if f == name})
        for prio in priorities:
            cols = [i for i, c in enumerate(_SOURCE_NAMES) if _SOURCES[c] == (name, prio)]
            s, k = sums[:, cols].sum(axis=1), counts[:, cols].sum(axis=1)
            take = np.isnan(hourly[:, j]) & (k > 0)
            hourly[take, j] = s[take] / k[take]
    observed = ~np.isnan(hourly)
    critical = critical_mask(hourly)

    # Subject per group, checking one subject per stay.
    group_subject = np.zeros(n_groups, dtype=np.int64)
    group_subject[inverse] = subject
    stay_ids = groups[:, 0]
    starts = np.flatnonzero(np.r_[True, stay_ids[1:] != stay_ids[:-1]])
    per_stay_subject = np.repeat(group_subject[starts], np.diff(np.r_[starts, n_groups]))
    clash = per_stay_subject != group_subject
    if clash.any():
        bad = int(stay_ids[np.flatnonzero(clash)[0]])
        raise ValueError(f"{caller}: stay {bad} in '{source}' has rows of more than one subject")

    # Fill values: population median of observed hourly values (or as given).
    if fill_values is None:
        fill_values = np.array(
            [
                float(np.median(hourly[observed[:, j], j])) if observed[:, j].any()
                else NORMAL_VALUES[name]
                for j, name in enumerate(FEATURES)
            ]
        )

    # Forward fill within each stay, then the fill values.
    stay_start = np.repeat(starts, np.diff(np.r_[starts, n_groups]))  # (G,)
    rows = np.arange(n_groups)[:, None]
    last = np.maximum.accumulate(np.where(observed, rows, -1), axis=0)  # (G, F)
    carried = last >= stay_start[:, None]
    filled = np.where(
        carried, hourly[np.maximum(last, 0), np.arange(n_features)], fill_values[None, :]
    )
    return IcuStays(
        keys=filled.copy(),
        raw=filled,
        observed=observed,
        stay_id=stay_ids.astype(np.int64),
        subject_id=group_subject,
        hour=groups[:, 1].astype(np.int64),
        critical=critical,
        feature_names=FEATURES,
        fill_values=fill_values.copy(),
        source=source,
    )
