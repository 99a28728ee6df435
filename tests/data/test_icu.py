"""ICU vital-sign loaders: the shipped slice, hand-made files with known answers, errors."""

from __future__ import annotations

import doctest
import gzip
import hashlib
import importlib.util
import io
import tarfile
from pathlib import Path

import numpy as np
import pytest

from svattn.data import icu
from svattn.data.icu import (
    FEATURES,
    critical_mask,
    default_slice_path,
    load_mimic3_vitals,
    load_physionet2012,
)

REPO = Path(__file__).resolve().parents[2]
SHARED_ICU = Path("/work/shared/data/icu")
HEADER = "icustay_id,charttime,vital,itemid,subject_id,hadm_id,valuenum,valueuom,error\n"
F = {name: j for j, name in enumerate(FEATURES)}


def _row(stay, time, vital, value, subject=10, error=""):
    return f"{stay},{time},{vital},0,{subject},1,{value},u,{error}\n"


# Stay 1 (subject 10): hours 0, 1, 3 (hour 2 has nothing). Stay 2 (subject 20): hour 0.
TINY_ROWS = [
    _row(1, "2100-01-01 00:30:00", "heart_rate", 100),
    _row(1, "2100-01-01 00:30:00", "spo2", 97),
    _row(1, "2100-01-01 00:30:00", "resp_rate", 16),
    _row(1, "2100-01-01 00:30:00", "nbp_sys", 120),
    _row(1, "2100-01-01 00:30:00", "nbp_dia", 70),
    _row(1, "2100-01-01 00:30:00", "nbp_mean", 85),
    _row(1, "2100-01-01 00:30:00", "temp_f", 98.6),
    _row(1, "2100-01-01 00:45:00", "heart_rate", 110),
    _row(1, "2100-01-01 01:10:00", "abp_sys", 100),  # arterial beats the cuff
    _row(1, "2100-01-01 01:10:00", "nbp_sys", 130),
    _row(1, "2100-01-01 01:10:00", "heart_rate", 0),  # impossible: dropped
    _row(1, "2100-01-01 01:59:59", "spo2", 85),  # critical
    _row(1, "2100-01-01 03:05:00", "heart_rate", 90, error=1),  # flagged: dropped
    _row(1, "2100-01-01 03:05:00", "resp_rate", 20),
    _row(2, "2100-02-01 10:00:00", "heart_rate", 60, subject=20),
    _row(2, "2100-02-01 10:00:00", "temp_c", 36.0, subject=20),
]


@pytest.fixture()
def tiny(tmp_path: Path) -> icu.IcuStays:
    path = tmp_path / "tiny.csv.gz"
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write(HEADER + "".join(TINY_ROWS))
    return load_mimic3_vitals(path)


@pytest.fixture(scope="module")
def shipped() -> icu.IcuStays:
    return load_mimic3_vitals(default_slice_path())


# --- the shipped slice ------------------------------------------------------


def test_slice_shapes_and_no_nan(shipped: icu.IcuStays) -> None:
    n = len(shipped)
    assert n > 1000
    assert shipped.keys.shape == shipped.raw.shape == shipped.observed.shape == (n, 7)
    for name in ("stay_id", "subject_id", "hour", "critical"):
        assert getattr(shipped, name).shape == (n,)
    assert shipped.keys.dtype == np.float64 and shipped.critical.dtype == bool
    assert not np.isnan(shipped.keys).any()
    assert len(shipped.stays()) == 30
    assert 0.05 < shipped.critical.mean() < 0.6
    # Every kept value lies in its physiological range (fill values included).
    for name, (lo, hi) in icu.VALID_RANGES.items():
        assert lo <= shipped.raw[:, F[name]].min() and shipped.raw[:, F[name]].max() <= hi
    # Rows grouped by stay, hours strictly increasing within a stay.
    same = shipped.stay_id[1:] == shipped.stay_id[:-1]
    assert (np.diff(shipped.hour)[same] > 0).all()
    assert (np.diff(shipped.stay_id) >= 0).all()


def test_slice_files_licence_and_size() -> None:
    folder = default_slice_path().parent
    assert default_slice_path().stat().st_size <= 1_000_000
    assert (folder / "MIMIC3_DEMO_LICENSE.md").is_file() and (folder / "CITATION").is_file()
    recorded = (folder / "SLICE.md").read_text()
    digest = hashlib.sha256(default_slice_path().read_bytes()).hexdigest()
    assert digest in recorded
    assert "cc06f2b9cc34148f088730817879dbe8431f2027278c9d43de3cca3d525c5834" in recorded


@pytest.mark.skipif(
    not (SHARED_ICU / "mimic3_demo_vitals.csv.gz").is_file(),
    reason="the full MIMIC-III demo file (the slice's source) is not on this machine",
)
def test_slice_is_reproducible(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("make_slices", REPO / "scripts/make_slices.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--source", str(SHARED_ICU), "--out", str(tmp_path)]) == 0
    assert (tmp_path / default_slice_path().name).read_bytes() == default_slice_path().read_bytes()


def test_standardised(shipped: icu.IcuStays) -> None:
    z = shipped.standardised()
    np.testing.assert_allclose(z.keys.mean(axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(z.keys.std(axis=0), 1.0, atol=1e-12)
    np.testing.assert_array_equal(z.raw, shipped.raw)
    # Statistics of one set applied to another: keys stay comparable.
    part = shipped.select(shipped.stays()[:3]).standardised(z.mean, z.std)
    np.testing.assert_allclose(part.keys, z.keys[np.isin(z.stay_id, shipped.stays()[:3])])
    # select keeps the standardisation.
    np.testing.assert_array_equal(z.select(shipped.stays()[:1]).mean, z.mean)


def test_standardised_rejects_bad_stats(shipped: icu.IcuStays) -> None:
    with pytest.raises(ValueError, match=r"mean must have shape \(7,\)"):
        shipped.standardised(mean=np.zeros(3))
    with pytest.raises(ValueError, match="std must be finite and > 0"):
        shipped.standardised(std=np.zeros(7))


def test_select_and_stays(shipped: icu.IcuStays) -> None:
    ids = shipped.stays()
    sub = shipped.select([ids[2], ids[0]])
    assert sub.stays().tolist() == [ids[0], ids[2]]  # row order kept
    assert len(sub) == int(np.isin(shipped.stay_id, ids[[0, 2]]).sum())
    with pytest.raises(ValueError, match=r"stay_ids \[-5\] are not in this IcuStays"):
        shipped.select([ids[0], -5])


# --- hand-made CSV with known answers --------------------------------------


def test_hourly_binning_known_answers(tiny: icu.IcuStays) -> None:
    assert tiny.stay_id.tolist() == [1, 1, 1, 2]
    assert tiny.subject_id.tolist() == [10, 10, 10, 20]
    assert tiny.hour.tolist() == [0, 1, 3, 0]  # the empty hour 2 makes no row
    expected = np.array(
        [
            # hr    spo2  rr    sys    dia   map   temp
            [105.0, 97.0, 16.0, 120.0, 70.0, 85.0, 37.0],  # mean of 100, 110; 98.6 F
            [105.0, 85.0, 16.0, 100.0, 70.0, 85.0, 37.0],  # HR 0 dropped; abp over nbp
            [105.0, 85.0, 20.0, 100.0, 70.0, 85.0, 37.0],  # error row dropped; ffill
            [60.0, 91.0, 18.0, 110.0, 70.0, 85.0, 36.0],  # population medians
        ]
    )
    np.testing.assert_allclose(tiny.raw, expected, atol=1e-12)
    np.testing.assert_array_equal(tiny.keys, tiny.raw)
    assert tiny.critical.tolist() == [False, True, False, False]


def test_observed_mask_and_forward_fill(tiny: icu.IcuStays) -> None:
    o = tiny.observed
    assert o[0].all()
    assert o[1].tolist() == [False, True, False, True, False, False, False]
    assert o[2].tolist() == [False, False, True, False, False, False, False]
    # Stay 2 does not inherit stay 1's last values: it gets the medians.
    assert o[3].tolist() == [True, False, False, False, False, False, True]
    np.testing.assert_allclose(tiny.fill_values, [82.5, 91.0, 18.0, 110.0, 70.0, 85.0, 36.5])


def test_temp_f_is_converted_and_merged(tmp_path: Path) -> None:
    path = tmp_path / "temps.csv"  # uncompressed CSV is accepted too
    path.write_text(
        HEADER
        + _row(7, "2100-01-01 00:00:00", "temp_f", 212)  # 100 C: out of range, dropped
        + _row(7, "2100-01-01 00:10:00", "temp_f", 100.4)  # 38.0 C
        + _row(7, "2100-01-01 00:20:00", "temp_c", 37.0)
        + _row(7, "2100-01-01 01:00:00", "temp_f", 95.0)  # 35.0 C
    )
    data = load_mimic3_vitals(path)
    np.testing.assert_allclose(data.raw[:, F["temp_c"]], [37.5, 35.0], atol=1e-12)


def test_fill_values_argument(tmp_path: Path) -> None:
    path = tmp_path / "one.csv"
    path.write_text(HEADER + _row(3, "2100-01-01 00:00:00", "heart_rate", 70))
    given = np.arange(7.0) + 1
    data = load_mimic3_vitals(path, fill_values=given)
    np.testing.assert_allclose(data.raw[0], [70.0, *given[1:]])
    with pytest.raises(ValueError, match="fill_values must be 7 finite numbers"):
        load_mimic3_vitals(path, fill_values=np.ones(6))


# --- the critical rule ------------------------------------------------------


@pytest.mark.parametrize(
    ("feature", "value", "critical"),
    [
        ("heart_rate", 130.0, False),
        ("heart_rate", 130.5, True),
        ("heart_rate", 40.0, False),
        ("heart_rate", 39.0, True),
        ("spo2", 88.0, False),
        ("spo2", 87.9, True),
        ("resp_rate", 30.0, False),
        ("resp_rate", 31.0, True),
        ("resp_rate", 8.0, False),
        ("resp_rate", 7.0, True),
        ("sys_bp", 90.0, False),
        ("sys_bp", 89.0, True),
        ("mean_bp", 65.0, False),
        ("mean_bp", 64.0, True),
        ("dia_bp", 20.0, False),  # not part of the rule
        ("temp_c", 41.0, False),  # not part of the rule
    ],
    ids=lambda v: str(v),
)
def test_critical_thresholds(feature: str, value: float, critical: bool) -> None:
    row = np.array([[80.0, 97.0, 16.0, 120.0, 70.0, 85.0, 37.0]])
    row[0, F[feature]] = value
    assert critical_mask(row).tolist() == [critical]


def test_critical_ignores_missing_and_checks_shape() -> None:
    assert critical_mask(np.full((2, 7), np.nan)).tolist() == [False, False]
    with pytest.raises(ValueError, match=r"vitals must have shape \(N, 7\)"):
        critical_mask(np.zeros((2, 6)))
    with pytest.raises(ValueError, match="lacks"):
        critical_mask(np.zeros((1, 2)), feature_names=("heart_rate", "spo2"))


# --- PhysioNet 2012 ---------------------------------------------------------

RECORD_2 = """Time,Parameter,Value
00:00,RecordID,2
00:00,Age,54
00:00,Weight,-1
00:07,HR,73
00:07,NIMAP,92
00:07,NISysABP,140
00:07,NIDiasABP,60
00:30,HR,77
00:30,MAP,80
00:30,Temp,35.1
01:05,RespRate,-1
01:05,RespRate,35
01:05,SaO2,96
47:59,HR,45
"""
RECORD_1 = """Time,Parameter,Value
00:00,RecordID,1
00:15,HR,150
00:15,SysABP,85
00:15,DiasABP,50
"""


def _tar(tmp_path: Path, members: dict[str, str]) -> Path:
    path = tmp_path / "set-a.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for name, text in members.items():
            payload = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            archive.addfile(info, io.BytesIO(payload))
    return path


def test_physionet_tiny_tar(tmp_path: Path) -> None:
    path = _tar(
        tmp_path,
        {
            "set-a/000002.txt": RECORD_2,
            "set-a/000001.txt": RECORD_1,
            "Outcomes-a.txt": "RecordID,In-hospital_death\n1,0\n2,1\n",
        },
    )
    data = load_physionet2012(path)
    assert data.stay_id.tolist() == [1, 2, 2, 2]
    assert data.subject_id.tolist() == data.stay_id.tolist()
    assert data.hour.tolist() == [0, 0, 1, 47]
    raw = data.raw
    assert raw[1, F["heart_rate"]] == 75.0  # mean of 73 and 77
    assert raw[1, F["mean_bp"]] == 80.0  # arterial MAP beats NIMAP
    assert raw[1, F["sys_bp"]] == 140.0 and raw[1, F["dia_bp"]] == 60.0
    assert raw[2, F["resp_rate"]] == 35.0  # the -1 placeholder is dropped
    assert raw[2, F["spo2"]] == 96.0
    assert raw[3, F["heart_rate"]] == 45.0 and raw[3, F["temp_c"]] == 35.1  # ffill
    assert data.critical.tolist() == [True, False, True, False]
    assert not np.isnan(data.keys).any()
    # max_stays takes the smallest RecordIDs, whatever the archive order.
    assert load_physionet2012(path, max_stays=1).stays().tolist() == [1]


def test_physionet_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="load_physionet2012: path '.*nope.tar.gz'"):
        load_physionet2012(tmp_path / "nope.tar.gz")
    not_tar = tmp_path / "x.tar.gz"
    not_tar.write_bytes(b"plain text")
    with pytest.raises(ValueError, match="not a readable tar archive"):
        load_physionet2012(not_tar)
    empty = _tar(tmp_path, {"README": "nothing"})
    with pytest.raises(ValueError, match="holds no '<RecordID>.txt' record files"):
        load_physionet2012(empty)
    good = _tar(tmp_path, {"set-a/1.txt": RECORD_1})
    with pytest.raises(ValueError, match="max_stays must be a positive int, got 0"):
        load_physionet2012(good, max_stays=0)


@pytest.mark.skipif(
    not (SHARED_ICU / "physionet2012_set-a.tar.gz").is_file(),
    reason="PhysioNet 2012 set A is not on this machine",
)
def test_physionet_real_file_first_stays() -> None:
    data = load_physionet2012(SHARED_ICU / "physionet2012_set-a.tar.gz", max_stays=20)
    assert len(data.stays()) == 20 and not np.isnan(data.keys).any()
    assert data.hour.max() <= 48


# --- errors of the MIMIC-III loader ----------------------------------------


def test_mimic_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="load_mimic3_vitals: path '.*missing.csv.gz'"):
        load_mimic3_vitals(tmp_path / "missing.csv.gz")
    with pytest.raises(ValueError, match="is not a regular file"):
        load_mimic3_vitals(tmp_path)
    bad_header = tmp_path / "bad.csv"
    bad_header.write_text("icustay_id,charttime,vital\n1,2100-01-01 00:00:00,spo2\n")
    with pytest.raises(ValueError, match=r"lacks columns \['itemid'"):
        load_mimic3_vitals(bad_header)
    bad_value = tmp_path / "badval.csv"
    bad_value.write_text(HEADER + _row(1, "2100-01-01 00:00:00", "spo2", "abc"))
    with pytest.raises(ValueError, match="cannot parse line 2"):
        load_mimic3_vitals(bad_value)
    only_junk = tmp_path / "junk.csv"
    only_junk.write_text(HEADER + _row(1, "2100-01-01 00:00:00", "spo2", 0))
    with pytest.raises(ValueError, match="no valid vital-sign measurements"):
        load_mimic3_vitals(only_junk)
    with pytest.raises(TypeError, match="path must be a str or pathlib.Path"):
        load_mimic3_vitals(123)  # type: ignore[arg-type]


def test_docstring_examples_run() -> None:
    result = doctest.testmod(icu, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 10
