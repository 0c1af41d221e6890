"""perfcast.core.yamlio.safe_load (libyaml when present) reads every YAML file the
package ships and the reference data as yaml.safe_load does, and fails as it does."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from perfcast.core import yamlio

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted((ROOT / "src" / "perfcast").rglob("*.yaml")) + sorted(
    (ROOT.parent / "shared" / "reference").rglob("*.yaml"))[:300]


def test_libyaml_is_used_when_pyyaml_has_it():
    assert (yamlio._FAST is not None) == bool(getattr(yaml, "__with_libyaml__", False))


def test_same_documents_as_yaml_safe_load():
    assert len(FILES) > 20
    for path in FILES:
        text = path.read_text(encoding="utf-8")
        ours, theirs = yamlio.safe_load(text), yaml.safe_load(text)
        assert ours == theirs and repr(ours) == repr(theirs), path


@pytest.mark.parametrize("text", [
    "a: 1\n b: 2\n", "key: [1, 2\n", "- a\nb: c\n", "x: !!python/object:os.system 1\n",
    "a: 'unclosed\n", "\t- tab\n"])
def test_errors_read_as_yaml_safe_load(text):
    with pytest.raises(yaml.YAMLError) as theirs:
        yaml.safe_load(text)
    with pytest.raises(yaml.YAMLError) as ours:
        yamlio.safe_load(text)
    assert type(ours.value) is type(theirs.value) and str(ours.value) == str(theirs.value)


def test_scalars_resolve_as_yaml_safe_load():
    text = ("a: 1e3\nb: 0x1F\nc: yes\nd: ~\ne: 2026-01-02\nf: 1_000\ng: .inf\nh: 0o17\n"
            "i: '007'\nj: 007\nk: 1.0\nl: -.5\n")
    ours, theirs = yamlio.safe_load(text), yaml.safe_load(text)
    assert ours == theirs and [type(v) for v in ours.values()] == [type(v) for v in
                                                                   theirs.values()]
