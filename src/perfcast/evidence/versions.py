"""Engine and library version strings: ordering, release distance, the nearest
collected version (evidence collected release by release)."""

from __future__ import annotations

import re


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


def release_numbers(text: str) -> tuple[int, ...]:
    """The leading numeric release components (major, minor, patch) of a version."""
    nums = re.match(r"\d+(?:\.\d+)*", text)
    parts = tuple(int(p) for p in nums.group(0).split(".")) if nums else ()
    return (parts + (0, 0, 0))[:3]


def release_distance(a: str, b: str) -> tuple[int, ...]:
    """How far apart two releases are, compared component by component (major first):
    0.18 is one minor release from 0.19 and four from 0.14; 1.3.0rc1 is in the same
    release series as 1.3.0rc10 (distance 0) and one minor release from 1.2.0rc5."""
    return tuple(abs(x - y) for x, y in zip(release_numbers(a), release_numbers(b)))


def nearest_version(wanted: str, available: list[str]) -> str | None:
    """The collected version closest in release numbers to `wanted` (kernels, their
    selection and defaults change release by release, so the nearest release measures
    what the row ran most closely); ties go to the newest not newer than `wanted`, then
    the oldest newer. No version given: the newest collected."""
    if not available:
        return None
    if wanted in available:
        return wanted
    if not wanted:
        return max(available, key=version_key)
    best = min(release_distance(wanted, v) for v in available)
    tied = [v for v in available if release_distance(wanted, v) == best]
    older = [v for v in tied if version_key(v) <= version_key(wanted)]
    if older:
        return max(older, key=version_key)
    return min(tied, key=version_key)


def nearest_first(wanted: str, available: list[str]) -> list[str]:
    """The collected versions in the order `nearest_version` prefers them."""
    rest, out = list(available), []
    while rest:
        out.append(nearest_version(wanted, rest))
        rest.remove(out[-1])
    return out
