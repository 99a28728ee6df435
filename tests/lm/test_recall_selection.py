"""Selection measured on the optimum (svattn.lm.recall_memory), and the box chosen on a
validation split (svattn.lm.recall_selection)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from svattn.exact import kernel_matrix
from svattn.exact.oracle import solve_svdd
from svattn.lm.model import CharLM
from svattn.lm.recall import RecallRun, build_task, model_config
from svattn.lm.recall_memory import optimum_selection, selection_summary
from svattn.lm.recall_selection import VALIDATION_SEED_OFFSET, choose_box, validation_split
from svattn.nn import SolverOptions
from svattn.nn.common import resolve_gamma
from svattn.tasks import ROLES

HYB = {"chunk": 8, "C": 1.0 / 4, "budget": 8}


def _run(**kw) -> RecallRun:
    base = dict(task="selective-copy", seq_len=32, d_model=16, steps=3, batch_size=4,
                num_train=16, num_test=8, hybrid=HYB,
                task_options={"num_data": 4, "num_symbols": 4})
    return RecallRun(**{**base, **kw})


def _model(run: RecallRun, solver: SolverOptions | None = None) -> CharLM:
    torch.manual_seed(0)
    data = build_task(run).build(run.seed)
    model = CharLM(model_config(run, data.vocab_size)).eval()
    if solver is not None:
        for b in model.blocks:
            b.mix.solver = solver
    return model


def test_the_optimum_is_feasible_and_both_exact_solvers_agree_on_it():
    run = _run()
    data = build_task(run).build(run.seed)
    got = optimum_selection(_model(run), data.test_inputs[:3], data.test_roles[:3])
    assert got["forward"] == {"exact": 3, "optimum_fallback": 0, "first_error": None}
    assert [x["layer"] for x in got["layers"]] == [0, 1]
    for x in got["layers"]:
        assert x["boundary"] == 24 and x["memories"] == 3 * 2  # sequences × heads
        assert x["memory_refused"] == 0 and x["max_objective_gap"] <= 1e-12
        for name in ("memory", "oracle"):
            m = x["by_solver"][name]
            assert m["min_alpha"] >= 0 and m["max_alpha_over_box"] <= 0, (name, m)
            assert m["max_sum_error"] <= 1e-12 and m["max_kkt_residual"] <= 1e-9
            # the box forces at least 1/C tokens to carry weight
            assert min(m["support_per_head"]) >= 1 / HYB["C"]
            # alpha sums to 1 per head: the roles' masses add up to it
            for h in range(2):
                assert math.isclose(sum(v[h] for v in m["mass_by_role"].values()), 1.0,
                                    abs_tol=1e-12)
        assert math.isclose(sum(x["share_by_role"].values()), 1.0, abs_tol=1e-12)


def test_the_mass_by_role_is_the_oracles_alpha_summed_over_that_roles_tokens():
    """One sequence, one head, by hand: the layer-0 keys (its input is the embedding
    through ln_1, which the test recomputes) solved by solve_svdd."""
    run = _run()
    data = build_task(run).build(run.seed)
    model = _model(run)
    x, roles = data.test_inputs[:1], data.test_roles[:1]
    got = optimum_selection(model, x, roles)["layers"][0]["by_solver"]["oracle"]
    with torch.no_grad():
        twin = model.double()
        e = twin.wte(x)
        h = twin.blocks[0].ln_1(e if twin.wpe is None else e + twin.wpe(torch.arange(32)))
        _, k, _ = twin.blocks[0].mix.qkv_heads(h)
    mix = model.blocks[0].mix
    X = k[0, 0, :24].numpy()
    gamma = resolve_gamma(mix.kernel, mix.gamma, X.shape[1])
    alpha = solve_svdd(kernel_matrix(X, X, mix.kernel, gamma), HYB["C"])
    data_tokens = roles[0, :24].numpy() == ROLES["data"]
    assert math.isclose(got["mass_by_role"]["data"][0], float(alpha[data_tokens].sum()),
                        abs_tol=1e-9)
    assert got["support_per_head"][0] == float((alpha > 0).sum())


def test_the_figures_do_not_depend_on_the_solver_the_model_carries():
    """The model's own (training) solver is never read: the paper's approximate finish
    and the default give the same exact figures."""
    run = _run()
    data = build_task(run).build(run.seed)
    x, roles = data.test_inputs[:2], data.test_roles[:2]
    a = optimum_selection(_model(run, SolverOptions(finish="approximate", refine=0,
                                                   ridge_steps=0, max_iter=2)), x, roles)
    b = optimum_selection(_model(run), x, roles)
    assert selection_summary(a["layers"]) == selection_summary(b["layers"])


def test_validation_rows_are_drawn_apart_from_the_runs_splits():
    run = _run(num_test=50)
    data = build_task(run).build(run.seed)
    vx, vy, vr = validation_split(run)
    assert vx.shape == data.test_inputs.shape and vy.shape == vr.shape == vx.shape
    assert not torch.equal(vx, data.test_inputs)
    again = build_task(run).build(run.seed + VALIDATION_SEED_OFFSET)
    assert torch.equal(vx, again.test_inputs)  # a seed of its own, reproducible
    assert len(validation_split(run, rows=5)[0]) == 5
    with pytest.raises(ValueError, match="rows must be in"):
        validation_split(run, rows=51)


def test_the_box_is_chosen_per_seed_and_overall_ties_to_the_larger_box():
    scores = {0.25: {0: 0.8, 1: 0.9, 2: 0.7}, 0.125: {0: 0.95, 1: 0.9, 2: 0.99},
              0.0625: {0: 0.5, 1: 0.6, 2: 0.9}}
    got = choose_box(scores)
    assert got["per_seed"] == {0: 0.125, 1: 0.25, 2: 0.125}
    assert got["overall"] == 0.125 and got["ties"] == [1]


def test_boxes_scored_on_different_seeds_are_refused():
    with pytest.raises(ValueError, match="different seeds"):
        choose_box({0.25: {0: 0.8}, 0.125: {1: 0.9}})
    with pytest.raises(ValueError, match="no box"):
        choose_box({})


def test_the_summary_averages_layers_and_heads():
    lay = {"layer": 0, "share_by_role": {"data": 0.2, "filler": 0.8}, "by_solver": {
        "oracle": {"support_per_head": [4.0, 8.0], "distinct_support_per_head": [2.0, 2.0],
                   "mass_by_role": {"data": [0.6, 0.4], "filler": [0.4, 0.6]},
                   "count_by_role": {"data": [2.0, 2.0], "filler": [2.0, 6.0]}}}}
    s = selection_summary([lay], "oracle")
    assert s == {"support_per_head": 6.0, "distinct_support_per_head": 2.0, "data_mass": 0.5,
                 "data_support_share": np.mean([0.5, 0.25]), "data_share": 0.2}
    with pytest.raises(ValueError, match="no layer measured by 'memory'"):
        selection_summary([lay], "memory")
