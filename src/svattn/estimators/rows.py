"""Which row is which: the ids an :class:`~svattn.estimators.SVDD` addresses its rows by.

Every row a model holds has an id, from the first of

* ``ids=`` given to ``fit`` / ``partial_fit`` (one per row),
* the index labels of a pandas DataFrame ``X``,
* its running position: 0, 1, ... over every row given since ``fit``, continuing
  across ``partial_fit``, the sample index scikit-learn calls it.

An id is an int or a str (a JSON receipt keeps either as it is). The exact core knows a
row by its *token id*, which is its running position; :class:`RowLedger` maps one to
the other for the rows held. A forgotten row's id is dropped from the ledger (nothing
of a forgotten row is kept), so after a forget its id may name a new row.

The model is *positional* while every id it was given equals the row's running
position (arrays without ``ids=``, a DataFrame with the default index): then
``forget(indices=...)`` and ``forget(ids=...)`` name the same rows and both are
accepted. Any other id (a shuffled DataFrame's labels, ``ids=`` of names) makes it
addressed by id only, and a position is refused: it would name another row.
"""

from __future__ import annotations

import numbers

import numpy as np

RowId = int | str
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def row_id(value, what: str) -> RowId:
    """``value`` as an id: a Python int (numpy ints too) or str; ``TypeError`` naming
    ``what`` otherwise (a bool, a float, a timestamp: their equality is not the user's)."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{what}: ids are ints or strs, got the bool {value!r}")
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, str):
        return str(value)
    raise TypeError(f"{what}: ids are ints or strs, got {type(value).__name__} {value!r:.40}; "
                    "give ids= of ints or strs (e.g. ids=X.index.astype(str))")


def id_list(values, what: str) -> list[RowId]:
    """A non-empty 1-D sequence of ids (each :func:`row_id`), none twice."""
    if isinstance(values, (str, bytes)) or np.ndim(values) != 1:
        raise ValueError(f"{what} must be a 1-D sequence of ids (ints or strs), got "
                         f"{values!r:.60}")
    ids = [row_id(v, what) for v in values]
    if not ids:
        raise ValueError(f"{what} must name at least one row, got an empty sequence")
    seen: set[RowId] = set()
    twice = [i for i in ids if i in seen or seen.add(i)]
    if twice:
        raise ValueError(f"{what} lists {sorted(map(repr, set(twice)))[:5]} more than once")
    return ids


def frame_labels(X) -> list | None:
    """The index labels of a pandas DataFrame ``X`` (None for anything else)."""
    index = getattr(X, "index", None)
    if index is None or not hasattr(X, "columns"):
        return None
    return list(index)


def subject_tags(subjects, n: int, key) -> list[str | None] | None:
    """``subjects=`` checked: one non-empty str (or None) per row, and the controller's
    ``key`` (None: the model holds none) to keep them under. Nothing changes here."""
    if subjects is None:
        return None
    if isinstance(subjects, (str, bytes)) or np.ndim(subjects) != 1:
        raise ValueError(f"subjects must be a 1-D sequence of one subject per row, got "
                         f"{subjects!r:.60}")
    tags = list(subjects)
    if len(tags) != n:
        raise ValueError(f"subjects must give one subject per row of X: {n} rows, "
                         f"{len(tags)} subjects")
    bad = [t for t in tags if not (t is None or (isinstance(t, str) and t))]
    if bad:
        raise TypeError(f"subjects: each must be a non-empty str, or None for a row of no "
                        f"subject; got {bad[0]!r} ({type(bad[0]).__name__}): convert "
                        "them, e.g. subjects=df.patient_id.astype(str)")
    if key is None and any(t is not None for t in tags):
        raise ValueError("subjects are kept only as hashes keyed by the controller's key, "
                         "and this model holds none: give SVDD(signing_key=...) (svattn "
                         "keygen writes one; a pickled model holds no key: "
                         "SVDD.load(MODEL, signing_key=...))")
    return [None if t is None else str(t) for t in tags]


def matching_tokens(X: np.ndarray, held: list[int], keys: np.ndarray) -> list[int]:
    """The tokens (``held``, aligned with their ``keys``) equal to a row of ``X``: every
    copy of each; ``ValueError`` naming a row that matches none."""
    # rows by their bytes with -0.0 written as 0.0 (+ 0.0), as the core's
    # commitments and copy lists take them: equal values, one record
    keys = keys + 0.0
    by_row: dict[bytes, list[int]] = {}
    for tid, row in zip(held, keys, strict=True):
        by_row.setdefault(row.tobytes(), []).append(tid)
    tokens: list[int] = []
    asked: set[bytes] = set()
    for r, row in enumerate(np.ascontiguousarray(X) + 0.0):
        data = row.tobytes()
        if data in asked:
            continue  # a repeated row: its samples are already listed
        found = by_row.pop(data, None)
        if found is None:
            raise ValueError(f"X row {r} matches no sample the model holds")
        asked.add(data)
        tokens += found
    return tokens


class RowLedger:
    """The ids of a model's rows: row id <-> the core's token id, for the rows held.

    The memory decides what is held; the ledger only names it (a token the memory no
    longer holds is never reported held, whatever the ledger still says).
    """

    def __init__(self) -> None:
        self._id_of: dict[int, RowId] = {}
        self._token_of: dict[RowId, int] = {}
        self.positional = True

    # ------------------------------------------------------------- adding
    def new_ids(self, given, labels, start: int, n: int, holds) -> tuple[list[RowId], bool]:
        """The ids of ``n`` rows about to get tokens ``start .. start + n - 1``, and
        whether the model stays positional (``given``: ``ids=``; ``labels``: the
        DataFrame's index labels, :func:`frame_labels`, or None). Nothing changes here.

        Raises
        ------
        ValueError, TypeError
            ``ids=`` of another length, an id twice, an id already held, a DataFrame
            index with a label twice, or rows without ids in a model addressed by id.
        """
        if given is not None:
            ids = id_list(given, "ids")
            if len(ids) != n:
                raise ValueError(f"ids must give one id per row of X: {n} rows, {len(ids)} ids")
        elif labels is not None:
            ids = [row_id(v, "X's index labels (the rows' ids)") for v in labels]
            seen: set[RowId] = set()
            twice = [i for i in ids if i in seen or seen.add(i)]
            if twice:
                raise ValueError(
                    f"X's index has the labels {sorted(map(repr, set(twice)))[:5]} more than "
                    "once: a row must be named by one label (a forget by that label would be "
                    "ambiguous); reset_index() or give ids=")
        else:
            if not self.positional:
                raise ValueError(
                    "this model's rows are addressed by id (it was given a DataFrame's index "
                    "labels or ids=), and these rows come without any: give ids= (one per "
                    "row) or a DataFrame whose index labels them")
            ids = list(range(start, start + n))
        held = [i for i in ids if self.token(i, holds) is not None]
        if held:
            raise ValueError(f"ids {sorted(map(repr, held))[:5]} are already held by the model "
                             "(an id names one row; forget the old row first)")
        positional = self.positional and ids == list(range(start, start + n))
        return ids, positional

    def add(self, tokens: list[int], ids: list[RowId]) -> None:
        """Name the tokens ``tokens`` by ``ids`` (checked by :meth:`new_ids`)."""
        for t, i in zip(tokens, ids, strict=True):
            self._id_of[t] = i
            self._token_of[i] = t

    def drop(self, tokens) -> None:
        """Forget the ids of ``tokens`` (removed from the memory, or never added)."""
        for t in tokens:
            i = self._id_of.pop(int(t), None)
            if i is not None and self._token_of.get(i) == t:
                del self._token_of[i]

    # ------------------------------------------------------------- reading
    def token(self, row, holds) -> int | None:
        """The token of the held row ``row`` (None when no held row has that id)."""
        t = self._token_of.get(row)
        return t if t is not None and holds(t) else None

    def tokens(self, ids: list[RowId], holds) -> list[int]:
        """The tokens of the held rows ``ids``; ``ValueError`` naming every id not held."""
        out = [self.token(i, holds) for i in ids]
        missing = [i for i, t in zip(ids, out, strict=True) if t is None]
        if missing:
            raise ValueError(f"ids {[*missing[:5]]!r} are not held by the model (never given, "
                             "or forgotten already: the model keeps no trace of a forgotten "
                             "row, its id included)")
        return [int(t) for t in out]

    def ids_of(self, tokens) -> list[RowId]:
        """The ids of the held tokens ``tokens``."""
        return [self._id_of[int(t)] for t in tokens]

    def as_array(self, tokens) -> np.ndarray:
        """The ids of ``tokens`` as an array: int64 when every id is an int int64 holds,
        else object (an id is any Python int: 2**70 is one)."""
        ids = self.ids_of(tokens)
        if all(isinstance(i, int) and _INT64_MIN <= i <= _INT64_MAX for i in ids):
            return np.array(ids, dtype=np.int64)
        out = np.empty(len(ids), dtype=object)
        out[:] = ids
        return out

    # ---------------------------------------------------------- persisting
    def to_dict(self, tokens) -> dict:
        """The held rows' ids (``tokens``: the memory's, in order) as JSON-ready data."""
        return {"positional": self.positional, "tokens": [int(t) for t in tokens],
                "ids": self.ids_of(tokens)}

    @classmethod
    def from_dict(cls, data, tokens: list[int], where: str) -> RowLedger:
        """The ledger :meth:`to_dict` wrote, checked against the memory's ``tokens``."""
        if not (isinstance(data, dict) and set(data) == {"positional", "tokens", "ids"}):
            raise ValueError(f"{where}: rows must be an object with positional, tokens, ids")
        if not isinstance(data["positional"], bool):
            raise ValueError(f"{where}: rows.positional must be true or false")
        if data["tokens"] != tokens:
            raise ValueError(f"{where}: rows.tokens are not the tokens the state file holds")
        if not isinstance(data["ids"], list) or len(data["ids"]) != len(tokens):
            raise ValueError(f"{where}: rows.ids must be a list of one id per token")
        ids = [row_id(v, f"{where}: rows.ids") for v in data["ids"]]
        if len(set(ids)) != len(ids):
            raise ValueError(f"{where}: rows.ids names a row twice")
        if data["positional"] and ids != tokens:
            raise ValueError(f"{where}: rows.positional is true, but the ids are not the "
                             "rows' positions")
        ledger = cls()
        ledger.add(tokens, ids)
        ledger.positional = data["positional"]
        return ledger


__all__ = ["RowId", "RowLedger", "frame_labels", "id_list", "matching_tokens", "row_id",
           "subject_tags"]
