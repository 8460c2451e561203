"""Checkouts of attnbench's own source to measure side by side: the working tree as it is, or
a commit exported into a temporary folder (``git archive``: tracked files only, no worktree
bookkeeping left behind). ``compare commits`` runs the same scenario from two of them."""
from __future__ import annotations

import io
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional


class CheckoutError(ValueError):
    """A revision or repository that cannot be measured; the message says why and the fix."""


@dataclass(frozen=True)
class Checkout:
    """Source of attnbench to import from (``root`` goes first on ``PYTHONPATH``)."""

    name: str  # "base" or "head"
    root: Path
    rev: str  # what the user asked for ("HEAD~1", or "" for the working tree)
    sha: str  # the commit (the working tree: its HEAD)
    dirty: bool = False  # the working tree has uncommitted changes to tracked files

    @property
    def label(self) -> str:
        short = self.sha[:10]
        if not self.rev:
            return f"working tree ({short}{' + uncommitted changes' if self.dirty else ''})"
        return f"{self.rev} ({short})" if self.rev != self.sha else short


def _git(repo: Path, *args: str, binary: bool = False):
    try:
        proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=not binary)
    except FileNotFoundError:
        raise CheckoutError("git is not installed: compare commits needs git to check out the base") from None
    if proc.returncode:
        msg = proc.stderr if not binary else proc.stderr.decode(errors="replace")
        raise CheckoutError(msg.strip().splitlines()[-1] if msg.strip() else f"git {' '.join(args)} failed")
    return proc.stdout


def repo_root(start: Path) -> Path:
    """The top of the git repository holding ``start``, which must be attnbench's source."""
    try:
        top = Path(_git(start, "rev-parse", "--show-toplevel").strip())
    except CheckoutError as e:
        raise CheckoutError(f"{start}: not inside a git repository ({e}); run compare commits from a clone of "
                            "attnbench, or pass --repo PATH") from None
    if not (top / "attnbench" / "__init__.py").is_file():
        raise CheckoutError(f"{top}: a git repository without attnbench/__init__.py; compare commits measures "
                            "attnbench's own source: pass --repo with a clone of attnbench")
    return top


def resolve_rev(repo: Path, rev: str) -> str:
    try:
        return _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").strip()
    except CheckoutError:
        shallow = _git(repo, "rev-parse", "--is-shallow-repository").strip() == "true"
        hint = (" (this clone is shallow: fetch more history, e.g. git fetch --deepen 1, or clone without --depth)"
                if shallow else "")
        raise CheckoutError(f"--base/--head {rev}: no such commit in {repo}{hint}") from None


def working_tree(repo: Path) -> Checkout:
    sha = _git(repo, "rev-parse", "HEAD").strip()
    dirty = bool(_git(repo, "status", "--porcelain", "--untracked-files=no").strip())
    return Checkout("head", repo, "", sha, dirty)


def export(repo: Path, rev: str, into: Path, name: str) -> Checkout:
    """The tracked files of commit ``rev`` under ``into`` (created; must not exist or be empty)."""
    sha = resolve_rev(repo, rev)
    into.mkdir(parents=True, exist_ok=True)
    if any(into.iterdir()):
        raise CheckoutError(f"{into}: not empty; the checkout of {rev} goes into a folder of its own")
    data = _git(repo, "archive", "--format=tar", sha, binary=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        try:
            tar.extractall(into, filter="data")  # no links or paths outside ``into``
        except TypeError:  # a Python without extraction filters (before 3.10.12)
            tar.extractall(into)
    if not (into / "attnbench" / "__init__.py").is_file():
        raise CheckoutError(f"{rev} ({sha[:10]}): has no attnbench/ package to run")
    return Checkout(name, into, rev, sha)


def checkout(repo: Path, rev: Optional[str], into: Path, name: str) -> Checkout:
    """``rev`` exported under ``into``, or the working tree itself when ``rev`` is None."""
    return working_tree(repo) if rev is None else export(repo, rev, into, name)
