"""``results/README.md`` is what ``scripts/results_index.py`` writes now, and every figure
the README's headline table quotes is in the record its row links to."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from script_helpers import load_script

ROOT = Path(__file__).resolve().parents[1]


def _tool():
    return load_script("scripts/results_index.py")


# ------------------------------------------------------------------ the index


def test_committed_index_is_what_the_tool_writes():
    committed = (ROOT / "results" / "README.md").read_text()
    assert committed == _tool().render(ROOT), (
        "results/README.md is stale: run python scripts/results_index.py")


def test_index_lists_every_entry_under_results():
    text = (ROOT / "results" / "README.md").read_text()
    for entry in (ROOT / "results").iterdir():
        if entry.name == "README.md":
            continue
        name = entry.name + ("/" if entry.is_dir() else "")
        assert f"### [`{name}`]({name})" in text, f"results/{name} is not in the index"


def test_index_names_every_record_inside_a_folder():
    # a folder was one entry with a file count: results/bench_rbf_distances/'s 8 records
    # went unnamed in the index
    text = (ROOT / "results" / "README.md").read_text()
    for folder in (p for p in (ROOT / "results").iterdir() if p.is_dir()):
        for record in sorted(folder.rglob("*.json")):
            rel = record.relative_to(folder).as_posix()
            link = f"[`{rel}`]({folder.name}/{rel})"
            assert link in text, f"results/{folder.name}/{rel} is not named in the index"


def test_a_folders_records_are_listed_with_their_commands(tmp_path):
    root = _tree(tmp_path, "`results/sub/` holds more.\n")
    (root / "results" / "sub" / "e.json").write_text(json.dumps({"x": 3}))
    (root / "results" / "sub" / "README.md").write_text("How e.json was made.\n")
    text = _tool().render(root)
    assert "- records (2):\n  - [`d.json`](sub/d.json): `make d`\n" in text
    assert ("  - [`e.json`](sub/e.json): no command recorded (see "
            "[`sub/README.md`](sub/README.md))") in text


def _tree(tmp_path: Path, readme: str) -> Path:
    (tmp_path / "results" / "sub").mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(readme)
    (tmp_path / "docs" / "notes.md").write_text("Nothing cited here.\n")
    (tmp_path / "results" / "a.json").write_text(json.dumps(
        {"command": "python make_a.py --json results/a.json --plot results/a.png", "x": 1}))
    (tmp_path / "results" / "a.png").write_bytes(b"\x89PNG")
    (tmp_path / "results" / "b.json").write_text(json.dumps([{"id": "r1", "command": "run 1"},
                                                             {"id": "r2", "command": "run 2"}]))
    (tmp_path / "results" / "c.json").write_text(json.dumps({"x": 2}))
    (tmp_path / "results" / "sub" / "d.json").write_text(json.dumps({"command": "make d"}))
    return tmp_path


def test_index_names_claims_commands_and_the_uncited(tmp_path):
    root = _tree(tmp_path, "# T\n\nThe removal is fast. It takes 1 ms (`results/a.json`). "
                           "Later text.\n\nThe folder `results/sub/` holds more.\n")
    text = _tool().render(root)
    cited, uncited = text.split("## Not cited by any document")
    assert "### [`a.json`](a.json)" in cited and "### [`sub/`](sub/)" in cited
    assert "“It takes 1 ms (`results/a.json`).”" in cited  # the sentence, not the paragraph
    assert "`python make_a.py --json results/a.json --plot results/a.png`" in cited
    # a figure takes the command of the record that names it; a list gives each entry's
    assert "### [`a.png`](a.png)\n\n- command: `python make_a.py" in uncited
    assert "`r1: run 1`" in uncited and "`r2: run 2`" in uncited
    assert "### [`c.json`](c.json)\n\n- command: no command recorded" in uncited
    # results/a.json cited does not make results/a.json.bak or results/a.jsonl cited
    root = _tree(tmp_path / "other", "See `results/a.jsonl` and results/a.json.bak.\n")
    cited, _ = _tool().render(root).split("## Not cited by any document")
    assert "a.json`](a.json)" not in cited


def test_check_mode_fails_on_a_stale_index(tmp_path, monkeypatch):
    tool = _tool()
    root = _tree(tmp_path, "`results/a.json`\n")
    (root / "scripts").mkdir()
    monkeypatch.setattr(tool, "ROOT", root)
    assert tool.main([]) == 0 and tool.main(["--check"]) == 0
    (root / "results" / "e.json").write_text("{}")
    assert tool.main(["--check"]) == 1


# ------------------------------------------------- the README's headline figures

NUMBER = re.compile(r"[+\-\u2212]?\d[\d,]*(?:\.\d+)?(?:[eE][+\-\u2212]?\d+)?")


def headline_rows(readme: str) -> list[tuple[str, str, str]]:
    """(measured, figure, link target) for each row of the README's headline table."""
    section = readme.split("## Headline figures", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or set(cells[0]) <= {"-", " "} or cells[0] == "measured":
            continue
        link = re.fullmatch(r"\[[^\]]+\]\(([^)]+)\)", cells[2])
        assert link, f"headline row without a link to its record: {line}"
        rows.append((cells[0], cells[1], link.group(1)))
    return rows


def _numbers(value, out: list[float]) -> None:
    """Every number in a JSON value: its numeric leaves and the numbers written in its
    strings (reports state figures in text)."""
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        if math.isfinite(value):
            out.append(float(value))
    elif isinstance(value, str):
        out += [_to_float(t) for t in NUMBER.findall(value)]
    elif isinstance(value, dict):
        for v in value.values():
            _numbers(v, out)
    elif isinstance(value, list):
        for v in value:
            _numbers(v, out)


def _to_float(token: str) -> float:
    return float(token.replace(",", "").replace("\u2212", "-"))


def quoted_in_record(quoted: str, numbers: list[float]) -> bool:
    """True when some number of the record, written with the precision ``quoted`` shows
    (its digits after the point, in fixed or exponent form), is ``quoted``."""
    token = quoted.replace(",", "").replace("\u2212", "-").lstrip("+")
    mantissa = token.lower().split("e")[0]
    places = len(mantissa.split(".")[1]) if "." in mantissa else 0
    form = "e" if "e" in token.lower() else "f"
    want = float(token)
    return any(float(format(x, f".{places}{form}")) == want for x in numbers)


def missing_figures(root: Path, readme: str) -> list[str]:
    """Each quoted figure of the headline table that its linked record does not hold."""
    missing = []
    rows = headline_rows(readme)
    assert rows, "the README has no headline table"
    for measured, figure, target in rows:
        path = (root / target).resolve()
        assert path.is_file() and path.suffix == ".json", f"{target}: not a JSON record"
        assert (root / "results") in path.parents, f"{target}: not under results/"
        numbers: list[float] = []
        _numbers(json.loads(path.read_text()), numbers)
        tokens = NUMBER.findall(figure)
        assert tokens, f"row {measured!r} quotes no figure"
        missing += [f"{t} ({target})" for t in tokens if not quoted_in_record(t, numbers)]
    return missing


def test_every_headline_figure_is_in_its_record():
    readme = (ROOT / "README.md").read_text()
    assert len(headline_rows(readme)) >= 8
    assert missing_figures(ROOT, readme) == []


@pytest.mark.parametrize("figure, held", [
    ("0.39 ms", True), ("0.40 ms", False), ("111×", True), ("112×", False),
    ("3.0e-14", True), ("3.1e-14", False), ("−0.188 [−0.330, −0.046]", True),
    ("+0.188", False), ("16,000", True), ("17,000", False),
])
def test_a_figure_not_in_its_record_is_caught(tmp_path, figure, held):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "r.json").write_text(json.dumps(
        {"ms": 0.39447, "speedup": 111.46, "dev": 2.9649e-14, "n": 16000,
         "margin": {"mean": -0.18775, "ci95": [-0.32995, -0.04555]}}))
    readme = ("## Headline figures\n\n| measured | figure | record |\n|---|---|---|\n"
              f"| a thing | {figure} | [r.json](results/r.json) |\n")
    assert (missing_figures(tmp_path, readme) == []) is held
