"""YAML scenario -> validated :class:`Scenario` -> sweep cases. Every user-input error is a
:class:`ScenarioError` naming the file, the field path and the fix (never a traceback)."""
from __future__ import annotations

import copy
import functools
import hashlib
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

from pydantic import BeforeValidator, Field, ValidationError, model_validator

from attnbench.workload import mla
from attnbench.workload.scenario_parts import Group, KVCache, ModelShape, SizeInt, Strict
from attnbench.workload.spec import BatchSpec, check_kv_dtype
from attnbench.workload.batchstr import parse_batch_string
from attnbench.workload.messages import ScenarioError, check_shape, format_validation_error
from attnbench.workload.schema_keys import keys_at, sweep_key_problems
from attnbench.workload.dotted import own_path, parse_override, read_file, read_mapping, set_path
from attnbench.workload.sweeps import case_id_for, override_sweep, typed_params
from attnbench.workload.timing_spec import DEFAULTS as _T, FLUSH_MODES, TimingConfig
from attnbench.workload.units import short_repr
from attnbench.workload.variants import variant_docs
from attnbench.workload.weights import case_weight, drop_overridden, weight_problems


# Limits that keep a hostile or mistyped scenario from hanging or exhausting the loader
# (sizes the memory estimate would reject anyway are refused here, with the field named).
MAX_TEXT_BYTES = 4 << 20  # a scenario file
MAX_GROUPS = 4096  # request groups in one batch
MAX_REQUESTS = 65536  # requests in one batch (all groups' counts)
MAX_QUERY_TOKENS = 1 << 22  # new tokens in one batch
MAX_KV_TOKENS = 1 << 31  # cached + new tokens in one batch


class Timing(Strict):
    """The scenario's ``timing:``; defaults and meaning from ``timing_spec.TimingConfig`` (``config()``)."""

    warmup_ms: float = Field(default=_T.warmup_ms, ge=0, le=3_600_000, description="warm-up budget per row, ms")
    measure_ms: float = Field(default=_T.measure_ms, gt=0, le=3_600_000, description="measurement budget per row, ms")
    min_runs: Optional[int] = Field(
        default=_T.min_runs, ge=1, le=1_000_000,
        description="timed calls at least, whatever the budget; unset: 5, but never more calls than fit in twice"
        " measure_ms (a slow row is not timed 5 times over its budget)",
    )
    max_runs: int = Field(default=_T.max_runs, ge=1, le=1_000_000)
    cold_l2: bool = Field(default=_T.cold_l2, description="flush the GPU's L2 before every timed call")
    cuda_graphs: bool = Field(default=_T.cuda_graphs, description="time CUDA-graph replays where the backend allows")
    flush: Literal[FLUSH_MODES] = Field(
        default=_T.flush,
        description="how the L2 is emptied before each timed call: read (a buffer twice its size), write, or"
        " write+read; each row records it",
    )
    rounds: int = Field(
        default=_T.rounds,
        ge=1,
        le=1000,
        description="split the budgets into this many rounds, taken in turn by the case's backends, so a slow"
        " spell of a shared machine falls on all of them alike (what `check --normalize-by` relies on)",
    )

    def config(self) -> TimingConfig:
        return TimingConfig(**self.model_dump())


class Check(Strict):
    reference: str = Field(default="reference", description="'reference' (exact float64) or a backend name")
    rtol: Optional[float] = Field(default=None, gt=0, description="max ‖out−ref‖/‖ref‖; default by dtype")


def _batch_groups(v: Any) -> Any:
    if isinstance(v, str):
        return parse_batch_string(v)
    return v


class Scenario(Strict):
    name: Optional[str] = None
    description: str = ""
    seed: SizeInt = Field(default=0, ge=0, le=2**63 - 1)
    device: str = Field(default="auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$")
    model: ModelShape
    kv_cache: KVCache = KVCache()
    batch: Annotated[list[Group], BeforeValidator(_batch_groups)] = Field(
        min_length=1, max_length=MAX_GROUPS,
        description="request groups in batch order, or a string such as '2q1k_32q1s4k'",
    )
    sweep: Optional[dict[str, list[Any]]] = Field(
        default=None, description="dotted path -> values; the cartesian product gives the cases"
    )
    weights: Optional[dict[str, list[float]]] = Field(
        default=None, description="swept key -> one weight (engine steps) per swept value: `attnbench decide`"
    )
    backends: Optional[list[str]] = None
    check: Check = Check()
    timing: Timing = Timing()

    @model_validator(mode="after")
    def _size(self):
        reqs = sum(g.count for g in self.batch)
        if reqs > MAX_REQUESTS:
            raise ValueError(f"the batch has {reqs} requests; at most {MAX_REQUESTS} are allowed")
        toks = sum(g.count * g.query for g in self.batch)
        if toks > MAX_QUERY_TOKENS:
            raise ValueError(f"the batch has {toks} new tokens; at most {MAX_QUERY_TOKENS} are allowed")
        kv = sum(g.count * (g.context + g.query) for g in self.batch)
        if kv > MAX_KV_TOKENS:
            raise ValueError(f"the batch has {kv} KV tokens; at most {MAX_KV_TOKENS} are allowed")
        check_kv_dtype(self.model.dtype, self.kv_cache.dtype)
        if self.kv_cache.k_scale is not None and self.model.attention == "mla":
            raise ValueError("kv_cache.k_scale/v_scale are for attention: mha; an MLA latent cache is K and V at"
                             " once: leave them out")
        return self

    def kv_dtype(self) -> Optional[str]:
        """The FP8 cache dtype name, or None for a cache in the model dtype."""
        d = self.kv_cache.dtype
        return d if d is not None and d.startswith("fp8") else None

    def batch_spec(self) -> BatchSpec:
        reqs = tuple(r for i, g in enumerate(self.batch) for r in g.requests(i))
        return BatchSpec(
            requests=reqs,
            num_q_heads=self.model.num_q_heads,
            dtype=self.model.dtype,
            page_size=self.kv_cache.page_size,
            layout=self.kv_cache.layout,
            window=self.model.window,
            sinks=self.model.sinks,
            softcap=self.model.softcap,
            alibi=self.model.alibi,
            kv_dtype=self.kv_dtype(),
            kv_scale=self.kv_cache.scale,
            kv_order=self.kv_cache.order,
            k_scale=self.kv_cache.k_scale,
            v_scale=self.kv_cache.v_scale,
            rope=self.model.rope,
            rope_theta=self.model.rope_theta,
            rope_scale=self.model.rope_scale,
            score_order=self.model.score_order,
            q_dtype=self.model.q_dtype,
            out_dtype=self.model.out_dtype,
            out_scale=self.model.out_scale,
            **mla.attention_fields(self.model),
        )


@dataclass
class Case:
    """One point of a sweep: its id, the swept values, and the validated scenario."""

    case_id: str
    params: dict[str, Any]
    scenario: Scenario
    weight: float = 1.0  # the engine steps it stands for (``weights``, workload/weights.py)


@dataclass
class ScenarioFile:
    path: str
    text: str
    raw: dict
    scenario: Scenario
    cases: list[Case]
    notes: list[str] = field(default_factory=list)  # what loading decided, for the user to read

    @property
    def name(self) -> str:
        return self.scenario.name or Path(self.path).stem

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


def _validate(raw: Any, where: str, prefix: str = "") -> Scenario:
    if not isinstance(raw, dict):
        raise ScenarioError(f"{where}: the file must hold a mapping (model:, batch:, ...), not {type(raw).__name__}")
    try:
        return Scenario.model_validate(raw)
    except ValidationError as e:
        raise ScenarioError(format_validation_error(e, where, prefix, lambda loc: keys_at(_schema(), loc))) from None


@functools.lru_cache(maxsize=1)
def _schema() -> dict:
    return Scenario.model_json_schema()


# -- loading --------------------------------------------------------------------------------
def load_text(text: str, path: str = "<string>", overrides: Optional[list[str]] = None) -> ScenarioFile:
    raw = read_mapping(text, path, MAX_TEXT_BYTES)
    raw = copy.deepcopy(raw)
    notes: list[str] = []
    for text_ov in overrides or []:
        key, value = parse_override(text_ov)
        set_path(raw, key, value, f"--set {short_repr(text_ov, 80)}")
        swept_notes = override_sweep(raw, key, value, f"--set {short_repr(text_ov, 80)}", ScenarioError)
        notes += swept_notes + (drop_overridden(raw, key, f"--set {short_repr(text_ov, 80)}") if swept_notes else [])
    swept = raw.get("sweep") if isinstance(raw.get("sweep"), dict) else {}
    # the swept keys' problems with the other errors, not after them (a key that is no text: the schema says so)
    problems = sweep_key_problems(_schema(), [k for k in swept if isinstance(k, str)], path)
    problems += weight_problems(swept, raw.get("weights"), path)
    try:
        base = _validate(raw, path)
    except ScenarioError as e:
        raise ScenarioError("\n".join([str(e), *problems])) from None
    if problems:
        raise ScenarioError("\n".join(problems))
    check_shape(raw, path)
    cases = expand_sweep(raw, base, path)
    return ScenarioFile(path=path, text=text, raw=raw, scenario=base, cases=cases, notes=notes)


def load(path: str | Path, overrides: Optional[list[str]] = None) -> ScenarioFile:
    """Load a scenario file, or a built-in scenario by name (``attnbench scenarios``)."""
    from attnbench.workload.builtin import builtin_names, resolve

    p = resolve(path)
    if p is None:
        hint = ", ".join(builtin_names()[:6])
        raise ScenarioError(
            f"{path}: no such scenario file or built-in scenario (built-in: {hint}, ...; `attnbench scenarios` lists them)"
        )
    try:
        text = read_file(p, str(path), MAX_TEXT_BYTES)
    except (OSError, UnicodeDecodeError) as e:
        raise ScenarioError(f"{path}: cannot read: {e}") from None
    return load_text(text, str(path), overrides)


MAX_CASES = 10000


def expand_sweep(raw: dict, base: Scenario, path: str) -> list[Case]:
    """The cartesian product of ``sweep`` values, each applied to the raw document and validated."""
    sweep = base.sweep or {}
    for key, values in sweep.items():
        if not values:
            raise ScenarioError(f"{path}: sweep.{key}: give at least one value")
        if key.split(".")[0] in ("sweep", "name"):
            raise ScenarioError(f"{path}: sweep.{key}: cannot sweep over {key.split('.')[0]}")
    total = 1
    for values in sweep.values():
        total *= len(values)
    if total > MAX_CASES:
        raise ScenarioError(f"{path}: sweep: {total} cases is more than {MAX_CASES}; sweep fewer values")
    keys = list(sweep)
    cases = []
    common = {k: v for k, v in raw.items() if k != "sweep"}  # what every case shares, read once
    if isinstance(common.get("batch"), str):
        try:
            common["batch"] = parse_batch_string(common["batch"])
        except ValueError as e:
            raise ScenarioError(f"{path}: batch: {e}") from None
    for at in itertools.product(*(range(len(sweep[k])) for k in keys)):
        combo, weight = [sweep[k][i] for k, i in zip(keys, at)], case_weight(base.weights, keys, at)
        doc = dict(common)  # the swept paths are copied below, not the whole file (issue 59)
        params = dict(zip(keys, combo))
        for k, v in params.items():
            own_path(doc, k)
            set_path(doc, k, v, f"{path}: sweep.{k}")
        label = ", ".join(f"{short_repr(k, 40)}={short_repr(v, 40)}" for k, v in params.items())
        sc = _validate(doc, path, prefix=f"[case {label}] " if params else "")
        params = typed_params(params, sc)  # "4k" -> 4096: numbers stay numbers to every output
        variants = variant_docs(doc, sc.batch)
        if not variants:
            cases.append(Case(case_id_for(params), params, sc, weight))
        for variant, vdoc in variants:  # compare_with: the tree, then the same case as chains / decodes
            vsc = sc if variant == "tree" else _validate(vdoc, path, prefix=f"[case {label}, variant={variant}] ")
            vparams = {**params, "variant": variant}
            cases.append(Case(case_id_for(vparams), vparams, vsc, weight))
        if len(cases) > MAX_CASES:
            raise ScenarioError(f"{path}: sweep: more than {MAX_CASES} cases with compare_with; sweep fewer values")
    ids = [c.case_id for c in cases]
    if len(set(ids)) != len(ids):  # two values slugged alike: fall back to numbered ids
        for i, c in enumerate(cases):
            c.case_id = f"{i:03d}-{c.case_id}"
    return cases


def json_schema() -> dict:
    schema = Scenario.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "attnbench scenario"
    return schema
