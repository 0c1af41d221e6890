"""The evidence part of a resolver chain: exact databases first, then interpolation.

`build_resolver(system, evidence=evidence_providers(...))` (`evidence.factory`) appends
the analytic roofline and collective models after them. Policies: `exact` (databases only), `interpolate`
(plus bracketed interpolation), `extrapolate` (plus bounded extrapolation).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator, Sequence

from perfcast.core.errors import ConfigError
from perfcast.evidence.contracts import CostProvider, Resolution
from perfcast.evidence.database import PerformanceDatabase
from perfcast.evidence.interpolation import InterpolatingProvider
from perfcast.evidence.provider_db import PerformanceDatabaseProvider
from perfcast.hardware.model import System

POLICIES = ("exact", "interpolate", "extrapolate")


def evidence_providers(databases: Sequence[PerformanceDatabase], system: System | None,
                       policy: str = "interpolate") -> list[CostProvider]:
    if policy not in POLICIES:
        raise ConfigError(f"unknown evidence policy {policy!r}", field="--policy",
                          expected=" | ".join(POLICIES))

    def suffix(i: int) -> str:
        return "" if len(databases) == 1 else f"[{i}]"

    providers: list[CostProvider] = [
        PerformanceDatabaseProvider(db, name=f"database{suffix(i)}")
        for i, db in enumerate(databases)]
    if policy != "exact":
        providers += [InterpolatingProvider(db, system, policy=policy,
                                            name=f"interpolation{suffix(i)}")
                      for i, db in enumerate(databases)]
    return providers


def resolution_json(res: Resolution) -> dict:
    est = res.estimate
    return {
        "latency_s": est.latency_s, "method": est.method.value,
        "match_kind": est.match_kind.value, "provider": est.provider,
        "provider_revision": est.provider_revision, "source_revision": est.source_revision,
        "confidence": est.confidence, "validity": dict(est.validity),
        "raw_record_ids": list(est.raw_record_ids),
        "uncertainty": {"kind": est.uncertainty.kind, "rel_std": est.uncertainty.rel_std,
                        "low_s": est.uncertainty.low_s, "high_s": est.uncertainty.high_s,
                        "sample_count": est.uncertainty.sample_count},
        "components": dict(est.components), "assumptions": list(est.assumptions),
        "attempts": [{"provider": a.provider, "outcome": a.outcome.value, "reason": a.reason}
                     for a in res.attempts],
        "query_digest": res.query_digest,
    }


@contextlib.contextmanager
def batch_gc(gen0_threshold: int = 200_000) -> Iterator[None]:
    """For answering many queries in one process: move the loaded evidence (millions of
    long-lived objects) out of the collector's view and collect young objects less often.
    Resolutions are not cyclic garbage, so this only skips useless scans (a 30% speed-up
    on 100k queries); the previous thresholds are restored on exit."""
    old = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(gen0_threshold, old[1], old[2])
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()
