"""Property-based tests of the op_mapping.yaml loader and the database validator on
random mappings: a bad type always names operator and field, never another exception;
the validator never raises and flags exactly the rule violations it promises to."""

import tempfile
from pathlib import Path

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from perfcast.core.errors import ConfigError
from perfcast.evidence.profiling.op_mapping import _FIELD_KINDS, op_mapping_from_dict
from perfcast.evidence.profiling.validate import validate_database

KERNELS = ["MatMulV2", "Add", "RmsNorm"]        # CSVs present: MatMulV2 and Add only
WITH_CSV = {"MatMulV2", "Add"}
GOOD = {
    "str": st.sampled_from(KERNELS + ["", "note"]),
    "bool": st.booleans(),
    "int": st.integers(1, 4),
    "list": st.lists(st.sampled_from(KERNELS), max_size=2),
    "formats": st.lists(st.sampled_from(["ND", "FRACTAL_NZ"]), min_size=1, max_size=2),
}
ANY = st.one_of(st.none(), st.integers(-3, 3), st.text(max_size=4), st.booleans(),
                st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=2),
                                                                     st.integers(), max_size=1))
op_names = st.sampled_from(["aten.mm.default", "aten.add.Tensor", "x.y.default",
                            "tensor_cast.rms_norm.default"])


STR_FIELDS = {"kernel_type": st.sampled_from(KERNELS + [""]),
              "degenerate_bmm_kernel_type": st.sampled_from(KERNELS + [""]),
              "accepted_miss": st.sampled_from(["", "no kernel"]), "notes": st.text(max_size=5)}


def entry(good: bool):
    fields = {k: STR_FIELDS.get(k, GOOD[kind]) for k, kind in _FIELD_KINDS.items()
              if k not in ("category", "query_mode")}
    if not good:
        fields = {k: st.one_of(v, ANY) for k, v in fields.items()}
    if good:
        fields["category"] = st.just("compute")
    return st.fixed_dictionaries({}, optional=fields)


def mapping(good: bool):
    return st.dictionaries(op_names, entry(good), min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(mapping(good=False))
def test_loader_names_operator_and_field_or_loads(ops):
    try:
        m = op_mapping_from_dict({"device": "X", "operator_mappings": ops}, "op_mapping.yaml")
    except ConfigError as exc:
        text = str(exc)
        assert text.startswith("op_mapping.yaml: field 'operator_mappings.")
        op, field = next((o, f) for o in ops for f in ops[o] if f"{o}.{f}'" in text)
        assert field in _FIELD_KINDS and ops[op][field] is not None
    else:
        assert set(m.operator_mappings) == set(ops)


def _violations(name: str, e: dict) -> set[str]:
    """The error rules of validate._schema and the CSV check, restated."""
    out = set()
    composite, kernel = e.get("composite", False), e.get("kernel_type", "")
    zero, accepted = e.get("zero_cost", False), e.get("accepted_miss", "")
    if composite and kernel:
        out.add("exclusive")
    if composite and (zero or accepted):
        out.add("composite-zero")
    if zero and accepted:
        out.add("zero-accepted")
    if e.get("decomposer") and not composite:
        out.add("decomposer")
    if not (composite or zero or accepted) and not kernel:
        out.add("kernel-required")
    return out


@settings(max_examples=40, deadline=None)
@given(mapping(good=True))
def test_validator_flags_the_rule_violations_and_missing_csvs(ops):
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        (root / "op_mapping.yaml").write_text(yaml.safe_dump(
            {"device": "X", "operator_mappings": ops}))
        for k in WITH_CSV:
            (root / f"{k}.csv").write_text("Input Shapes,Input Data Types,Average Duration(us)\n"
                                           '"8,8",DT_BF16,1.0\n')
        report = validate_database(root)
    errors = [str(i) for i in report.errors]
    for name, e in ops.items():
        mine = [t for t in errors if f"operator_mappings.{name}:" in t]
        if _violations(name, e):
            assert mine, (name, e, errors)
    schema_ok = not any(_violations(n, e) for n, e in ops.items())
    missing = [t for t in errors if ".csv: missing" in t]
    assert all(t.startswith("error: RmsNorm.csv") for t in missing)   # only CSV-less kernels
    if schema_ok and not missing and all(not (e.get("composite") and not e.get("sub_kernels"))
                                         for e in ops.values()):
        assert report.ok, errors
