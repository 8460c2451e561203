"""Every repository path that a doc, a docstring or a comment names exists: a file moved or
renamed must take its mentions along (docs/semantics.md once named attnbench/reference.py,
docstrings named SEMANTICS.md, which lives outside the repository).

A mention is a word that starts with a top-level folder of the repository
(``attnbench/``, ``scripts/``, ``docs/``, ``tests/``, ``.ci/``) or is a top-level file name
(``README.md``, ``pyproject.toml``, ``SOMETHING.md``). Mentions with a placeholder in them
(``NAME``, ``<...>``, ``*``, ``$VAR``, ``{...}``) name no one file and are passed over, and so
are ``results/`` (what runs write) and a path read off a device's machine (``/tmp/...``).
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOP = ("attnbench", "scripts", "docs", "tests", ".ci")
MENTION = re.compile(r"(?<![\w./$-])((?:%s)/[\w./+-]*[\w+])" % "|".join(re.escape(t) for t in TOP))
TOP_FILE = re.compile(r"(?<![\w./$-])([A-Z][A-Za-z_]*\.md|pyproject\.toml)\b")
PLACEHOLDER = re.compile(r"[A-Z]{3,}|[<>*{}$]|\.\.\.|[a-z][A-Z](?=[./]|$)")
TEXT_FILES = (".md", ".py", ".sh", ".toml", ".yaml", ".yml")
# files whose exact text is pinned elsewhere: editing even a comment breaks what pins it. Their
# mentions are fixed when they are next changed for their own sake.
PINNED: set = set()


def _files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / f for f in out if f.endswith(TEXT_FILES) or f.startswith(".ci/")]


def missing_mentions() -> list[str]:
    bad = []
    for f in _files():
        if not f.is_file() or f == Path(__file__).resolve() or str(f.relative_to(ROOT)) in PINNED:
            continue
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            for m in list(MENTION.finditer(line)) + list(TOP_FILE.finditer(line)):
                path, rest = m.group(1), (line[m.end(1):].split() or [""])[0]
                if any(c in rest for c in "{*<$"):  # shared-prefix-{decode,trees}-...: a pattern, not one file
                    continue
                if PLACEHOLDER.search(path.replace(".md", "")) and not TOP_FILE.fullmatch(path):
                    continue
                if not (ROOT / path).exists():
                    bad.append(f"{f.relative_to(ROOT)}:{n}: names {path}, which does not exist")
    return bad


def test_every_named_repository_path_exists():
    bad = missing_mentions()
    assert not bad, "\n".join(bad)
