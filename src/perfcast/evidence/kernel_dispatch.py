"""Which kernel an engine runs for an operation, as the engine's own dispatch code decides.

Measured tables often hold several kernels for one operation and weight format (vLLM
0.24.0's `fp8_block` GEMMs: FlashInfer, DeepGEMM and CUTLASS), and which one a
deployment runs depends on the engine version, the GPU architecture, the checkpoint's
quantisation format and the shape (M). `evidence/dispatch/<engine>.yaml` states those
rules with the engine source they were read from; `dispatch_rules(engine)` loads them
and `KernelDispatch.choose(...)` answers one question: the kernel, the rule that chose
it and that rule's source.

A version outside every rule set, an operation or format without rules, or a device
without a known compute capability gives no choice (`None`), and the caller says so:
the rules never guess.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import yaml

from perfcast.core.errors import ConfigError

CONDITIONS = ("compute_capability", "compute_capability_family", "compute_capability_min",
              "m_below", "m_at_least", "n_multiple_of", "k_multiple_of", "model_type_not_in")


@dataclass(frozen=True)
class KernelChoice:
    """The kernel the engine runs, the rule that chose it and the rule's source."""

    kernel: str
    rule: str
    source: str
    candidates: tuple[str, ...]   # the rule list's kernels in the engine's priority order

    def describe(self) -> str:
        return f"kernel {self.kernel} (dispatch rule {self.rule}: {self.source})"


@dataclass(frozen=True)
class Candidate:
    kernel: str
    rule: str
    when: tuple[tuple[str, object], ...]
    source: str

    def admits(self, cc: int, m: int | None, n: int | None, k: int | None,
               model_type: str | None) -> bool:
        for name, value in self.when:
            if not _holds(name, value, cc, m, n, k, model_type):
                return False
        return True


def _holds(name, value, cc, m, n, k, model_type) -> bool:
    if name == "compute_capability":
        return cc in value
    if name == "compute_capability_family":
        return cc // 10 * 10 in value
    if name == "compute_capability_min":
        return cc >= value
    if name in ("m_below", "m_at_least"):
        if m is None:
            return False          # a shape condition cannot hold for an unknown M
        return m < value if name == "m_below" else m >= value
    if name in ("n_multiple_of", "k_multiple_of"):
        dim = n if name == "n_multiple_of" else k
        return dim is not None and dim % value == 0
    if name == "model_type_not_in":
        applies = cc // 10 * 10 in value["families"]
        return not (applies and model_type in value["model_types"])
    raise AssertionError(name)


@dataclass(frozen=True)
class RuleSet:
    name: str
    min_version: str
    max_version: str          # exclusive; "" = no upper bound
    operations: dict          # operation -> weight format -> tuple[Candidate, ...]
    formats: dict             # operation -> weight format -> checkpoint formats text

    def covers(self, version: str) -> bool:
        from perfcast.evidence.versions import version_key

        if not version:
            return False
        key = version_key(version)
        if self.min_version and key < version_key(self.min_version):
            return False
        return not (self.max_version and key >= version_key(self.max_version))


@dataclass(frozen=True)
class KernelDispatch:
    """An engine's dispatch rules (`evidence/dispatch/<engine>.yaml`)."""

    engine: str
    rule_sets: tuple[RuleSet, ...]
    compute_capability: dict      # device name -> major*10 + minor

    def rule_set(self, version: str) -> RuleSet | None:
        for rs in self.rule_sets:
            if rs.covers(version):
                return rs
        return None

    def choose(self, *, version: str, device: str, operation: str, weight_format: str,
               m: int | None = None, n: int | None = None, k: int | None = None,
               model_type: str | None = None) -> KernelChoice | None:
        """The kernel the engine's dispatch picks, or None when no rule applies (unknown
        version, device, operation or weight format)."""
        rs = self.rule_set(version)
        cc = self.compute_capability.get(device)
        if rs is None or cc is None:
            return None
        candidates = rs.operations.get(operation, {}).get(weight_format)
        if not candidates:
            return None
        names = tuple(dict.fromkeys(c.kernel for c in candidates))
        for c in candidates:
            if c.admits(cc, m, n, k, model_type):
                return KernelChoice(c.kernel, c.rule, c.source, names)
        return None

    def why_not(self, *, version: str, device: str, operation: str,
                weight_format: str) -> str:
        """Why `choose` has no answer for this question."""
        if self.rule_set(version) is None:
            covered = ", ".join(f"{rs.name} (>= {rs.min_version}"
                                + (f", < {rs.max_version})" if rs.max_version else ")")
                                for rs in self.rule_sets)
            return (f"no {self.engine} dispatch rules for version "
                    f"{version or '(not given)'} (rules cover: {covered})")
        if device not in self.compute_capability:
            return f"compute capability of {device} unknown (evidence/dispatch/architectures.yaml)"
        if weight_format not in self.rule_set(version).operations.get(operation, {}):
            return f"no {self.engine} dispatch rule for {operation} at {weight_format}"
        return f"no {self.engine} candidate admits this {operation} shape"


def _candidates(items, source: str) -> tuple[Candidate, ...]:
    out = []
    for i, item in enumerate(items or ()):
        where = f"candidates[{i}]"
        if not isinstance(item, dict) or not item.get("kernel") or not item.get("rule") \
                or not item.get("source"):
            raise ConfigError("needs kernel, rule and source", source=source, field=where)
        when = item.get("when") or {}
        unknown = sorted(set(when) - set(CONDITIONS))
        if unknown:
            raise ConfigError(f"unknown condition {unknown[0]!r}", source=source,
                              field=f"{where}.when", expected=" | ".join(CONDITIONS))
        out.append(Candidate(str(item["kernel"]), str(item["rule"]),
                             tuple(sorted(when.items())), str(item["source"])))
    return tuple(out)


def parse_rules(doc: dict, architectures: dict, source: str) -> KernelDispatch:
    if not isinstance(doc, dict) or not doc.get("engine"):
        raise ConfigError("is not a dispatch rule file", source=source, field="engine")
    sets = []
    for j, rs in enumerate(doc.get("rule_sets") or ()):
        versions = rs.get("versions") or {}
        if not rs.get("versions_source"):
            raise ConfigError("a rule set's version range needs versions_source",
                              source=source, field=f"rule_sets[{j}]")
        ops, formats = {}, {}
        for op, per_format in (rs.get("operations") or {}).items():
            for fmt, spec in per_format.items():
                if not spec.get("source"):
                    raise ConfigError("needs source", source=source,
                                      field=f"rule_sets[{j}].operations.{op}.{fmt}")
                ops.setdefault(op, {})[fmt] = _candidates(spec.get("candidates"), source)
                formats.setdefault(op, {})[fmt] = str(spec.get("checkpoint_formats", ""))
        sets.append(RuleSet(str(rs.get("name", f"rule_sets[{j}]")),
                            str(versions.get("min", "")), str(versions.get("max", "")),
                            ops, formats))
    return KernelDispatch(str(doc["engine"]), tuple(sets),
                          dict(architectures.get("compute_capability") or {}))


def _resource(name: str) -> dict:
    path = resources.files("perfcast.evidence").joinpath("dispatch", name)
    return yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else {}


@lru_cache(maxsize=None)
def dispatch_rules(engine: str) -> KernelDispatch | None:
    """The engine's built-in dispatch rules, or None when perfcast has none for it."""
    doc = _resource(f"{engine}.yaml")
    if not doc:
        return None
    return parse_rules(doc, _resource("architectures.yaml"), f"evidence/dispatch/{engine}.yaml")

