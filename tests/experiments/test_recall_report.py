"""``reproduce recall`` verdicts from a collected results file (no training here)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from svattn.experiments._common import Context
from svattn.experiments.recall import NOT_SHOWN, run
from svattn.lm.recall_grid import summarize

MQAR = {"vocab_size": 128, "num_kv_pairs": 4, "seq_len": 64}
COPY = {"num_symbols": 8, "num_data": 8, "seq_len": 64}


def _rec(task, mixer, seed, acc, memory=(), T=64):
    return {"id": f"{task}-T{T}-{mixer}-{seed}", "accuracy": acc, "state_floats": 2048,
            "window": 32 if mixer == "sliding" else None, "step_seconds": 0.1,
            "memory": list(memory), "wall_seconds": 2.0, "grid": "slice",
            "task": MQAR if task == "mqar" else COPY,
            "run": {"task": task, "seq_len": T, "d_model": 64, "mixer": mixer, "lr": 3e-3,
                    "seed": seed}}


def _memory(kv_share):
    roles = [1, 2] * 4 + [0] * 40
    return [{"layer": 0, "gate": [0.6, 0.4], "kept_max": 32, "truncated": 0, "boundary": 48,
             "support_per_head": [12.0, 14.0],
             "kept_by_role": {"filler": 10.0, "key": 8.0, "value": 8.0},
             "share_by_role": {"filler": 1 - kv_share, "key": kv_share / 2,
                               "value": kv_share / 2},
             "prefix_by_role": {"filler": 40.0, "key": 4.0, "value": 4.0},
             "example_roles": roles, "example_kept": [[1] * 8 + [0] * 40] * 2}]


def _write(root: Path, records: list[dict]) -> None:
    (root / "results").mkdir(parents=True)
    res = {"command": "svattn recall collect", "cells_per_grid": {"slice": len(records)},
           "cells_in_grid": {"slice": 30}, "train_seconds": 60.0,
           "summary": summarize(records), "records": records}
    (root / "results" / "recall.json").write_text(json.dumps(res))


def _ctx(root: Path) -> Context:
    out = root / "out"
    out.mkdir()
    return Context(out=out, quick=False, seed=0, data_dir=None, command="svattn reproduce",
                   repo_root=root)


def test_verdicts_follow_the_numbers(tmp_path: Path):
    recs = [_rec("mqar", "hybrid_sv", s, a, _memory(0.8)) for s, a in enumerate((.9, .92, .88))]
    recs += [_rec("mqar", "sliding", s, a) for s, a in enumerate((.5, .55, .52))]
    recs += [_rec("selective-copy", "hybrid_sv", s, .99, _memory(0.9)) for s in range(3)]
    recs += [_rec("selective-copy", m, s, .125) for m in ("deltanet", "linear")
             for s in range(3)]
    _write(tmp_path, recs)
    res = run(_ctx(tmp_path))
    verdicts = [c.verdict for c in res.claims]
    assert verdicts[0] == "reproduced", res.claims[0]
    assert "+0.377" in res.claims[0].ours  # mean of the paired differences
    assert verdicts[1] == "reproduced" and verdicts[3] == "reproduced"
    # the grid's own support figure is its training solver's: not reported as the memory's
    assert res.claims[2].verdict == "not measured (models not kept)", res.claims[2]
    assert "not measured on the optimum" in res.claims[2].ours and "13.0" not in res.claims[2].ours
    assert "recall_memory.png" not in res.figures
    assert not any("support / head" in t for t in res.tables)
    assert any("Partial grid" in n for n in res.notes)


def test_a_margin_whose_interval_holds_zero_is_not_shown(tmp_path: Path):
    recs = [_rec("mqar", "hybrid_sv", s, a, _memory(0.2)) for s, a in enumerate((.5, .6, .4))]
    recs += [_rec("mqar", "sliding", s, a) for s, a in enumerate((.55, .5, .5))]
    _write(tmp_path, recs)
    res = run(_ctx(tmp_path))
    assert res.claims[0].verdict == NOT_SHOWN
    assert res.claims[1].verdict == "not yet run"  # no selective-copy cell
    diag = next(n for n in res.notes if n.startswith("The MQAR bar is not met"))
    assert "gate 0.60 / 0.40" in diag and "selected" not in diag  # no training-solver shares


def test_without_results_every_claim_is_not_yet_run(tmp_path: Path):
    res = run(_ctx(tmp_path))
    assert {c.verdict for c in res.claims} == {"not yet run"}


def test_a_margin_below_zero_is_not_reproduced(tmp_path: Path):
    recs = [_rec("mqar", "hybrid_sv", s, a, _memory(0.2)) for s, a in enumerate((.3, .32, .31))]
    recs += [_rec("mqar", "sliding", s, a) for s, a in enumerate((.5, .5, .52))]
    _write(tmp_path, recs)
    res = run(_ctx(tmp_path))
    assert res.claims[0].verdict == "not reproduced", res.claims[0]
    assert any(n.startswith("The MQAR bar is not met") for n in res.notes)


def _write_long(root: Path, records: list[dict], grid: str = "long-64", cells: int = 9,
                name: str = "recall_long.json") -> None:
    for r in records:
        r["grid"] = grid
        r["run"].update(steps=4000, batch_size=64)
    res = {"command": "svattn recall collect", "cells_per_grid": {grid: len(records)},
           "cells_in_grid": {grid: cells}, "train_seconds": 60.0,
           "summary": summarize(records), "records": records}
    (root / "results" / name).write_text(json.dumps(res))


def test_the_longer_grid_is_reported_beside_the_slices_not_averaged_in(tmp_path: Path):
    recs = [_rec("mqar", "hybrid_sv", s, a, _memory(0.2)) for s, a in enumerate((.3, .32, .31))]
    recs += [_rec("mqar", "sliding", s, a) for s, a in enumerate((.5, .5, .52))]
    _write(tmp_path, recs)
    long = [_rec("mqar", "hybrid_sv", s, a, _memory(0.8)) for s, a in enumerate((.9, .95, .92))]
    long += [_rec("mqar", "sliding", s, a) for s, a in enumerate((.6, .62, .58))]
    long += [_rec("mqar", "softmax", s, .97) for s in range(3)]
    _write_long(tmp_path, long)
    res = run(_ctx(tmp_path))
    assert res.claims[0].verdict == "not reproduced"  # the slices' margin, unchanged
    assert res.claims[1].verdict == "reproduced", res.claims[1]
    # the paired differences: (.30 + .33 + .34) / 3
    assert "4,000 steps" in res.claims[1].claim and "+0.323" in res.claims[1].ours
    assert "grid long-64: 9 of 9 cells" in res.claims[1].ours
    assert any("Trained longer (4,000 steps of 64 sequences" in t for t in res.tables)
    assert "recall_long_by_length.png" in res.figures
    assert (tmp_path / "out" / "recall_long_by_length.png").stat().st_size > 1000
    assert any(n.startswith("Trained longer: on MQAR full causal softmax reaches 0.970") for n in
               res.notes)
    # the slices' table is built from the slices only
    assert res.metrics["cells"][0]["accuracy"]["mean"] < 0.4


def test_the_longer_grids_verdict_is_taken_at_its_longest_length(tmp_path: Path):
    recs = [_rec("mqar", "hybrid_sv", s, a, _memory(0.2)) for s, a in enumerate((.3, .32, .31))]
    recs += [_rec("mqar", "sliding", s, a) for s, a in enumerate((.5, .5, .52))]
    _write(tmp_path, recs)
    # T = 64: the hybrid well ahead; T = 128 (longest): behind in every seed
    long = [_rec("mqar", "hybrid_sv", s, a, _memory(0.8)) for s, a in enumerate((.9, .95, .92))]
    long += [_rec("mqar", "sliding", s, a) for s, a in enumerate((.6, .62, .58))]
    long += [_rec("mqar", "hybrid_sv", s, a, _memory(0.2), T=128)
             for s, a in enumerate((.30, .31, .29))]
    long += [_rec("mqar", "sliding", s, a, T=128) for s, a in enumerate((.40, .42, .41))]
    _write_long(tmp_path, long, cells=12)
    first = run(_ctx(tmp_path))
    claim = first.claims[1]
    assert claim.verdict == "not reproduced", claim
    assert "longest T (128)" in claim.claim
    assert claim.ours.startswith("T = 128, d = 64: -0.110") and "shorter: T = 64" in claim.ours
    assert not any("not run at the same learning rates" in n for n in first.notes)
    # a mixer run at another learning rate than the others: the report says so
    long += [_rec("mqar", "sliding", s, .5, T=128) for s in range(3)]
    for r in long[-3:]:
        r["run"]["lr"] = 1e-3
    _write_long(tmp_path, long, cells=15)
    shutil.rmtree(tmp_path / "out")
    notes = run(_ctx(tmp_path)).notes
    assert any("T = 128, d = 64: the mixers were not run at the same learning rates "
               "(hybrid_sv 0.003; sliding 0.001, 0.003)" in n for n in notes), notes


def test_selective_copy_trained_longer_gets_its_own_bars_beside_the_slices(tmp_path: Path):
    recs = [_rec("selective-copy", m, s, .3) for m in ("hybrid_sv", "sliding", "deltanet")
            for s in range(3)]
    _write(tmp_path, recs)
    long = [_rec("mqar", "hybrid_sv", s, a, _memory(0.8)) for s, a in enumerate((.9, .95, .92))]
    long += [_rec("mqar", "sliding", s, a) for s, a in enumerate((.6, .62, .58))]
    copy_memory = [dict(_memory(0.0)[0], share_by_role={"filler": 0.7, "data": 0.3},
                        prefix_by_role={"filler": 40.0, "data": 8.0})]
    long += [_rec("selective-copy", "hybrid_sv", s, a, copy_memory)
             for s, a in enumerate((.97, .98, .99))]
    long += [_rec("selective-copy", "sliding", s, a) for s, a in enumerate((.7, .8, .9))]
    long += [_rec("selective-copy", m, s, .5) for m in ("deltanet", "linear") for s in range(3)]
    _write_long(tmp_path, long, cells=18)
    res = run(_ctx(tmp_path))
    names = [c.claim for c in res.claims]
    # MQAR (slices: none), MQAR trained longer, then the longer grid's selective copy
    assert names[1].startswith("MQAR trained longer") and res.claims[1].verdict == "reproduced"
    sv = res.claims[2]
    assert sv.claim == "Trained selective copy trained longer (4,000 steps) at T = 64: SV recall"
    assert sv.verdict == "reproduced" and sv.ours.startswith("0.980")
    assert res.claims[4].claim.startswith("… DeltaNet / linear")
    # 0.5 in every seed: 4x chance (1/8), the interval wholly above 2x chance
    assert res.claims[4].verdict == "not reproduced", res.claims[4]
    # the slices' selective copy is reported on its own, from its own cells
    slice_sv = next(c for c in res.claims if c.claim == "Trained selective copy at T = 64: SV "
                    "recall")
    assert slice_sv.ours.startswith("0.300") and slice_sv.verdict == "not reproduced"
    assert "Trained selective copy trained longer" in res.verdict
    assert any(n.startswith("Trained longer, selective copy, hybrid − matched window "
                            "(paired): T = 64, d = 64: +0.180") for n in res.notes), res.notes
    # the gates and the budget's cuts, never the training solver's support or shares
    copy_notes = [n for n in res.notes if n.startswith("Trained longer, selective-copy-")]
    assert copy_notes and all("gate 0.60 / 0.40" in n and "of them" not in n
                              and "support tokens" not in n for n in copy_notes), copy_notes


def test_selective_copy_verdicts_follow_the_intervals(tmp_path: Path):
    """SV recall refuted only where its interval lies below 0.8; DeltaNet / linear "at
    chance" refuted only where an interval lies above 2x chance, else not shown."""
    recs = [_rec("selective-copy", "hybrid_sv", s, a, _memory(0.5))
            for s, a in enumerate((.40, .45, .42))]
    recs += [_rec("selective-copy", "deltanet", s, a) for s, a in enumerate((.1, .5, .2))]
    recs += [_rec("selective-copy", "linear", s, a) for s, a in enumerate((.12, .13, .2))]
    _write(tmp_path, recs)
    claims = {c.claim.split(" at T")[0]: c for c in run(_ctx(tmp_path)).claims}
    assert claims["Trained selective copy"].verdict == "not reproduced"
    assert claims["… DeltaNet / linear attention"].verdict == NOT_SHOWN
    shutil.rmtree(tmp_path / "results")
    shutil.rmtree(tmp_path / "out")
    recs = [_rec("selective-copy", "hybrid_sv", s, a, _memory(0.5))
            for s, a in enumerate((.3, .9, .6))]
    recs += [_rec("selective-copy", m, s, a) for m in ("deltanet", "linear")
             for s, a in enumerate((.12, .2, .15))]
    _write(tmp_path, recs)
    claims = {c.claim.split(" at T")[0]: c for c in run(_ctx(tmp_path)).claims}
    assert claims["Trained selective copy"].verdict == NOT_SHOWN  # interval reaches 0.8
    assert claims["… DeltaNet / linear attention"].verdict == "reproduced"


def test_the_full_policy_diagnosis_is_reported_paired_beside_the_longer_grid(tmp_path: Path):
    recs = [_rec("mqar", "hybrid_sv", s, a, _memory(0.2)) for s, a in enumerate((.3, .32, .31))]
    recs += [_rec("mqar", "sliding", s, a) for s, a in enumerate((.5, .5, .52))]
    _write(tmp_path, recs)
    long = [_rec("mqar", "hybrid_sv", s, a, _memory(0.2)) for s, a in enumerate((.4, .5, .6))]
    long += [_rec("mqar", "sliding", s, a) for s, a in enumerate((.6, .62, .58))]
    long += [_rec("mqar", "softmax", s, .9) for s in range(3)]
    _write_long(tmp_path, long)
    full = [_rec("mqar", "hybrid_sv", s, a, _memory(0.5)) for s, a in enumerate((.7, .8, .9))]
    _write_long(tmp_path, full, "long-64-full", 3, "recall_long_full.json")
    out = run(_ctx(tmp_path))
    table = next(t for t in out.tables if t.startswith("Diagnosis: the longer grid's hybrid"))
    # paired by seed: full − support = +0.3 each seed; − window = .1, .18, .32; − softmax
    assert "+0.300" in table and "+0.200" in table and "-0.100" in table, table
    assert "grid long-64-full: 3 of 3 cells" in table
    assert any(n.startswith("'Full' policy, ") for n in out.notes)
    # the claims are the longer grid's and the slices', never the diagnosis's
    assert not any("full" in c.claim.lower() and "policy" in c.claim for c in out.claims)


def _sel_rec(mixer, seed, acc, C=None, data_mass=0.0, distinct=12.0, count=40.0):
    rec = _rec("selective-copy", mixer, seed, acc, T=128)
    rec["id"] = f"sel-{mixer}-{C}-{seed}"
    rec["grid"] = "selection"
    if mixer == "hybrid_sv":
        rec["run"]["hybrid"] = {"C": C}
        rec["memory"] = [{"layer": layer, "gate": [0.7, 0.5], "kept_max": 32, "truncated": 0,
                          "boundary": 112, "support_per_head": [count, count],
                          "distinct_support_per_head": [distinct, distinct],
                          "alpha_by_role": {"data": [data_mass] * 2,
                                            "filler": [1 - data_mass] * 2},
                          "prefix_by_role": {"data": 8.0, "filler": 104.0}}
                         for layer in (0, 1)]
    return rec


def _write_selection(root: Path, records: list[dict]) -> None:
    from svattn.lm.recall_grid import cell_measures

    res = {"command": "svattn recall collect --into results/recall_selection.json",
           "cells_per_grid": {"selection": len(records)}, "cells_in_grid": {"selection": 12},
           "train_seconds": 60.0, "summary": summarize(records),
           "cells": [cell_measures(r) for r in records], "records": records}
    (root / "results" / "recall_selection.json").write_text(json.dumps(res))


def _optimum_row(C, seed, data_mass, distinct, count=16.0, share=0.067):
    figures = {"support_per_head": count, "distinct_support_per_head": distinct,
               "data_mass": data_mass, "data_support_share": 0.5, "data_share": share}
    return {"C": C, "seed": seed, "sequences": 4, "run": f"sel-hybrid_sv-{C}-{seed}",
            "forward": {"exact": 4, "optimum_fallback": 0, "first_error": None},
            "summary": {"memory": figures, "oracle": dict(figures, support_per_head=70.0)},
            "layers": [{"layer": layer, "unique_optimum_share": 0.5,
                        "by_solver": {"memory": {"support_per_head": [count, count]}}}
                       for layer in (0, 1)]}


def _write_optimum(root: Path, rows: list[dict]) -> None:
    (root / "results" / "selection_on_optimum.json").write_text(json.dumps(
        {"command": "python benchmarks/selection_on_optimum.py", "rows": rows}))


def _write_box(root: Path, chosen: float, fixed: float = 1 / 16, best: float = 0.25) -> None:
    def box(C, test):
        return {"C": C, "validation": {"mean": test, "ci95": None, "n": 1, "values": [test]},
                "test": {"mean": test, "ci95": [test - 0.01, test + 0.01], "n": 3,
                         "values": [test] * 3}}

    tests = {0.25: 0.96, 1 / 16: 0.6, 0.125: 0.97}
    forward = {"chosen_overall": box(chosen, tests[chosen]), "fixed": box(fixed, tests[fixed]),
               "best_on_test": box(best, tests[best]), "ties": [],
               "chosen_per_seed": {"0": {"C": chosen, "validation": 0.9, "test": 0.9}},
               "chosen_per_seed_test": {"mean": 0.9, "ci95": None, "n": 1, "values": [0.9]},
               "verdict": "validation chose"}
    (root / "results" / "box_on_validation.json").write_text(json.dumps(
        {"command": "python benchmarks/box_on_validation.py", "n_data": 8,
         "validation_seed_offset": 1000, "forwards": {"as_trained": forward},
         "rows": [{"C": 0.25, "seed": 0, "validation_rows_in_train_or_test": 0,
                   "as_trained": {"test": 0.95}}], "not_done": "retraining"}))


def test_selection_is_read_on_the_optimum_not_the_training_solver(tmp_path: Path):
    _write(tmp_path, [_rec("mqar", "sliding", 0, 0.5)])
    # the grid's own figures (its training solver's): 40 tokens, 30 distinct, mass 0.8
    recs = [_sel_rec("hybrid_sv", s, a, C=0.25, data_mass=0.8, distinct=30.0)
            for s, a in ((0, 0.95), (1, 0.97), (2, 0.96))]
    recs += [_sel_rec("hybrid_sv", s, 0.6, C=1 / 16, data_mass=0.07, distinct=30.0)
             for s in range(3)]
    recs += [_sel_rec("sliding", s, 0.5) for s in range(3)]
    _write_selection(tmp_path, recs)
    res = run(_ctx(tmp_path))
    support = next(c for c in res.claims if c.claim.startswith("… SV support per head of the "
                                                                "optimum"))
    assert support.verdict == "not yet run", support  # no exact record: nothing quoted
    table = next(t for t in res.tables if "looser box" in t)
    assert "not measured on the optimum" in table and "40.0" not in table
    # the exact re-solves' figures replace them
    _write_optimum(tmp_path, [_optimum_row(0.25, s, m, 13.0) for s, m in
                              ((0, 0.80), (1, 0.85), (2, 0.90))]
                   + [_optimum_row(1 / 16, s, 0.07, 30.0) for s in range(3)])
    res = run(_ctx_again(tmp_path))
    support = next(c for c in res.claims if c.claim.startswith("… SV support per head of the "
                                                                "optimum"))
    assert "C = 1/4" in support.claim and support.verdict == "reproduced", support
    assert "13.0 distinct keys" in support.ours and "16.0 by count" in support.ours
    assert "70.0 by count" in support.ours  # the oracle's spread optimum, beside
    sel = next(c for c in res.claims if c.claim.startswith("… the trained memory selects"))
    assert sel.verdict == "reproduced" and "mass 0.850" in sel.ours, sel
    tuned = next(c for c in res.claims if "tuned on the test set" in c.claim)
    assert "best of 2 boxes" in tuned.claim, tuned
    assert tuned.verdict == "reproduced with a box tuned on the test set", tuned
    assert "recall_selection.png" in res.figures
    table = next(t for t in res.tables if "looser box" in t)
    assert "1/4" in table and "1/16" in table and "window (matched)" in table
    assert "13.0" in table and "40.0" not in table
    # a memory whose optimum keeps the data tokens only at their share does not select
    _write_optimum(tmp_path, [_optimum_row(0.25, s, 0.067 + 0.001 * s, 30.0) for s in range(3)]
                   + [_optimum_row(1 / 16, s, 0.07, 30.0) for s in range(3)])
    res = run(_ctx_third(tmp_path))
    sel = next(c for c in res.claims if c.claim.startswith("… the trained memory selects"))
    support = next(c for c in res.claims if c.claim.startswith("… SV support per head of the "
                                                                "optimum"))
    assert sel.verdict == NOT_SHOWN and support.verdict == "differs", (sel, support)


def test_the_box_chosen_on_validation_is_reported_beside_the_fixed_and_the_tuned(
        tmp_path: Path):
    _write(tmp_path, [_rec("mqar", "sliding", 0, 0.5)])
    recs = [_sel_rec("hybrid_sv", s, 0.97, C=0.125) for s in range(3)]
    recs += [_sel_rec("hybrid_sv", s, 0.6, C=1 / 16) for s in range(3)]
    _write_selection(tmp_path, recs)
    _write_box(tmp_path, chosen=0.125, best=0.125)
    res = run(_ctx(tmp_path))
    chosen = next(c for c in res.claims if "chosen on a validation split" in c.claim)
    assert "C = 1/8 (C = 1/n_data, 8 data tokens)" in chosen.claim, chosen
    assert chosen.verdict == "reproduced (where C = 1/8 = 1/n_data won on validation)"
    assert "C = 1/16: 0.600" in chosen.ours and "test 0.970" in chosen.ours
    fixed = next(c for c in res.claims if "fixed before training" in c.claim)
    assert "C = 1/16" in fixed.claim and fixed.verdict == "not reproduced", fixed
    assert any(n.startswith("Not yet done: retraining") for n in res.notes)
    # validation choosing a box other than 1/n_data says so, and no condition is claimed
    _write_box(tmp_path, chosen=0.25, best=0.125)
    res = run(_ctx_again(tmp_path))
    chosen = next(c for c in res.claims if "chosen on a validation split" in c.claim)
    assert "not C = 1/n_data = 1/8" in chosen.claim and chosen.verdict == "reproduced"


def _ctx_again(root: Path, name: str = "out2") -> Context:
    out = root / name
    out.mkdir()
    return Context(out=out, quick=False, seed=0, data_dir=None, command="svattn reproduce",
                   repo_root=root)


def _ctx_third(root: Path) -> Context:
    return _ctx_again(root, "out3")


def test_the_exact_memorys_support_is_reported_from_the_compaction_study(tmp_path: Path):
    _write(tmp_path, [_rec("mqar", "sliding", 0, 0.5)])
    _write_selection(tmp_path, [_sel_rec("hybrid_sv", s, 0.9, C=0.25, data_mass=0.6)
                                for s in range(2)])
    summary = {"held": 100, "compactable": 88, "max_readout_change": 0.0,
               "support_per_memory": 12.5, "distinct_support_keys_per_memory": 12.0,
               "forget_selected_data_token_median_s": 0.1,
               "forget_never_selected_filler_median_s": 0.2}
    (tmp_path / "results" / "selection_compaction.json").write_text(json.dumps(
        {"command": "python benchmarks/selection_compaction.py", "model": "m/cell.safetensors",
         "summary": summary, "sequences": [{}, {}]}))
    res = run(_ctx(tmp_path))
    claim = next(c for c in res.claims if "of the exact memory" in c.claim)
    assert claim.verdict == "reproduced" and "12.5 tokens" in claim.ours and "88%" in claim.ours
    summary["support_per_memory"] = 30.0
    (tmp_path / "results" / "selection_compaction.json").write_text(json.dumps(
        {"command": "c", "model": "m/cell.safetensors", "summary": summary,
         "sequences": [{}]}))
    res = run(_ctx_again(tmp_path))
    assert next(c for c in res.claims if "of the exact memory" in c.claim).verdict == "differs"
