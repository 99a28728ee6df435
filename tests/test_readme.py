"""The README's Python examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README has no python example"
    for code in blocks:
        exec(compile(code, str(README), "exec"), {"print": lambda *a, **k: None})


def test_readme_names_the_ci_test_command():
    ci = (README.parent / ".ci" / "run").read_text()
    assert "make test" in ci and "make test" in README.read_text()
    assert "make demo" in README.read_text()


def test_documented_output_folders_are_ignored():
    """Every output folder a documented command writes outside ``results/`` (``--out DIR``,
    ``--runs DIR``) is ignored by git: following the docs leaves a clean tree."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    text = "".join(p.read_text() for p in pages)
    folders = {m.group(1).rstrip("/") for m in re.finditer(
        r"--(?:out|runs|save) ([A-Za-z0-9_./-]+)", text)}
    local = sorted(f for f in folders if not f.startswith(("results", "/", "$", ".."))
                   and "." not in Path(f).name and not f.isupper())  # NAME: a placeholder
    assert "demo-run" in local  # the README's auditor path
    for folder in local:
        probe = f"{folder}/x.json"
        done = subprocess.run(["git", "check-ignore", "-q", probe], cwd=root)
        assert done.returncode == 0, f"{folder}/ (documented output) is not in .gitignore"


def test_documented_key_folders_are_ignored():
    """The folder a documented ``svattn keygen PREFIX`` writes its private key into is
    ignored by git: following the README never stages a private key."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    text = "".join((root / p).read_text() for p in ("README.md", "docs/trust.md"))
    prefixes = {m.group(1) for m in re.finditer(r"svattn keygen ([A-Za-z0-9_./-]+)", text)}
    local = sorted(p for p in prefixes if "/" in p and not p.startswith(("/", "$", "..")))
    assert "keys/controller" in local  # the README's auditor path
    for prefix in local:
        done = subprocess.run(["git", "check-ignore", "-q", f"{prefix}.key"], cwd=root)
        assert done.returncode == 0, f"{prefix}.key (a documented private key) is not ignored"


def test_relative_links_in_the_docs_resolve():
    """Every relative link in README.md and docs/*.md names a file or folder that exists
    (pages moved from the README to docs/ link back with ../)."""
    root = Path(__file__).resolve().parents[1]
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith(("http://", "https://", "#", "mailto:")):
                continue
            path = (page.parent / target.split("#", 1)[0]).resolve()
            if not path.exists():
                broken.append(f"{page.relative_to(root)}: {target}")
    assert broken == []


def test_documented_torch_spec_reaches_pip_as_words():
    """The README's TORCH_SPEC (PyTorch's CPU index) reaches pip as separate words, not
    as one quoted requirement pip would reject; the default pin stays shell-quoted."""
    import shutil
    import subprocess

    import pytest

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    root = Path(__file__).resolve().parents[1]
    (spec,) = re.findall(r'make test TORCH_SPEC="([^"]+)"', README.read_text())
    assert "--index-url https://download.pytorch.org/whl/cpu" in spec

    def dry_run(*extra: str) -> str:  # -n: print the set-up recipe, run nothing
        done = subprocess.run(["make", "-n", "-W", "pyproject.toml", ".venv/bin/.installed",
                               *extra], cwd=root, capture_output=True, text=True, check=True)
        return done.stdout

    assert f"pip install -q {spec}\n" in dry_run(f"TORCH_SPEC={spec}")
    assert re.search(r"pip install -q 'torch(==2\.13\.0|>=2\.1)'\n", dry_run())


def test_dotted_names_in_the_docs_resolve():
    """Every ``svattn.<module>[.<name>]`` the README and docs/*.md quote in backticks
    imports and has that attribute (a module moved by a refactor leaves no stale name)."""
    import importlib

    root = Path(__file__).resolve().parents[1]
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    stale = []
    for page in pages:
        for name in sorted(set(re.findall(r"`(svattn(?:\.[A-Za-z_]\w*)+)", page.read_text()))):
            parts = name.split(".")
            for i in range(len(parts), 0, -1):
                try:
                    obj = importlib.import_module(".".join(parts[:i]))
                except ImportError:
                    continue
                for attr in parts[i:]:
                    obj = getattr(obj, attr, None)
                if obj is None:
                    stale.append(f"{page.relative_to(root)}: {name}")
                break
    assert stale == []
