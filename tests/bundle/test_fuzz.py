"""Fuzzed readers: on any input, every reader and parser either succeeds or raises dossier's own
error type (:class:`~dossier.errors.DossierError`) with a one-line message; never another
exception (which the CLI would report as an internal error, exit 70).

Readers: the bundle manifest (``parse_manifest``, and the dossier id computed over what it
returns), the tuning cache (``TuningCache.open``, and the spec ``--continue`` rebuilds from its
header), selections and routes against a knob database (plus a round trip of what parses), the
release spec (``load_spec``), host fingerprints (``load_fingerprint``); the trtexec cache import
and the policy file have their own properties in tests/cli/test_trtexec.py and tests/verify/test_policy.py,
run here again with many more examples in the slow suite.

Inputs: arbitrary bytes and text, and mutations of valid files (the golden bundle's manifest,
tuning cache and fingerprint; a valid release spec): values replaced by arbitrary JSON (NaN,
huge integers, lone surrogates, deep nesting), keys dropped or added, records dropped,
duplicated, swapped or torn, bytes flipped, inserted, deleted. Each property runs
``DEFAULT_EXAMPLES`` examples in the default suite and ``SLOW_EXAMPLES`` with ``--run-slow``;
the examples actually run are counted and printed at the end of the module (``-s``).
"""

from __future__ import annotations

import copy
import functools
import json
import math
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _figures import figures
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dossier.bundle import parse_manifest
from dossier.bundle.manifest import body_digest
from dossier.cache import TuningCache
from dossier.errors import DossierError
from dossier.fingerprint import load_fingerprint
from dossier.knobs import Knob, KnobDatabase
from dossier.routes import Route, Selection
from dossier.spec import load_spec

DEFAULT_EXAMPLES = 200
"""Examples per property in the default suite (about 5 s for all of them)."""
SLOW_EXAMPLES = 5_000
"""Examples per property with --run-slow."""
GOLDEN = Path(__file__).parents[1] / "assets" / "golden" / "convnet-1.dossier"
COUNTS: Counter[str] = Counter()
"""Examples run per property (printed at the end of the module)."""
_COMMON = dict(deadline=None, database=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.filter_too_much])


@pytest.fixture(scope="module", autouse=True)
def _report_counts() -> Iterator[None]:
    yield
    figures("fuzz examples run", total=sum(COUNTS.values()), properties=len(COUNTS),
            **dict(sorted(COUNTS.items())))


def _both(key: str, body: Callable[..., None], **strategies: Any) -> tuple[Any, Any]:
    """A property as two tests: DEFAULT_EXAMPLES examples, and SLOW_EXAMPLES marked slow.
    ``key`` names it in the counts."""
    @functools.wraps(body)
    def count(*args: Any, **kwargs: Any) -> None:
        COUNTS[key] += 1
        body(*args, **kwargs)

    fast = settings(max_examples=DEFAULT_EXAMPLES, **_COMMON)(given(**strategies)(count))
    slow = pytest.mark.slow(settings(max_examples=SLOW_EXAMPLES, **_COMMON)(
        given(**strategies)(count)))
    return fast, slow


def _only_dossier_errors(fn: Callable[[], object]) -> object | None:
    """Run ``fn``; a DossierError must carry a non-empty one-line message. None when refused."""
    try:
        return fn()
    except DossierError as exc:
        text = exc.diagnostics()
        assert str(exc).strip() and "\n" not in text, repr(text)
        return None


# ---------------------------------------------------------------------------------- mutations
_scalar = (st.none() | st.booleans() | st.integers() | st.integers(-(10**40), 10**40)
           | st.floats() | st.text(max_size=12)
           | st.sampled_from(["", "\ud800", "../x", "/abs", "1.0", "99.0", "dossier-bundle",
                              "0" * 32, "f" * 32, "NaN", "x" * 300]))
_json = st.recursive(_scalar, lambda c: st.lists(c, max_size=4)
                     | st.dictionaries(st.text(max_size=10), c, max_size=4), max_leaves=10)
_toml_scalar = (st.booleans() | st.integers() | st.integers(-(10**40), 10**40) | st.floats()
                | st.text(max_size=12) | st.sampled_from(["", "../x", "/abs", "all", "x" * 300]))
_toml_json = st.recursive(_toml_scalar, lambda c: st.lists(c, max_size=4)
                          | st.dictionaries(st.text(max_size=10), c, max_size=4), max_leaves=10)
_deep = st.integers(1, 600).map(lambda n: json.loads("[" * n + "]" * n))
_nested_bytes = st.integers(1, 100_000).map(lambda n: b"[" * n + b"]" * n) | st.integers(
    1, 100_000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n)


def _slots(doc: Any, path: tuple = ()) -> Iterator[tuple]:
    """Every (container path, key) in a JSON document."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield path, k
            yield from _slots(v, (*path, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield path, i
            yield from _slots(v, (*path, i))


def _at(doc: Any, path: tuple) -> Any:
    for key in path:
        doc = doc[key]
    return doc


@st.composite
def mutated_json(draw: st.DrawFn, doc: Any, *, toml_safe: bool = False) -> Any:
    """``doc`` with one to three structural mutations."""
    doc = copy.deepcopy(doc)
    value = _toml_json if toml_safe else _json
    for _ in range(draw(st.integers(1, 3))):
        slots = list(_slots(doc))
        if not slots:
            break
        path, key = draw(st.sampled_from(slots))
        parent = _at(doc, path)
        action = draw(st.sampled_from(["replace", "replace", "delete", "add", "deep", "type"]))
        if action == "replace":
            parent[key] = draw(value)
        elif action == "deep" and not toml_safe:
            parent[key] = draw(_deep)
        elif action == "delete":
            del parent[key]
        elif action == "add" and isinstance(parent, dict):
            parent[draw(st.text(max_size=10))] = draw(value)
        elif action == "type":  # the same value in another type
            v = parent[key]
            parent[key] = str(v) if not isinstance(v, str) else [v]
    return doc


@st.composite
def mutated_bytes(draw: st.DrawFn, data: bytes) -> bytes:
    """``data`` with one to four byte-level edits: flip, insert, delete, truncate, repeat."""
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        if not buf:
            break
        i = draw(st.integers(0, len(buf) - 1))
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "repeat"]))
        if op == "flip":
            buf[i] ^= draw(st.integers(1, 255))
        elif op == "insert":
            buf[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del buf[i: i + draw(st.integers(1, 16))]
        elif op == "truncate":
            del buf[i:]
        else:
            buf[i:i] = buf[i: i + draw(st.integers(1, 64))]
    return bytes(buf)


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc, indent=2, allow_nan=True).encode("utf-8", "surrogatepass")


# ------------------------------------------------------------------------------------ manifest
MANIFEST = (GOLDEN / "manifest.json").read_bytes()
MANIFEST_JSON = json.loads(MANIFEST)


def _manifest(data: bytes) -> None:
    def read() -> None:
        raw, manifest, notes = parse_manifest(data)
        body_digest(raw)  # what check_integrity computes next: must exist for what parsed
        assert manifest.format == "dossier-bundle" and isinstance(notes, list)

    _only_dossier_errors(read)


def _manifest_bytes(data: bytes) -> None:
    _manifest(data)


def _manifest_mutated(doc: Any) -> None:
    _manifest(_dumps(doc))


def _manifest_bytes_mutated(data: bytes) -> None:
    _manifest(data)


_minor = st.sampled_from(["1.0", "1.7", "2.0", "0.9", "1", "1.0.0", "01.00"])
test_manifest_arbitrary_bytes, test_manifest_arbitrary_bytes_slow = _both(
    "manifest_arbitrary_bytes", _manifest_bytes,
    data=st.binary(max_size=4096) | st.text(max_size=2000).map(str.encode) | _nested_bytes)
test_manifest_mutated_json, test_manifest_mutated_json_slow = _both(
    "manifest_mutated_json", _manifest_mutated,
    doc=st.builds(lambda d, v: {**d, "format_version": v}, mutated_json(MANIFEST_JSON), _minor))
test_manifest_mutated_bytes, test_manifest_mutated_bytes_slow = _both(
    "manifest_mutated_bytes", _manifest_bytes_mutated, data=mutated_bytes(MANIFEST))


def test_the_golden_manifest_parses() -> None:
    raw, manifest, _ = parse_manifest(MANIFEST)
    assert body_digest(raw) == manifest.dossier_id


# -------------------------------------------------------------------------------- tuning cache
CACHE_LINES = [json.loads(line) for line in (GOLDEN / "tuning-cache.jsonl").read_text()
               .splitlines()]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def _cache(scratch: Path, data: bytes) -> None:
    path = scratch / "tuning-cache.jsonl"
    path.write_bytes(data)

    def read() -> None:
        cache = TuningCache.open(path)
        _ = cache.trials, cache.sessions, cache.decision
        _ = cache.header.spec  # what tune --continue runs next
        TuningCache.open(path, repair=True)

    _only_dossier_errors(read)


def _cache_bytes(scratch: Path, data: bytes) -> None:
    _cache(scratch, data)


@st.composite
def mutated_cache(draw: st.DrawFn) -> bytes:
    lines = copy.deepcopy(CACHE_LINES)
    op = draw(st.sampled_from(["record", "record", "drop", "duplicate", "swap", "torn", "header"]))
    i = draw(st.integers(0, len(lines) - 1))
    if op == "record":
        lines[i] = draw(mutated_json(lines[i]))
    elif op == "header":
        lines[0] = draw(mutated_json(lines[0]))
    elif op == "drop":
        del lines[i]
    elif op == "duplicate":
        lines.insert(i, lines[i])
    elif op == "swap":
        j = draw(st.integers(0, len(lines) - 1))
        lines[i], lines[j] = lines[j], lines[i]
    data = b"".join(json.dumps(r, allow_nan=True).encode("utf-8", "surrogatepass") + b"\n"
                    for r in lines)
    if op == "torn":
        data = data[: draw(st.integers(0, len(data)))]
    return data


test_cache_arbitrary_bytes, test_cache_arbitrary_bytes_slow = _both(
    "cache_arbitrary_bytes", _cache_bytes,
    data=st.binary(max_size=4096) | _nested_bytes.map(lambda b: b + b"\n")
    | st.lists(st.binary(max_size=200), max_size=6).map(b"\n".join))
test_cache_mutated_records, test_cache_mutated_records_slow = _both(
    "cache_mutated_records", _cache_bytes, data=mutated_cache())
test_cache_mutated_bytes, test_cache_mutated_bytes_slow = _both(
    "cache_mutated_bytes", _cache_bytes,
    data=mutated_bytes((GOLDEN / "tuning-cache.jsonl").read_bytes()))


# ------------------------------------------------------------------------- selections, routes
SYNTHETIC = KnobDatabase(backend="synthetic", tuner_version="1", knobs=(
    Knob(name="a", values=("x", "y", "z"), default="x"),
    Knob(name="optimizer:B", values=("on", "off"), default="on"),
    Knob(name="n", values=None, default="0", value_hint="int32_t"),
    Knob(name="graph_optimization_level", values=("all", "basic", "disable_all"),
         default="all")))


@pytest.fixture(scope="module")
def ort_db() -> KnobDatabase:
    from dossier.backends import get_backend

    backend = get_backend("onnxruntime")
    if not backend.available():
        pytest.skip("onnxruntime is not installed")
    return backend.knob_database()


_names = st.sampled_from(["a", "n", "optimizer:B", "graph_optimization_level",
                          "optimizer:ConvBNFusion", "intra_op_num_threads", "A", "", "-a",
                          "a=b", "[a]", "a|b", "é", "optimizer:"]) | st.text(max_size=8)
_values = st.sampled_from(["x", "y", "z", "on", "off", "all", "basic", "0", "1", "", "[x",
                           "x]", "x|y", "a=b", "[]", "é"]) | st.text(max_size=6)
_token = st.one_of(
    st.builds(lambda n, v: f"-{n}={v}", _names, _values),
    st.builds(lambda n, vs: f"-{n}=[{'|'.join(vs)}]", _names, st.lists(_values, max_size=4)),
    st.text(max_size=10))
_sep = st.sampled_from([" ", "  ", "\t", "\n", "\u00a0", "\u2003", "\x1c", "\x85"])
selection_text = (st.lists(st.tuples(_token, _sep), max_size=6)
                  .map(lambda xs: "".join(t + s for t, s in xs)) | st.text(max_size=60))


def _selection(db: KnobDatabase, text: str) -> None:
    sel = _only_dossier_errors(lambda: Selection.parse(text, db))
    if isinstance(sel, Selection):  # what parses, prints and parses back to the same
        assert Selection.parse(sel.text(), db) == sel
        assert all(db.get(i.knob) for i in sel.items)
        Route.parse(sel.baseline(db).text(), db)
    route = _only_dossier_errors(lambda: Route.parse(text, db))
    if isinstance(route, Route):
        assert Route.parse(route.text(), db) == route
    free = _only_dossier_errors(lambda: Route.parse(text))
    if isinstance(free, Route):
        assert Route.parse(free.text()) == free


def _selection_synthetic(text: str) -> None:
    _selection(SYNTHETIC, text)


def _selection_ort(ort_db: KnobDatabase, text: str) -> None:
    _selection(ort_db, text)


test_selection_and_route_synthetic_db, test_selection_and_route_synthetic_db_slow = _both(
    "selection_and_route_synthetic_db", _selection_synthetic, text=selection_text)
test_selection_and_route_ort_db, test_selection_and_route_ort_db_slow = _both(
    "selection_and_route_ort_db", _selection_ort, text=selection_text)


# -------------------------------------------------------------------------------- release spec
SPEC = {"release": {"name": "convnet", "version": 1, "description": "d"},
        "model": {"path": "model.onnx"}, "validation": {"path": "validation"},
        "tune": {"backend": "onnxruntime", "strategy": "full", "selection": "-a=[x|y]",
                 "metric": "linf", "threshold": 1e-4},
        "timing": {"samples": 10, "confirm_top": 1},
        "shapes": [{"weight": 0.5, "inputs": {"x": [1, 3, 32, 32]}}],
        "deployment": {"inferences_per_day": 1000.0}}


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) \
            else repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()
                                if x is not None) + " }"
    raise TypeError(type(v))


def toml_text(doc: dict) -> str:
    """Tables for top-level dicts, arrays of tables for lists of dicts, key = value otherwise."""
    head, tables = [], []
    for key, value in doc.items():
        k = json.dumps(key, ensure_ascii=False)
        if isinstance(value, dict):
            tables += ["", f"[{k}]", *(f"{json.dumps(a, ensure_ascii=False)} = {_toml_value(b)}"
                                       for a, b in value.items() if b is not None)]
        elif isinstance(value, list) and value and all(isinstance(x, dict) for x in value):
            for item in value:
                tables += ["", f"[[{k}]]", *(f"{json.dumps(a)} = {_toml_value(b)}"
                                             for a, b in item.items() if b is not None)]
        elif value is not None:
            head.append(f"{k} = {_toml_value(value)}")
    return "\n".join(head + tables) + "\n"


def _spec(scratch: Path, text: str) -> None:
    path = scratch / "release.toml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    _only_dossier_errors(lambda: load_spec(path))


def _spec_bytes(scratch: Path, data: bytes) -> None:
    path = scratch / "release.toml"
    path.write_bytes(data)
    _only_dossier_errors(lambda: load_spec(path))


_toml_like = st.lists(st.sampled_from([
    "[release]\n", "[tune]\n", "[[shapes]]\n", "[timing]\n", "tune = 1\n", "tune = 'x'\n",
    "[[tune]]\n", "name = 'x'\n", "version = -1\n", "threshold = nan\n", "samples = 1e400\n",
    "selection = '-a=[x|y]'\n", "inputs = { x = [1, 2] }\n", "weight = 'w'\n", "a = [[[[\n",
    "shapes = 3\n", "= \n", "\"\"\"", "\n"])).map("".join)

test_spec_arbitrary_text, test_spec_arbitrary_text_slow = _both(
    "spec_arbitrary_text", _spec,
    text=st.text(max_size=400) | _toml_like
    | st.integers(1, 5000).map(lambda n: "a = " + "[" * n + "]" * n + "\n"))
test_spec_mutated, test_spec_mutated_slow = _both(
    "spec_mutated", _spec, text=mutated_json(SPEC, toml_safe=True).map(toml_text))
test_spec_mutated_bytes, test_spec_mutated_bytes_slow = _both(
    "spec_mutated_bytes", _spec_bytes, data=mutated_bytes(toml_text(SPEC).encode()))


def test_the_base_spec_loads(scratch: Path) -> None:
    path = scratch / "base.toml"
    path.write_text(toml_text(SPEC))
    assert load_spec(path).tune.threshold == 1e-4


# --------------------------------------------------------------------------------- fingerprint
FINGERPRINT = (GOLDEN / "fingerprint.json").read_bytes()


def _fingerprint(scratch: Path, data: bytes) -> None:
    path = scratch / "fingerprint.json"
    path.write_bytes(data)
    _only_dossier_errors(lambda: load_fingerprint(path))


test_fingerprint_arbitrary_bytes, test_fingerprint_arbitrary_bytes_slow = _both(
    "fingerprint_arbitrary_bytes", _fingerprint, data=st.binary(max_size=2048) | _nested_bytes)
test_fingerprint_mutated_json, test_fingerprint_mutated_json_slow = _both(
    "fingerprint_mutated_json", _fingerprint,
    data=mutated_json(json.loads(FINGERPRINT)).map(_dumps))
test_fingerprint_mutated_bytes, test_fingerprint_mutated_bytes_slow = _both(
    "fingerprint_mutated_bytes", _fingerprint, data=mutated_bytes(FINGERPRINT))


# ---------------------------------------------- what the fuzzing found, kept as plain cases
def _manifest_with(**changes: Any) -> bytes:
    doc = copy.deepcopy(MANIFEST_JSON)
    for dotted, value in changes.items():
        *path, key = dotted.split("__")
        _at(doc, tuple(path))[key] = value
    return _dumps(doc)


FOUND: dict[str, tuple[str, Any]] = {
    # each of these escaped as RecursionError, ValueError, TypeError, UnicodeEncodeError or
    # pydantic's ValidationError (exit 70, "internal error") before the fix
    "manifest nested 100000 deep": ("manifest", b"[" * 100_000 + b"]" * 100_000),
    "manifest with NaN (the id cannot be computed)": (
        "manifest", _manifest_with(summary__threshold=float("nan"))),
    "manifest with Infinity in an unknown field of a newer minor": (
        "manifest", _manifest_with(format_version="1.7", future=float("inf"))),
    "manifest with a lone surrogate": ("manifest", _manifest_with(description="\ud800")),
    "manifest key with a newline (two-line message)": ("manifest", _manifest_with(**{"\n": 1})),
    "spec whose tune is a number": ("spec", "tune = 1\n"),
    "spec whose tune is an array of tables": ("spec", "[[tune]]\na = 1\n"),
    "spec nested 5000 deep": ("spec", "a = " + "[" * 5000 + "]" * 5000 + "\n"),
    "cache header that is no valid spec (--continue)": (
        "cache", b"".join(json.dumps({**r, "release_version": 0} if r["kind"] == "header" else r)
                          .encode() + b"\n" for r in CACHE_LINES)),
}


@pytest.mark.parametrize("case", sorted(FOUND))
def test_what_the_fuzzing_found(case: str, scratch: Path) -> None:
    reader, data = FOUND[case]
    if reader == "manifest":
        with pytest.raises(DossierError) as exc:
            raw, _, _ = parse_manifest(data)
            body_digest(raw)
        assert "\n" not in exc.value.diagnostics()
    elif reader == "spec":
        path = scratch / "found.toml"
        path.write_text(data)
        with pytest.raises(DossierError) as exc:
            load_spec(path)
        assert "\n" not in exc.value.diagnostics()
    else:
        path = scratch / "found.jsonl"
        path.write_bytes(data)
        with pytest.raises(DossierError, match=r"not hold a valid release spec "
                                               r"\(spec\.release\.version: Input should be"):
            TuningCache.open(path)


# ----------------------------------------------- trtexec cache and policy file: slow variants
def _trtexec(scratch: Path, data: bytes) -> None:
    from test_trtexec import _read_or_dossier_error

    _read_or_dossier_error(scratch / "trtexec.jsonl", data)


def _trtexec_rows(scratch: Path, rows: list, tail: bytes) -> None:
    from test_trtexec import _header

    body = "\n".join(json.dumps(r) for r in [_header(), *rows]).encode() + b"\n" + tail
    _trtexec(scratch, body)


def _policy(scratch: Path, text: str) -> None:
    from dossier.verify.policy import Policy, load_policy

    path = scratch / "policy.toml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    _only_dossier_errors(lambda: load_policy(path, Policy()))


def _slow_only(key: str, body: Callable[..., None], **strategies: Any) -> Any:
    return _both(key, body, **strategies)[1]


def _trtexec_strategies() -> dict[str, Any]:
    from test_trtexec import _iteration_like
    from test_trtexec import _json as trt_json

    return {"rows": st.lists(_iteration_like | trt_json, max_size=5),
            "tail": st.binary(max_size=40)}


test_trtexec_arbitrary_bytes_slow = _slow_only("trtexec_arbitrary_bytes", _trtexec, data=st.binary(max_size=2048))
test_trtexec_structured_slow = _slow_only("trtexec_structured", _trtexec_rows, **_trtexec_strategies())
test_policy_file_slow = _slow_only("policy_file", _policy, text=st.text() | _toml_like)
