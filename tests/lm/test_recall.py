"""Trained recall: matched state, scored-position accuracy, training, inspection, grids."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from svattn.cli import main
from svattn.lm.recall import (
    RecallRun,
    build_task,
    distinct_kept,
    inspect_memory,
    load_cell_model,
    matched_window,
    model_config,
    query_accuracy,
    train_recall,
)
from svattn.lm.recall_grid import GRIDS, RecallGrid, collect, parse_only, run_grid, summarize
from svattn.mixers import MIXERS
from svattn.tasks import IGNORE, MQARConfig

HYB = {"chunk": 8, "C": 1.0 / 8, "budget": 8}


def _tiny(**kw) -> RecallRun:
    base = dict(seq_len=32, d_model=16, steps=3, batch_size=4, num_train=16, num_test=8,
                hybrid=HYB, task_options={"vocab_size": 32}, inspect_sequences=4)
    return RecallRun(**{**base, **kw})


def test_matched_window_has_the_hybrids_state_floats():
    for T in (48, 256, 1024):
        w = matched_window({"chunk": 16, "C": 1 / 16, "budget": 16}, 64, 2, T)
        hyb = MIXERS["hybrid_sv"](64, 2, chunk=16, C=1 / 16, budget=16)
        sliding = MIXERS["sliding"](64, 2, window=w)
        assert sliding.state_floats(T) == hyb.state_floats(T)
        assert w == min(T, 32)  # budget + chunk tokens


@pytest.mark.parametrize("mixer", sorted(MIXERS))
def test_model_config_states_follow_the_one_definition(mixer):
    run = _tiny(mixer=mixer, seq_len=64)
    cfg = model_config(run, 32)
    mix = MIXERS[mixer](16, 2, **cfg.mixer_options)
    want = {"softmax": 2 * 64 * 16, "sliding": 2 * 16 * 16, "hybrid_sv": 2 * 16 * 16,
            "deltanet": 2 * 8 * 8, "linear": 2 * 8 * 9}[mixer]
    assert mix.state_floats(64) == want
    assert cfg.rope is False and cfg.vocab_size == 32 and cfg.n_layer == 2


def test_rope_goes_to_the_softmax_type_mixers_only():
    assert model_config(_tiny(mixer="hybrid_sv", rope=True), 8).rope is True
    assert model_config(_tiny(mixer="deltanet", rope=True), 8).rope is False


class _Echo(torch.nn.Module):
    """hidden = one-hot input, head = identity: predicts the input token itself."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab, self.lm_head = vocab, torch.nn.Identity()

    def hidden(self, x):
        return torch.nn.functional.one_hot(x, self.vocab).float()


def test_query_accuracy_counts_scored_positions_only():
    x = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4]])
    y = torch.full((2, 4), IGNORE)
    y[0, 1], y[0, 3], y[1, 2] = 2, 0, 3  # right, wrong, right; unscored positions ignored
    assert query_accuracy(_Echo(5), x, y) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="no scored position"):
        query_accuracy(_Echo(5), x, torch.full((2, 4), IGNORE))


def test_a_softmax_model_learns_tiny_mqar():
    # 2 pairs, T = 8, 8 values: chance 1/8; 150 steps get well above it (0.52 when written)
    run = RecallRun(seq_len=8, mixer="softmax", d_model=32, steps=150, batch_size=32,
                    lr=1e-2, num_train=4000, num_test=200,
                    task_options={"num_kv_pairs": 2, "vocab_size": 16})
    rec = train_recall(run)
    assert rec["accuracy"] > 0.35, rec["accuracy"]
    assert rec["loss_curve"][-1][1] < rec["loss_curve"][0][1]


def test_train_recall_record_and_memory_inspection():
    run = _tiny(mixer="hybrid_sv")
    rec = train_recall(run)
    assert rec["id"] == run.run_id and RecallRun.from_dict(rec["run"]) == run
    assert 0.0 <= rec["accuracy"] <= 1.0 and math.isfinite(rec["final_loss"])
    assert rec["state_floats"] == 2 * 16 * 16 and rec["window"] is None
    assert rec["task"]["num_kv_pairs"] == 4  # kv_pairs_for(32)
    assert len(rec["memory"]) == 2
    T, L = 32, 8
    for layer in rec["memory"]:
        assert layer["boundary"] == 24 and len(layer["gate"]) == 2
        prefix = sum(layer["prefix_by_role"].values())
        assert prefix == pytest.approx(24)
        kept = sum(layer["kept_by_role"].values())  # summed over the 2 heads
        assert kept == pytest.approx(sum(layer["support_per_head"]))
        assert all(8 <= s <= 24 for s in layer["support_per_head"])  # >= ceil(1/C)
        assert sum(layer["share_by_role"].values()) == pytest.approx(1.0)
        assert set(layer["prefix_by_role"]) <= {"key", "value", "query", "filler"}
        # copies merged: never more distinct keys than kept tokens, at least one
        for d, s in zip(layer["distinct_support_per_head"], layer["support_per_head"],
                        strict=True):
            assert 1 <= d <= s
    json.dumps(rec, allow_nan=False)
    assert T > L


def test_inspection_sees_the_roles_it_is_given():
    run = _tiny(mixer="hybrid_sv")
    data = build_task(run).build(0)
    torch.manual_seed(0)
    from svattn.lm.model import CharLM

    model = CharLM(model_config(run, data.vocab_size))
    roles = torch.zeros_like(data.test_roles[:2])
    roles[:, :12] = 1  # call the first 12 positions keys
    layers = inspect_memory(model, data.test_inputs[:2], roles)
    assert layers[0]["prefix_by_role"] == {"filler": 12.0, "key": 12.0}
    assert inspect_memory(CharLM(model_config(_tiny(mixer="softmax"), 32)),
                          data.test_inputs[:2], roles) == []


def test_bad_runs_are_refused_by_name():
    with pytest.raises(ValueError, match="RecallRun.mixer"):
        RecallRun(mixer="mamba")
    with pytest.raises(ValueError, match="RecallRun.lr"):
        RecallRun(lr=0.0)
    with pytest.raises(ValueError, match="unknown keys"):
        RecallRun(hybrid={"chunks": 8})
    with pytest.raises(ValueError, match="unknown fields"):
        RecallRun.from_dict({"task": "mqar", "bogus": 1})


def _record(mixer, lr, seed, acc, T=64):
    return {"id": f"{mixer}-{lr}-{seed}", "accuracy": acc, "state_floats": 10, "window": None,
            "step_seconds": 0.1, "memory": [], "wall_seconds": 1.0, "grid": "slice",
            "run": {"task": "mqar", "seq_len": T, "d_model": 64, "mixer": mixer, "lr": lr,
                    "seed": seed}}


def test_summarize_picks_the_best_lr_and_pairs_seeds():
    recs = [_record("hybrid_sv", 1e-3, s, a) for s, a in enumerate((0.2, 0.3, 0.25))]
    recs += [_record("hybrid_sv", 3e-3, s, a) for s, a in enumerate((0.6, 0.7, 0.65))]
    recs += [_record("sliding", 1e-3, s, a) for s, a in enumerate((0.5, 0.5, 0.5))]
    recs += [_record("sliding", 3e-3, s, a) for s, a in enumerate((0.4, 0.45, 0.4))]
    out = summarize(recs)
    cells = {c["mixer"]: c for c in out["cells"]}
    assert cells["hybrid_sv"]["best_lr"] == 3e-3 and cells["sliding"]["best_lr"] == 1e-3
    assert [c["mixer"] for c in out["cells"]] == ["hybrid_sv", "sliding"]
    (m,) = out["margins"]
    diff = m["hybrid_minus_sliding"]
    assert diff["values"] == pytest.approx([0.1, 0.2, 0.15])
    assert diff["ci95"][0] > 0  # paired differences: an interval that excludes zero


def test_run_grid_is_resumable_and_collect_reads_whatever_exists(tmp_path: Path):
    grid = RecallGrid("quick", tasks=("mqar",), lengths=(32,), mixers=("softmax", "sliding"),
                      d_models=(16,), seeds=(0, 1), base={
                          k: v for k, v in _tiny().to_dict().items()
                          if k not in ("task", "seq_len", "mixer", "d_model", "lr", "seed")})
    out = tmp_path / "runs"
    (out).mkdir()
    (out / "mqar-T32-softmax-d16-lr0.001-s0.json.tmp").write_text("{")  # an interrupted cell
    first = run_grid(grid, out, limit=1, command="c1")
    assert [p.name for p in first] == ["mqar-T32-softmax-d16-lr0.001-s0.json"]
    rest = run_grid(grid, out, only=parse_only("mixer=sliding"), command="c2")
    assert len(rest) == 2 and all("sliding" in p.name for p in rest)
    assert run_grid(grid, out, only=parse_only("mixer=sliding")) == []  # all done: skipped
    res = collect(out, tmp_path / "recall.json", command="collect-cmd")
    assert len(res["records"]) == 3 and res["command"] == "collect-cmd"
    saved = json.loads((tmp_path / "recall.json").read_text())
    assert saved["summary"] == res["summary"]
    assert {r["command"] for r in saved["records"]} == {"c1", "c2"}
    assert saved["cells_per_grid"] == {"quick": 3}
    # two folders at once (a grid run into a folder of its own); an id in both is refused
    other = tmp_path / "more"
    other.mkdir()
    moved = out / "mqar-T32-sliding-d16-lr0.001-s1.json"
    (other / moved.name).write_text(moved.read_text())
    moved.unlink()
    both = collect([out, other], command="c3")
    assert [r["id"] for r in both["records"]] == [r["id"] for r in res["records"]]
    assert both["summary"] == res["summary"] and both["collected_from"] == f"{out}, {other}"
    (out / moved.name).write_text((other / moved.name).read_text())
    with pytest.raises(ValueError, match="mqar-T32-sliding-d16-lr0.001-s1 is in both"):
        collect([out, other])
    progress = []  # the log gets each cell's training progress, not only its start
    run_grid(grid, tmp_path / "logged", limit=1, log=progress.append)
    assert progress[0].startswith("[recall]") and any("step" in line for line in progress[1:])


def test_parse_only_and_collect_errors(tmp_path: Path):
    with pytest.raises(ValueError, match="not a RecallRun field"):
        parse_only("colour=red")
    with pytest.raises(ValueError, match="FIELD=VALUE"):
        parse_only("mqar")
    with pytest.raises(ValueError, match="no finished cell"):
        collect(tmp_path)
    with pytest.raises(FileNotFoundError):
        collect(tmp_path / "absent")


def test_cli_recall_errors_are_usage_errors(tmp_path: Path, capsys):
    assert main(["recall", "run", "--grid", "nope", "--out", str(tmp_path)]) == 2
    assert "--grid must be one of" in capsys.readouterr().err
    assert main(["recall", "collect", "--runs", str(tmp_path / "x"),
                 "--into", str(tmp_path / "r.json")]) == 2


def test_collect_never_replaces_the_tracked_record_untold(tmp_path: Path, monkeypatch, capsys):
    from svattn.cli import RECALL_GRIDS

    assert set(RECALL_GRIDS) == set(GRIDS)  # the CLI's torch-free list of names
    grid = RecallGrid("quick", tasks=("mqar",), lengths=(32,), mixers=("sliding",),
                      d_models=(16,), base={k: v for k, v in _tiny(steps=1).to_dict().items()
                                            if k not in ("task", "seq_len", "mixer",
                                                         "d_model", "lr", "seed")})
    run_grid(grid, tmp_path / "runs")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results").mkdir()
    record = tmp_path / "results" / "recall.json"
    record.write_text("{}")
    assert main(["recall", "collect", "--runs", "runs"]) == 2
    assert "--force" in capsys.readouterr().err and record.read_text() == "{}"
    assert main(["recall", "collect", "--runs", "runs", "--into", "other.json"]) == 0
    assert "wrote other.json" in capsys.readouterr().out and record.read_text() == "{}"
    assert main(["recall", "collect", "--runs", "runs", "--force"]) == 0
    assert json.loads(record.read_text())["records"]


def test_named_grids_are_well_formed():
    for name, grid in GRIDS.items():
        runs = grid.runs()
        assert len({r.run_id for r in runs}) == len(runs), name
        for r in runs[:: max(1, len(runs) // 7)]:
            task = build_task(r)
            if isinstance(task, MQARConfig):
                assert 4 * task.num_kv_pairs <= r.seq_len
            window = matched_window(r.hybrid_options(), r.d_model, r.n_head, r.seq_len)
            if r.hybrid_options()["policy"] == "full":  # a diagnosis: it keeps every token
                assert window == r.seq_len, name
            else:
                assert window < r.seq_len or r.seq_len <= 32, name
    assert len(GRIDS["full"].runs()) == 2 * 5 * 2 * 5 * 4 * 3


def test_distinct_kept_merges_exact_copies_only():
    g = torch.Generator().manual_seed(0)
    keys = torch.randn(2, 3, 10, 4, generator=g)
    keys[0, 1, 5] = keys[0, 1, 2]  # an exact copy
    keys[1, 2, 7] = keys[1, 2, 3] + 1e-7  # not a copy
    kept = torch.ones(2, 3, 10, dtype=torch.bool)
    kept[0, 0, :4] = False
    out = distinct_kept(keys, kept)
    assert out.tolist() == [[6, 9, 10], [10, 10, 10]]
    with pytest.raises(ValueError, match="disagree"):
        distinct_kept(keys, kept[:, :2])


def test_box_axis_and_kept_weights(tmp_path: Path):
    sel = GRIDS["selection"].runs()
    hyb = [r for r in sel if r.mixer == "hybrid_sv"]
    assert len(hyb) == 9 and len(sel) == 12  # 3 boxes x 3 seeds, the window once per seed
    assert sorted({r.hybrid["C"] for r in hyb}) == [1 / 16, 1 / 8, 1 / 4]
    assert {model_config(r, 20).mixer_options["window"] for r in sel
            if r.mixer == "sliding"} == {32}
    assert "-C0.25-" in hyb[0].run_id
    base = {k: v for k, v in _tiny().to_dict().items()
            if k not in ("task", "seq_len", "mixer", "d_model", "lr", "seed", "hybrid")}
    grid = RecallGrid("boxes", tasks=("mqar",), lengths=(32,), mixers=("hybrid_sv",),
                      d_models=(16,), Cs=(1 / 4, 1 / 8), save_models=True,
                      base={**base, "steps": 2, "hybrid": _tiny().hybrid})
    written = run_grid(grid, tmp_path)
    assert [p.name for p in written] == ["mqar-T32-hybrid_sv-C0.25-d16-lr0.001-s0.json",
                                         "mqar-T32-hybrid_sv-C0.125-d16-lr0.001-s0.json"]
    rec = json.loads(written[0].read_text())
    model, run = load_cell_model(tmp_path / rec["model_file"])
    assert run.hybrid["C"] == 0.25 and run.run_id == rec["id"]
    data = build_task(run).build(run.seed)
    acc = query_accuracy(model, data.test_inputs, data.test_targets)
    assert acc == rec["accuracy"]  # the weights kept are the weights scored
    res = collect(tmp_path, tmp_path / "sel.json", models_into=tmp_path / "kept")
    # a grid goes on from its committed record: restored cells are skipped
    again = tmp_path / "again"
    assert main(["recall", "restore", "--from", str(tmp_path / "sel.json"), "--out",
                 str(again)]) == 0
    assert sorted(p.name for p in again.iterdir()) == sorted(
        [p.name for p in written] + [json.loads(p.read_text())["model_file"]
                                     for p in written])
    assert run_grid(grid, again) == []
    assert sorted(c["C"] for c in res["summary"]["cells"]) == [0.125, 0.25]
    assert (tmp_path / "kept" / rec["model_file"]).read_bytes() == \
        (tmp_path / rec["model_file"]).read_bytes()
    rows = {r["C"]: r for r in res["cells"]}
    for row in rows.values():
        total = sum(row["mass_by_role"].values())
        assert total == pytest.approx(1.0, abs=1e-4)  # alpha sums to 1 per head
        assert sum(row["share_by_role"].values()) == pytest.approx(1.0)
        assert 1 <= row["distinct_support_per_head"] <= row["support_per_head"]
    with pytest.raises(ValueError, match="not a recall cell model"):
        torch.save({"x": 1}, tmp_path / "bad.safetensors")
        load_cell_model(tmp_path / "bad.safetensors")
    # the compaction study runs on a kept cell (benchmarks/selection_compaction.py)
    from script_helpers import load_script

    study = load_script("benchmarks/selection_compaction.py")
    row = study.measure_sequence(model, data.test_inputs[0].tolist(),
                                 data.test_roles[0].tolist())
    assert row["memories"] and all(m["readout_change"] == 0.0 for m in row["memories"])
    for m in row["memories"]:  # compaction drops the reserve tokens, nothing else
        assert m["compacted"] == m["reserve"] == m["held"] - m["margin"] - m["error"]


@pytest.mark.slow  # ~10-20 s: two trainings and two exact memory inspections
def test_resumable_cells_train_the_same_model_and_resume(tmp_path: Path):
    from svattn.lm.recall import train_checkpointed

    grid = RecallGrid("quick", tasks=("selective-copy",), lengths=(32,), mixers=("hybrid_sv",),
                      d_models=(16,), seeds=(0,), Cs=(1.0 / 8,), save_models=True,
                      base={**{k: v for k, v in _tiny(steps=4).to_dict().items()
                               if k not in ("task", "seq_len", "mixer", "d_model", "lr",
                                            "seed", "task_options")},
                            "rope": True, "task_options": {"num_data": 4, "num_symbols": 4}})
    (run,) = grid.runs()
    (plain,) = run_grid(grid, tmp_path / "plain")
    # a resumable cell interrupted after 2 of its 4 steps, then run again: it resumes
    train_checkpointed(run, tmp_path / "ck" / run.run_id, ckpt_every=2, stop_after=2)
    (resumed,) = run_grid(grid, tmp_path / "ck", ckpt_every=2, command="resumable")
    a, b = json.loads(plain.read_text()), json.loads(resumed.read_text())
    assert b["resumed_from_step"] == 2 and b["step_seconds_kind"] == "mean"
    assert b["command"] == "resumable" and b["solver"] == a["solver"]
    assert "finish='optimum'" in b["solver"]
    assert b["accuracy"] == a["accuracy"] and b["memory"] == a["memory"]
    assert b["final_loss"] == pytest.approx(a["final_loss"], rel=1e-5)
    ma, _ = load_cell_model(tmp_path / "plain" / a["model_file"])
    mb, _ = load_cell_model(tmp_path / "ck" / b["model_file"])
    for (name, pa), pb in zip(ma.state_dict().items(), mb.state_dict().values(), strict=True):
        assert torch.equal(pa, pb), name
    assert [s for s, _ in b["loss_curve"]] == [2, 4]
    assert run_grid(grid, tmp_path / "ck", ckpt_every=2) == []  # finished: skipped
    # a resumable cell of a grid that keeps no weights: collect keeps its last step's
    unkept = replace(grid, save_models=False)
    (bare,) = run_grid(unkept, tmp_path / "bare", ckpt_every=2)
    assert "model_file" not in json.loads(bare.read_text())
    res = collect(tmp_path / "bare", tmp_path / "bare.json", models_into=tmp_path / "kept")
    (rec,) = res["records"]
    mc, rc = load_cell_model(tmp_path / "kept" / rec["model_file"])
    assert rc.run_id == rec["id"]
    for (name, pa), pc in zip(ma.state_dict().items(), mc.state_dict().values(), strict=True):
        assert torch.equal(pa, pc), name  # the same weights as the kept grid's
    data = build_task(rc).build(rc.seed)
    assert query_accuracy(mc, data.test_inputs, data.test_targets) == rec["accuracy"]
    with (tmp_path / "bare" / rec["id"] / "model.pt").open("r+b") as f:
        f.truncate(100)  # a cell whose final weights are damaged is not kept silently
    with pytest.raises(ValueError):
        collect(tmp_path / "bare", None, models_into=tmp_path / "kept2")


def test_the_control_grid_trains_with_the_approximate_finish_the_retrained_with_the_optimum():
    from svattn.lm.model import CharLM

    def finish(grid: str) -> set[str]:
        (run,) = [r for r in GRIDS[grid].runs() if r.seed == 0 and r.hybrid_options()["C"]
                  == 0.125 and r.mixer == "hybrid_sv"]
        model = CharLM(model_config(run, 10))
        return {m.solver.finish for m in model.modules() if hasattr(m, "solver")}

    assert finish("selection-approximate") == {"approximate"}
    assert finish("selection") == {"optimum"}  # the library default
    ctrl = GRIDS["long-64-approximate"].runs()
    assert {r.run_id for r in ctrl} == {r.run_id for r in GRIDS["long-64"].runs()
                                        if r.mixer == "hybrid_sv" and r.lr == 3e-3}
    assert {m.solver.finish for r in ctrl for m in CharLM(model_config(r, 10)).modules()
            if hasattr(m, "solver")} == {"approximate"}
    with pytest.raises(ValueError, match="unknown keys"):
        RecallRun(hybrid={"finnish": "optimum"})
