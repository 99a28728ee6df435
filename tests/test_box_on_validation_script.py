"""benchmarks/box_on_validation.py: the verdict names the condition the chosen box met, and
validation rows found in a run's own splits are counted."""

from __future__ import annotations

import torch

from script_helpers import load_script

box = load_script("benchmarks/box_on_validation.py")


def _forward(chosen: float, best: float) -> dict:
    def row(C, test):
        return {"C": C, "test": {"mean": test}}

    return {"chosen_overall": row(chosen, 0.97), "best_on_test": row(best, 0.98),
            "fixed": row(1 / 16, 0.7),
            "by_box": [row(1 / 4, 0.8), row(1 / 8, 0.98), row(1 / 16, 0.7)]}


def test_the_verdict_names_c_equal_one_over_n_data_when_it_won():
    text = box.verdict(_forward(1 / 8, 1 / 8), 1 / 16, 8)
    assert text.startswith("validation chose C = 1/8 (C = 1/n_data, n_data = 8 data tokens)")
    assert "fixed box C = 1/16's 0.700" in text and text.endswith("(the same box)")


def test_the_verdict_says_when_the_chosen_box_is_not_one_over_n_data():
    text = box.verdict(_forward(1 / 4, 1 / 8), 1 / 16, 8)
    assert "C = 1/4, not 1/n_data = 1/8" in text and "the same box" not in text


def test_the_verdict_of_a_grid_retrained_in_part_says_what_was_not_compared():
    one = {**_forward(1 / 8, 1 / 8), "fixed": None, "by_box": [{"C": 1 / 8}]}
    text = box.verdict(one, 1 / 16, 8)
    assert text.startswith("validation chose C = 1/8 (the only box compared) (C = 1/n_data")
    assert "the fixed box C = 1/16: not among the compared boxes" in text


def test_rows_shared_with_a_runs_split_are_counted():
    rows = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    train, test = torch.tensor([[4, 5, 6], [0, 0, 0]]), torch.tensor([[7, 8, 9]])
    assert box.overlap(rows, train, test) == 2
    assert box.overlap(rows, torch.zeros(1, 3, dtype=torch.long)) == 0
