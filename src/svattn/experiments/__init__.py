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

from svattn.experiments.runner import EXPERIMENTS, reproduce

__all__ = ["EXPERIMENTS", "reproduce"]
