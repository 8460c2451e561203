"""``-k EXPR``: pick rows by case id and backend, the way pytest's ``-k`` picks tests.

An expression is words joined by ``and``, ``or``, ``not`` and parentheses; a word matches a
row when it is a substring (case-insensitive) of ``"<case_id> <backend>"``:

    -k sdpa                        every case, backend sdpa
    -k "page_size=16 and not flex" the page-16 cases, every backend but flex
    -k "context=4k or tree"        cases whose id has context=4k, or any backend named *tree*

Words are anything without spaces or parentheses (``=``, ``,``, ``.`` and ``-`` included).
A word holding ``=`` names swept values and matches whole ones: ``count=1`` picks the cases
whose count is 1, never 16; ``page_size=16,context=4k`` needs both. The key is the swept key
(``batch.0.context``), its last part (``context``) or its table name (``kv_dtype`` for
``kv_cache.dtype``); a last part two swept keys share (``dtype``: ``model.dtype`` and
``kv_cache.dtype``) names both. The value is compared with the row's typed value (issue 34):
``context=4k``, ``context=4096`` and ``context=4K`` are the same number, ``dtype=fp8_e4m3``
(the YAML spelling) and ``dtype=fp8-e4m3`` (the case id's) the same text, ``window=null`` a
null. Without the swept values (a caller that has only ids), the word matches whole
``key=value`` items of the case id. A word holding ``:`` is a backend spec, resolved as ``-b``
resolves it and compared by value (``flex:mask=blocks`` picks the rows of ``flex``, whose
default that is). Other words match as substrings, in the YAML's spelling or the case id's
(a case id writes a value's ``_`` as ``-``: ``-k fp8_e4m3`` finds ``kv_dtype=fp8-e4m3``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

from attnbench.workload.sweeps import key_matches, value_matches

_TOKEN = re.compile(r"\s*(\(|\)|[^\s()]+)")
KEYWORDS = ("and", "or", "not")


class SelectError(ValueError):
    """A malformed -k expression; ``str()`` says where."""


@dataclass(frozen=True)
class Selector:
    """A parsed -k expression: ``selector(case_id, backend, params)`` says whether the row is
    picked (``params``: the case's typed swept values; None: match ``key=value`` words in the id)."""

    text: str
    test: Callable[[str, Optional[dict], str], bool]

    def __call__(self, case_id: str, backend: str, params: Optional[dict] = None) -> bool:
        return self.test(f"{case_id} {backend}".lower(), params, backend)


def _tokens(text: str) -> list[str]:
    out, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:  # pragma: no cover  (the pattern matches any non-space run)
            raise SelectError(f"-k {text!r}: cannot read it at {text[pos:]!r}")
        out.append(m.group(1))
        pos = m.end()
    return out


class _Parser:
    """expr := or ; or := and ('or' and)* ; and := not ('and' not)* ; not := 'not' not | atom."""

    def __init__(self, text: str, backend_word: Optional[Callable] = None):
        self.text = text
        self.backend_word = backend_word
        self.toks = _tokens(text)
        self.i = 0

    def fail(self, what: str) -> SelectError:
        where = " ".join(self.toks[: self.i]) or "the start"
        return SelectError(f"-k {self.text!r}: {what} after {where!r}; "
                           "write words joined by and / or / not, with parentheses")

    def peek(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise self.fail("the expression ends too early")
        self.i += 1
        return tok

    def parse(self) -> Callable[[str], bool]:
        if not self.toks:
            raise SelectError("-k '': give words to match, e.g. -k sdpa or -k 'page_size=16 and not flex'")
        f = self.or_()
        if self.peek() is not None:
            raise self.fail(f"unexpected {self.peek()!r}")
        return f

    def or_(self):
        parts = [self.and_()]
        while self.peek() == "or":
            self.take()
            parts.append(self.and_())
        return parts[0] if len(parts) == 1 else (lambda s, v, b, ps=tuple(parts): any(p(s, v, b) for p in ps))

    def and_(self):
        parts = [self.not_()]
        while self.peek() == "and":
            self.take()
            parts.append(self.not_())
        return parts[0] if len(parts) == 1 else (lambda s, v, b, ps=tuple(parts): all(p(s, v, b) for p in ps))

    def not_(self):
        if self.peek() == "not":
            self.take()
            inner = self.not_()
            return lambda s, v, b: not inner(s, v, b)
        return self.atom()

    def atom(self):
        tok = self.take()
        if tok == "(":
            inner = self.or_()
            if self.peek() != ")":
                raise self.fail("a missing ')'")
            self.take()
            return inner
        if tok == ")" or tok in KEYWORDS:
            self.i -= 1
            raise self.fail(f"unexpected {tok!r}")
        if ":" in tok and self.backend_word is not None:  # a backend spec: its identity, by value
            return self.backend_word(tok)
        word = tok.lower()
        if "=" in word:
            parts = [p for p in word.split(",") if p]
            return lambda s, v, b: all(_has_id_item(s, p) if v is None or _NUMBERED.match(p) else _has_value(v, p)
                                       for p in parts)
        spellings = {word, word.replace("_", "-")}  # ``fp8_e4m3`` (the YAML's) finds ``fp8-e4m3`` (the id's)
        return lambda s, v, b: any(w in s for w in spellings)


_ITEM_SPLIT = re.compile(r"[,\s]+")
_NUMBERED = re.compile(r"^[0-9]+-")  # the numbered case ids of sweeps whose values slug alike


def _has_item(text: str, part: str) -> bool:
    """``part`` (``key=value``) is a whole item of ``text`` (``a=1,b=2 backend``), its key
    possibly the last part of a dotted key."""
    for item in _ITEM_SPLIT.split(text):
        if item == part:  # a numbered id's first item, as unique_selector writes it
            return True
        item = _NUMBERED.sub("", item)
        if item == part or (item.endswith(part) and item[len(item) - len(part) - 1] == "." and "=" not in item[:-len(part)]):
            return True
    return False


def _has_id_item(text: str, part: str) -> bool:
    """``part`` is an item of the ids ``text`` in its spelling or the id's (``_`` of a value as ``-``)."""
    key, _, value = part.partition("=")
    return _has_item(text, part) or _has_item(text, f"{key}={value.replace('_', '-')}")


def _has_value(params: dict, part: str) -> bool:
    """``part`` (``key=value``, lower case) names one of the typed swept values ``params``."""
    key, _, want = part.partition("=")
    return any(key_matches(key, k) and value_matches(v, want) for k, v in params.items())


def parse_selector(text: str, backend_word: Optional[Callable] = None) -> Selector:
    """Parse a -k expression; :class:`SelectError` names what is wrong. ``backend_word``: how a
    word holding ``:`` (a backend spec, ``flex:mask=blocks``) becomes a test ``(s, params,
    backend) -> bool`` (``backend.backend_word``: the spec's identity compared by value with the
    row's); without it such a word is matched as text."""
    return Selector(text, _Parser(text, backend_word).parse())


def unique_selector(case_id: str, all_ids: Iterable[str]) -> str:
    """A -k expression that picks ``case_id`` and no other of ``all_ids`` (a case id that is a
    substring of others, ``seed=1`` of ``seed=10``, gets ``and not`` clauses for those)."""
    picks = parse_selector(case_id) if " " not in case_id and "(" not in case_id and ")" not in case_id else None
    if picks is None:  # not one word: match it as words would (substrings)
        others = [o for o in all_ids if o != case_id and case_id.lower() in o.lower()]
    else:
        others = [o for o in all_ids if o != case_id and picks(o, "")]
    return " and not ".join([case_id, *others])
