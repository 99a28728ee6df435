"""The benchmarks' count of tokens joining the margin set in a forget
(``bench_stream_speed.margin_joins``, by which ``bench_real_data.py`` and
``bench_large_support.py`` group the paired ratios) against the certificate's events,
and ``by_joined`` at its edges."""

from __future__ import annotations

import numpy as np

from script_helpers import load_script


def test_a_token_that_joins_and_leaves_within_a_forget_is_counted_as_a_join():
    bench = load_script("benchmarks/bench_stream_speed.py")
    from streams import clustered_outliers  # (benchmarks/ is on the path once loaded)
    from svattn import SVDD

    model = SVDD(nu=0.05, gamma=0.1).fit(clustered_outliers(1000, 8, seed=1))
    rng = np.random.default_rng(1)
    more = 0
    for _ in range(28):
        victim = int(model.support_[rng.integers(len(model.support_))])
        before = model.memory_.partition()
        events = model.forget(indices=[victim]).certificates[0].n_events
        after = model.memory_.partition()
        net, joins = bench.margin_joins(before, after, events)
        # net: the margin set's new members (what the records' *_joined_all count)
        assert net == len(set(after["margin"]) - set(before["margin"]))
        left = len(set(before["margin"]) - set(after["margin"]) - {victim})
        # each event crosses the margin set's border (c's exit aside): the parity holds
        assert (events - 1 + net - left) % 2 == 0
        assert joins == (events - 1 + net - left) // 2 >= net
        more += joins > net
    # one of these forgets (the 28th) has a token join and leave again: 4 joins, 3 net
    assert more >= 1


def test_by_joined_keeps_only_the_counts_seen():
    bench = load_script("benchmarks/bench_stream_speed.py")
    assert bench.by_joined([], np.array([])) == {}
    got = bench.by_joined([3, 5, 9], np.array([1.0, 2.0, 4.0]))
    assert got == {"3+": {"forgets": 3, "median": 2.0}}
    got = bench.by_joined([0, 2, 0, 7], np.array([1.0, 2.0, 3.0, 4.0]))
    assert got == {"0": {"forgets": 2, "median": 2.0}, "2": {"forgets": 1, "median": 2.0},
                   "3+": {"forgets": 1, "median": 4.0}}
