"""The experiments' names and what their full mode reads: cheap to import (no torch).

The command line's ``--help`` reads this module only; :mod:`.runner` imports the
experiment modules themselves when they run.
"""

from __future__ import annotations

__all__ = ["EXPERIMENTS", "SHARED_DATA"]

#: CLI name -> module with ``run(ctx)``.
EXPERIMENTS: dict[str, str] = {
    "forgetting": "svattn.experiments.forgetting",
    "secret": "svattn.experiments.secret",
    "rare-recall": "svattn.experiments.rare_recall",
    "selective-copy": "svattn.experiments.selective_copy",
    "recall": "svattn.experiments.recall",
    "icu": "svattn.experiments.icu",
    "patient-deletion": "svattn.experiments.patient_deletion",
    "fact-editing": "svattn.experiments.fact_editing",
    "model-forgetting": "svattn.experiments.model_forgetting",
    "lm": "svattn.experiments.lm",
    "throughput": "svattn.experiments.lm",
}

#: Experiments whose full mode reads ``--data-dir`` (``../shared/data``), and what under
#: it; without it they run on the slices shipped in the package. The others need none.
SHARED_DATA: dict[str, str] = {
    "forgetting": "icu/ and enwik8/",
    "icu": "icu/",
    "patient-deletion": "icu/",
}
