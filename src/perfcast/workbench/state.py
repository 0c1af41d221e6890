"""The workbench's read-only view of the stores, with caches keyed by digest (a snapshot,
an observation set and a revision never change under their digest)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Workbench:
    evidence_root: Path | None = None
    observation_root: Path | None = None
    calibration_root: Path | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _dbs: dict = field(default_factory=dict, repr=False)
    _resolvers: dict = field(default_factory=dict, repr=False)
    _views: dict = field(default_factory=dict, repr=False)

    # --- stores (opened per call: another process may import meanwhile) ---
    def evidence_store(self):
        from perfcast.evidence.store import EvidenceStore

        return EvidenceStore(self.evidence_root)

    def observation_store(self):
        from perfcast.observe.store import ObservationStore

        return ObservationStore(self.observation_root)

    def calibration_store(self):
        from perfcast.calibrate.store import CalibrationStore

        return CalibrationStore(self.calibration_root)

    @property
    def evidence_path(self) -> str:
        return str(self.evidence_store().root)

    def database(self, ref: str):
        """(digest, PerformanceDatabase) of a snapshot in the store (cached)."""
        store = self.evidence_store()
        digest = store.resolve(ref)
        with self._lock:
            if digest not in self._dbs:
                self._dbs[digest] = store.get(digest)
            return digest, self._dbs[digest]

    def curve_resolvers(self, digest: str, hardware: str, calibration: str = "default") -> dict:
        """Three resolvers built the way `estimate` builds its chain: physics only; the
        snapshot's database and interpolation first; the revision's calibrated analytic
        providers first (none when the revision has no efficiency curves)."""
        key = (digest, hardware, calibration)
        with self._lock:
            hit = self._resolvers.get(key)
        if hit is not None:
            return hit
        from perfcast.calibrate.store import load_calibration
        from perfcast.evidence.factory import build_resolver
        from perfcast.evidence.calibrated import calibrated_providers
        from perfcast.evidence.chain import evidence_providers
        from perfcast.hardware import load_system

        _, db = self.database(digest)
        system = load_system(hardware)
        revision = load_calibration(calibration, store=self.calibration_store())
        out = {"roofline": build_resolver(system),
               "database + interpolation": build_resolver(
                   system, evidence=evidence_providers([db], system, "interpolate"))}
        calibrated = calibrated_providers(system, revision) if revision is not None else []
        if calibrated:
            out["calibrated"] = build_resolver(system, evidence=calibrated)
        with self._lock:
            self._resolvers[key] = out
        return out

    def query_resolvers(self, ref: str, hardware: str | None, policy: str):
        """`perfcast evidence query`'s resolvers over a snapshot (cached per digest,
        system and policy) and the system a query without "hardware" asks about."""
        from perfcast.cli.evidence import query_resolvers

        digest = self.evidence_store().resolve(ref)
        key = ("query", digest, hardware, policy)
        with self._lock:
            hit = self._resolvers.get(key)
        if hit is None:
            hit = query_resolvers(digest, hardware, policy, self.evidence_store())
            with self._lock:
                self._resolvers[key] = hit
        return hit

    def cached(self, key: tuple, compute):
        """`compute()` once per key (keys start with a snapshot digest: immutable)."""
        with self._lock:
            if key in self._views:
                return self._views[key]
        value = compute()
        with self._lock:
            self._views[key] = value
        return value
