"""Write ``results/README.md``: every record under ``results/``, the claim it backs, the
command that produced it.

Run from the repository root::

    python scripts/results_index.py            # rewrites results/README.md
    python scripts/results_index.py --check    # exit 1 if results/README.md is stale

The index is generated, never edited by hand: ``tests/test_results_index.py`` fails when
the committed file differs from what this tool writes now. A record counts as cited when
``README.md`` or a page under ``docs/`` names its path (``results/NAME``); each citation
is shown with a short excerpt of the sentence (or table row) around it. A folder under
``results/`` is one entry (its own README, if any, describes its files). The command is a
record's ``"command"`` field; a list of records gives each entry's command; a file that is
not a JSON record (a figure, a checkpoint, a log) takes the command of any record whose
command names its path. A folder's JSON records are each listed by name with their own
command. Files no document cites are listed in a section of their own.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INDEX = "results/README.md"
EXCERPT = 110  # characters kept on each side of a citation, at most


def documents(root: Path) -> list[Path]:
    """The documents whose citations count: README.md, docs/*.md and CHANGELOG.md (a
    change's measured figure is a claim too), in a fixed order."""
    docs = [root / "README.md"] if (root / "README.md").is_file() else []
    log = [root / "CHANGELOG.md"] if (root / "CHANGELOG.md").is_file() else []
    return docs + sorted((root / "docs").glob("*.md")) + log


def units(root: Path) -> list[Path]:
    """The entries of the index: every file directly under results/ (but the index) and
    every folder under it, as one entry each."""
    results = root / "results"
    return [p for p in sorted(results.iterdir(), key=lambda p: p.name)
            if p.name != "README.md" and not p.name.startswith(".")]


def _files(unit: Path) -> list[Path]:
    if unit.is_dir():
        return sorted(p for p in unit.rglob("*") if p.is_file())
    return [unit]


def _load_json(path: Path):
    if path.suffix != ".json":
        return None
    try:
        return json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError):
        return None


def record_commands(data) -> list[str]:
    """The commands a record names: its own ``"command"``, or, for a list of records,
    each entry's (``id: command`` when the entry has an id), in order, without repeats."""
    found: list[str] = []
    if isinstance(data, dict) and isinstance(data.get("command"), str):
        found.append(data["command"])
    elif isinstance(data, list):
        for entry in data:
            if isinstance(entry, dict) and isinstance(entry.get("command"), str):
                label = entry.get("id")
                found.append(f"{label}: {entry['command']}" if label else entry["command"])
    return list(dict.fromkeys(found))


def _all_commands(data, out: list[str]) -> None:
    """Every ``"command"`` string anywhere in a JSON value (to find a figure's writer)."""
    if isinstance(data, dict):
        for key, value in data.items():
            if key == "command" and isinstance(value, str):
                out.append(value)
            else:
                _all_commands(value, out)
    elif isinstance(data, list):
        for value in data:
            _all_commands(value, out)


def _cites(text: str, rel: str, folder: bool):
    tail = r"(?=[/\s`)\]'\"*,;:|]|$)" if folder else r"(?![\w/-]|\.\w)"
    return re.finditer(r"(?<![\w-])" + re.escape(rel) + tail, text)


def _excerpt(text: str, start: int, end: int) -> str:
    """The sentence (or table row, or code line) around text[start:end], whitespace
    flattened, cut to EXCERPT characters on each side at word boundaries."""
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", end)
    line_end = len(text) if line_end < 0 else line_end
    in_code = text.count("```", 0, start) % 2 == 1
    if in_code or text[line_start:line_end].lstrip().startswith("|"):
        lo, hi = line_start, line_end  # a table row or a line of a code block
    else:
        para_lo = text.rfind("\n\n", 0, start)
        para_lo = 0 if para_lo < 0 else para_lo + 2
        para_hi = text.find("\n\n", end)
        para_hi = len(text) if para_hi < 0 else para_hi
        stops = [m.end() for m in re.finditer(r"[.!?]\s+(?=[A-Z*`\[(])", text[para_lo:start])]
        lo = para_lo + (stops[-1] if stops else 0)
        after = re.search(r"[.!?](?=\s+[A-Z*`\[(]|\s*$)", text[end:para_hi])
        hi = end + after.end() if after else para_hi
    before = " ".join(text[lo:start].split())
    after_text = " ".join(text[end:hi].split())
    hit = " ".join(text[start:end].split())
    if len(before) > EXCERPT:
        before = "…" + before[len(before) - EXCERPT:].split(" ", 1)[-1]
    if len(after_text) > EXCERPT:
        after_text = after_text[:EXCERPT].rsplit(" ", 1)[0] + "…"
    sep_b = " " if text[start - 1:start].isspace() and before else ""
    sep_a = " " if text[end:end + 1].isspace() and after_text else ""
    return f"{before}{sep_b}{hit}{sep_a}{after_text}".strip()


def _code(text: str) -> str:
    fence = "``" if "`" in text else "`"
    pad = " " if fence == "``" else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def citations(root: Path, unit: Path) -> list[tuple[str, str]]:
    """(document, quoted excerpt) for each document citing the unit: its first citation,
    and how many more the document holds."""
    rel = unit.relative_to(root).as_posix()
    found = []
    for doc in documents(root):
        text = doc.read_text()
        hits = list(_cites(text, rel, unit.is_dir()))
        if hits:
            first = hits[0]
            more = f" (and {len(hits) - 1} more)" if len(hits) > 1 else ""
            found.append((doc.relative_to(root).as_posix(),
                          f"“{_excerpt(text, first.start(), first.end())}”{more}"))
    return found


def commands(root: Path, unit: Path, every_command: list[str]) -> list[str]:
    """The commands that produced a unit (a folder: those of the records inside it)."""
    found: list[str] = []
    for path in _files(unit):
        found += record_commands(_load_json(path))
    if not found:
        rel = unit.relative_to(root).as_posix()
        found = [c for c in every_command if re.search(re.escape(rel) + r"(?![\w.-])", c)]
    return list(dict.fromkeys(found))


def _record_lines(folder: Path, name: str) -> list[str]:
    """One line per JSON record inside ``folder``, naming it and the command it
    records (a folder's records are each indexed, not only counted)."""
    records = [p for p in _files(folder) if p.suffix == ".json"]
    if not records:
        return []
    out = [f"- records ({len(records)}):"]
    for path in records:
        rel = path.relative_to(folder).as_posix()
        cmds = record_commands(_load_json(path))
        said = ("no command recorded" + (f" (see [`{name}README.md`]({name}README.md))"
                                          if (folder / "README.md").is_file() else "")
                if not cmds else "; ".join(_code(c) for c in cmds))
        out.append(f"  - [`{rel}`]({name}{rel}): {said}")
    return out


def render(root: Path = ROOT) -> str:
    """The text of results/README.md for the tree at ``root``."""
    every_command: list[str] = []
    for path in sorted((root / "results").rglob("*.json")):
        _all_commands(_load_json(path), every_command)
    every_command = list(dict.fromkeys(every_command))
    cited, uncited = [], []
    for unit in units(root):
        entry = (unit, citations(root, unit), commands(root, unit, every_command))
        (cited if entry[1] else uncited).append(entry)
    docs = ", ".join(f"`{d.relative_to(root).as_posix()}`" for d in documents(root))
    out = [
        "# Results: every record, the claim it backs, the command that wrote it",
        "",
        "Written by `python scripts/results_index.py` from the files under `results/` and the",
        f"documents that cite them ({docs}); never edited by hand —",
        "`tests/test_results_index.py` fails when this file differs from what the tool writes.",
        "A folder is one entry; its own README, where it has one, describes its files.",
        "",
        f"{len(cited) + len(uncited)} entries: {len(cited)} cited, {len(uncited)} not cited "
        "by any document.",
        "",
        "## Cited by the documentation",
        "",
    ]
    for section in (cited, uncited):
        if section is uncited:
            out += ["## Not cited by any document", "",
                    "No page of the documentation names these; each is kept until a claim "
                    "uses it or it is moved out.", ""]
        for unit, cites, cmds in section:
            name = unit.name + ("/" if unit.is_dir() else "")
            out.append(f"### [`{name}`]({name})")
            out.append("")
            if unit.is_dir():
                files = _files(unit)
                readme = unit / "README.md"
                what = f"{len(files)} files"
                if readme.is_file():
                    what += f"; described in [`{name}README.md`]({name}README.md)"
                out += [f"- folder: {what}"]
                out += _record_lines(unit, name)
            for doc, text in cites:
                up = "../" + doc
                out.append(f"- cited by [`{doc}`]({up}): {text}")
            if not cmds:
                out.append("- command: no command recorded")
            elif len(cmds) == 1:
                out.append(f"- command: {_code(cmds[0])}")
            else:
                out.append(f"- commands ({len(cmds)}):")
                out += [f"  - {_code(c)}" for c in cmds]
            out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if results/README.md is not current")
    args = parser.parse_args(argv)
    text = render(ROOT)
    target = ROOT / INDEX
    if args.check:
        current = target.read_text() if target.is_file() else ""
        if current != text:
            print(f"{INDEX} is stale: run python scripts/results_index.py", file=sys.stderr)
            return 1
        print(f"{INDEX} is current")
        return 0
    target.write_text(text)
    print(f"wrote {INDEX}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
