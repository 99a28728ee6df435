"""The paper's experiments, one small module each, run by ``svattn reproduce``.

Each module has a core function that can be imported and tested on its own
(e.g. :func:`svattn.experiments.forgetting.removal_trial`) and a ``run(ctx)``
that performs the experiment and returns an
:class:`~svattn.experiments._common.ExperimentResult`; :mod:`.runner` writes
the reports. The certified core (:mod:`svattn.exact`) never imports this package.

Examples
--------
>>> from svattn.experiments import EXPERIMENTS
>>> list(EXPERIMENTS)[:2]
['forgetting', 'secret']
"""

from svattn.experiments.catalog import EXPERIMENTS

__all__ = ["EXPERIMENTS", "reproduce"]


def __getattr__(name: str):
    # the runner (and torch, through the experiments' helpers) loads on first use only,
    # so that the command line's --help stays cheap
    if name == "reproduce":
        from svattn.experiments.runner import reproduce

        return reproduce
    raise AttributeError(f"module 'svattn.experiments' has no attribute {name!r}")
