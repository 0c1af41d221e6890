"""Measured evidence for serving runs: AIConfigurator-layout folders -> providers.

`evidence_loader(root)` returns `evidence_for(system, backend, version)` that imports
`root/<system>/<family>/<backend>/<version>/*.parquet` once per (system, backend,
version) through the evidence layer's AIConfigurator importer and hands the providers
to the resolver ahead of the analytic models. Which collected version serves a row's
version is `nearest_version`: the newest collected version not newer than the row's,
else the oldest newer one (recorded as an assumption by the caller).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from perfcast.core.errors import ConfigError


def version_key(text: str) -> tuple:
    """Orderable key of a version string: 1.2.0rc5 < 1.2.0 < 1.2.0.post1."""
    parts = re.findall(r"\d+|[a-z]+", text.lower())
    key: list[tuple[int, int | str]] = []
    for p in parts:
        if p.isdigit():
            key.append((2, int(p)))
        elif p in ("rc", "a", "b", "dev"):
            key.append((0, p))
        else:  # post, ...
            key.append((3, p))
    key.append((1, 0))
    return tuple(key)


def nearest_version(wanted: str, available: list[str]) -> str | None:
    if not available:
        return None
    if wanted in available:
        return wanted
    if not wanted:
        return max(available, key=version_key)
    older = [v for v in available if version_key(v) <= version_key(wanted)]
    if older:
        return max(older, key=version_key)
    return min(available, key=version_key)


def collected_versions(root: Path, system: str, backend: str) -> list[str]:
    base = root / system
    versions: set[str] = set()
    if base.is_dir():
        for family in base.iterdir():
            folder = family / backend
            if folder.is_dir():
                versions.update(p.name for p in folder.iterdir() if p.is_dir())
    return sorted(versions, key=version_key)


def evidence_loader(root: Path) -> Callable[[str, str, str], list]:
    """`evidence_for(system, backend, version)` over an AIConfigurator-layout folder."""
    if not root.is_dir():
        raise ConfigError("is not a folder", source=str(root), field="--evidence-root",
                          expected="a folder laid out as <system>/<family>/<framework>/<version>")
    cache: dict[tuple[str, str, str], list] = {}

    def evidence_for(system: str, backend: str, version: str) -> list:
        chosen = nearest_version(version, collected_versions(root, system, backend))
        if chosen is None:
            return []
        key = (system, backend, chosen)
        if key not in cache:
            cache[key] = _import(root, system, backend, chosen)
        return cache[key]

    return evidence_for


def _import(root: Path, system: str, backend: str, version: str) -> list:
    try:
        from perfcast.evidence.importers import aiconfigurator  # noqa: F401
    except ImportError as exc:  # the measured-evidence layer is not installed
        raise ConfigError("measured evidence needs the AIConfigurator importer "
                          "(perfcast.evidence.importers.aiconfigurator)",
                          field="--evidence-root") from exc
    return aiconfigurator.providers_for(root, system=system, framework=backend, version=version)
