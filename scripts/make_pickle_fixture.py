"""Pickles of a memory (both backends) and a fitted ``svattn.SVDD``, with what the
code that pickled them computed next (a test fixture).

Run it with the svattn whose pickles the fixture should freeze::

    PYTHONPATH=<that checkout>/src python scripts/make_pickle_fixture.py \
        tests/exact/data/pickles_0c63920.pkl

``tests/exact/test_state_fixture.py`` unpickles them with today's code (the fixture
was written at commit 0c63920, before issue #38 moved the modules the pickles name;
rewritten by the same commit's code when the continuation's values were added).
"""

from __future__ import annotations

import pickle
import sys

import numpy as np

from svattn import SVDD
from svattn.exact import SVDDMemory

x = np.random.default_rng(0).normal(size=(30, 3))
y = np.random.default_rng(1).normal(size=(5, 3))
out = {"memories": {}, "after": {}, "after_values": {}}
for be in ("compiled", "reference"):
    m = SVDDMemory(0.2, "rbf", 0.5, backend=be)
    m.extend(x, x)
    m.remove(3)
    out["memories"][be] = pickle.dumps(m)
    m.extend(y, y)
    out["after"][be] = m.remove(7).state_digest
    # the continuation's values, for a comparison to rounding where another numpy or
    # BLAS sums in another order (the reference backend's products)
    out["after_values"][be] = {"ids": list(m.ids), "alpha": m.alpha.tolist(),
                               "mu": m.mu, "partition": m.partition()}
e = SVDD(nu=0.3).fit(x)
out["svdd"] = pickle.dumps(e)
out["svdd_decision"] = e.decision_function(y).tolist()
with open(sys.argv[1], "wb") as fh:
    pickle.dump(out, fh)
