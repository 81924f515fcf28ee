"""What changed between two bundles (``dossier diff A B``).

Compared: release identity and lineage, the shipped route knob by knob, the speedup and its
interval, the shipped route's latency per inference, the conditions the decision was measured
under (a route that won on a busy host may lose on a quiet one), the accuracy of the shipped route (its worst loss, the metric and threshold), the
tuning hosts (each changed fingerprint field with the verdict the default verify policy of B's
backend gives it, engine facts of B's shipped engine applied), and the file tables (by path:
added, removed, changed digest). It works across versions of one release and across releases.
Nothing is checked for integrity here (``dossier verify`` does); the manifests are taken as
they are. A diff is data, never an error: two bundles that differ are not a failure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict

from dossier.backends import default_policy
from dossier.bundle.overview import decision_conditions
from dossier.errors import DossierError, InputError
from dossier.host.policy import Policy, Verdict, diff, diff_fields, worst
from dossier.knobs import KnobDatabase
from dossier.measure.conditions import Summary as ConditionsSummary
from dossier.measure.latency import RouteLatency, of_route
from dossier.routes import Route
from dossier.trial import TrialRecord

if TYPE_CHECKING:
    from dossier.bundle import Bundle

Section = Literal["release", "winner", "speedup", "latency", "accuracy", "environment",
                  "conditions", "files"]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Change(_Model):
    """One field that differs between A and B."""

    section: Section
    """What part of the bundle: release, winner, speedup, accuracy, environment or files."""
    field: str
    """The field (a knob name for winner, a fingerprint path for environment, a bundle path
    for files)."""
    a: str | None
    """Value in A (None: absent there)."""
    b: str | None
    """Value in B (None: absent there)."""
    verdict: Verdict | None = None
    """environment: the verdict the policy gives this change for B's engine."""
    note: str | None = None
    """environment: the policy's reason; files: added, removed or changed."""


class KnobRow(_Model):
    """One knob of the shipped routes."""

    knob: str
    """Knob name."""
    a: str | None
    """Its value in A's shipped route (None: the route does not name it)."""
    b: str | None
    """Its value in B's shipped route."""
    changed: bool
    """a != b."""


class Side(_Model):
    """One bundle, in brief."""

    bundle: str
    """What was opened."""
    release: str
    """Release name."""
    version: int
    """Release version."""
    dossier_id: str
    """Dossier id."""
    parent: str | None
    """Parent's dossier id."""
    backend: str
    """Backend."""
    shipped_route: str
    """Shipped route."""
    result: str
    """Speedup result, or "no significant gain"."""
    worst_loss: float | None
    """Worst loss of the shipped route."""
    metric: str
    """Loss metric."""
    threshold: float
    """Threshold."""
    conditions: str | None = None
    """What the host was doing while the decision was measured, in one line (None: not
    recorded)."""
    busy: bool | None = None
    """Some of those measurements ran on a busy host (None: not recorded)."""


class BundleDiff(_Model):
    """What changed from bundle A to bundle B."""

    a: Side
    """Bundle A."""
    b: Side
    """Bundle B."""
    relation: str
    """How they relate: B replaces A, versions of one release, or different releases."""
    winner: list[KnobRow]
    """The shipped routes knob by knob (changed or not)."""
    changes: list[Change]
    """Every field that differs, by section."""
    environment_verdict: Verdict
    """The worst verdict over the changed environment fields (VALID when none changed)."""
    policy_note: str
    """Which policy judged the environment changes."""
    differs: bool
    """Whether anything differs."""


def diff_bundles(a: Bundle, b: Bundle) -> BundleDiff:
    """Compare two opened bundles (see the module docstring)."""
    ma, mb = a.manifest, b.manifest
    changes: list[Change] = []

    def _add(section: Section, field: str, va: object, vb: object) -> None:
        sa, sb = _text(va), _text(vb)
        if sa != sb:
            changes.append(Change(section=section, field=field, a=sa, b=sb))

    for name in ("release", "release_version", "dossier_id", "parent", "description",
                 "created_at", "tool_version", "backend", "tuner_version", "knob_db_digest"):
        _add("release", name, getattr(ma, name), getattr(mb, name))
    _add("release", "model.digest", ma.model.digest, mb.model.digest)

    ra, rb = _effective(a), _effective(b)
    named = set(Route.parse(ma.summary.shipped_route).as_dict()) | set(
        Route.parse(mb.summary.shipped_route).as_dict())
    rows = [KnobRow(knob=k, a=ra.get(k), b=rb.get(k), changed=_bare(ra.get(k)) != _bare(rb.get(k)))
            for k in sorted(named)]
    for row in rows:
        if row.changed:
            _add("winner", row.knob, row.a, row.b)

    sa, sb = ma.summary, mb.summary
    for name in ("gain", "speedup", "speedup_ci_low", "speedup_ci_high", "p_value", "result"):
        _add("speedup", name, getattr(sa, name), getattr(sb, name))

    la, lb = _latency(a), _latency(b)
    for name in ("median_ms", "p90_ms", "p99_ms", "throughput_per_s", "source"):
        _add("latency", f"shipped {name}" if name != "source" else "measured in",
             getattr(la, name) if la is not None else None,
             getattr(lb, name) if lb is not None else None)
    ca, cb = _conditions(a), _conditions(b)
    for name in ("measurements", "busy", "load_1m_max", "other_cores_median", "cores"):
        _add("conditions", name, getattr(ca, name) if ca is not None else None,
             getattr(cb, name) if cb is not None else None)

    wa, wb = _worst_loss(a), _worst_loss(b)
    _add("accuracy", "worst_loss", wa, wb)
    for name in ("metric", "threshold", "atol", "rtol", "validation_pairs"):
        _add("accuracy", name, getattr(sa, name), getattr(sb, name))

    policy, policy_note = _policy(mb.backend)
    facts = dict(mb.engines.shipped.flags)
    findings = diff(a.fingerprint(), b.fingerprint(), policy, facts)
    engine_a = {f"engine.{k}": v for k, v in ma.engines.shipped.facts.items()}
    engine_b = {f"engine.{k}": v for k, v in mb.engines.shipped.facts.items()}
    findings += diff_fields(engine_a, engine_b, policy, facts)
    changed_env = [f for f in findings if f.changed]
    for f in sorted(changed_env, key=lambda f: (-f.verdict.severity, f.field)):
        changes.append(Change(section="environment", field=f.field, a=f.bundle_value,
                              b=f.host_value, verdict=f.verdict, note=f.reason))

    ta, tb = ma.table(), mb.table()
    for path in sorted(set(ta) | set(tb)):
        fa, fb = ta.get(path), tb.get(path)
        if fa is None:
            assert fb is not None  # the path is in one table at least
            changes.append(Change(section="files", field=path, a=None, b=fb.digest,
                                  note="added"))
        elif fb is None:
            changes.append(Change(section="files", field=path, a=fa.digest, b=None,
                                  note="removed"))
        elif (fa.digest, fa.size) != (fb.digest, fb.size):
            changes.append(Change(section="files", field=path, a=fa.digest, b=fb.digest,
                                  note="changed"))

    return BundleDiff(
        a=_side(a, wa), b=_side(b, wb), relation=_relation(a, b), winner=rows, changes=changes,
        environment_verdict=worst(f.verdict for f in changed_env) if changed_env
        else Verdict.VALID,
        policy_note=policy_note, differs=bool(changes))


def _bare(value: str | None) -> str | None:
    return value.removesuffix(" (default)") if value is not None else None


def _text(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _effective(bundle: Bundle) -> dict[str, str]:
    """The shipped route's knob values; a knob the route does not name but the other bundle's
    route might is shown with its default from this bundle's knob database."""
    from dossier.run_folder import KNOBS_NAME

    named = Route.parse(bundle.manifest.summary.shipped_route).as_dict()
    try:
        db = KnobDatabase.model_validate_json(bundle.file(KNOBS_NAME).read_bytes())
    except (OSError, ValueError, DossierError):  # unreadable knobs.json: the route text alone
        return named
    return {**{k.name: f"{k.default} (default)" for k in db.knobs}, **named}


def _policy(backend: str) -> tuple[Policy, str]:
    try:
        return default_policy(backend), f"the default verify policy of {backend} (B's backend)"
    except InputError:
        return Policy(), (f"no default verify policy for backend {backend!r}: every change is "
                          "recorded as VALID")


def _worst_loss(bundle: Bundle) -> float | None:
    """The worst loss of the shipped route (its search trial, or the baseline's)."""
    index = bundle.manifest.summary.shipped_index
    rows = bundle.routes().select(["index", "worst_loss"]).to_pylist()
    return next((r["worst_loss"] for r in rows if r["index"] == index), None)


def _trials(bundle: Bundle) -> list[TrialRecord]:
    try:
        return list(bundle.tuning_cache().trials)
    except DossierError:  # an unreadable record: nothing to say about latency or conditions
        return []


def _latency(bundle: Bundle) -> RouteLatency | None:
    s = bundle.manifest.summary
    return of_route(_trials(bundle), s.shipped_route, s.baseline_route, s.per_sample)


def _conditions(bundle: Bundle) -> ConditionsSummary | None:
    return decision_conditions(_trials(bundle))[0]


def _side(bundle: Bundle, worst_loss: float | None) -> Side:
    m, s = bundle.manifest, bundle.manifest.summary
    c, of = decision_conditions(_trials(bundle))
    return Side(bundle=str(bundle.source), release=m.release, version=m.release_version,
                dossier_id=m.dossier_id, parent=m.parent, backend=m.backend,
                shipped_route=s.shipped_route, result=s.result, worst_loss=worst_loss,
                metric=s.metric, threshold=s.threshold,
                conditions=f"{of}: {c.text()}" if c is not None else None,
                busy=c.busy > 0 if c is not None else None)


def _relation(a: Bundle, b: Bundle) -> str:
    ma, mb = a.manifest, b.manifest
    if ma.dossier_id == mb.dossier_id:
        return "the same bundle"
    if mb.parent == ma.dossier_id:
        head = "B replaces A (A is B's parent)"
    elif ma.parent == mb.dossier_id:
        head = "A replaces B (B is A's parent)"
    else:
        head = "neither names the other as its parent"
    if ma.release == mb.release:
        return f"{head}; versions {ma.release_version} -> {mb.release_version} of {ma.release}"
    return f"{head}; different releases ({ma.release} and {mb.release})"
