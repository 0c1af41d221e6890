"""config.json checks: no silent head_dim truncation, a note for custom model code,
sizes bounded by what any device could hold."""

import json
from dataclasses import replace

import pytest

from perfcast.core.errors import ConfigError
from perfcast.workload import load_model_spec, model_spec_from_config
from perfcast.workload.model_spec import MAX_WEIGHT_BYTES, SIZE_BOUNDS

BASE = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 128256,
        "intermediate_size": 14336}


def _spec(**changes):
    return model_spec_from_config({**BASE, **changes}, source="cfg.json")


def test_indivisible_hidden_without_head_dim_is_refused():
    with pytest.raises(ConfigError) as err:
        _spec(hidden_size=4000, num_attention_heads=48, num_key_value_heads=8)
    msg = str(err.value)
    assert "cfg.json" in msg and "head_dim" in msg and "4000" in msg and "48" in msg


def test_explicit_head_dim_or_mla_dims_are_accepted():
    assert _spec(hidden_size=4000, num_attention_heads=48, num_key_value_heads=8,
                 head_dim=96).head_dim == 96
    mla = _spec(hidden_size=7168, num_attention_heads=96, num_key_value_heads=96,
                qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, kv_lora_rank=512)
    assert mla.num_heads == 96
    assert _spec().head_dim == 128


@pytest.mark.parametrize("field, value", [("vocab_size", 10**12), ("hidden_size", 10**9),
                                          ("num_hidden_layers", 10**6),
                                          ("intermediate_size", 10**8)])
def test_absurd_sizes_name_the_field_and_the_bound(field, value):
    with pytest.raises(ConfigError) as err:
        _spec(**{field: value})
    msg = str(err.value)
    assert f"'{field}'" in msg and str(SIZE_BOUNDS[field]) in msg and "at most" in msg


def test_weights_beyond_any_device_are_refused():
    # every field is within its own bound, the whole is not
    with pytest.raises(ConfigError) as err:
        _spec(hidden_size=65536, num_attention_heads=512, num_key_value_heads=8,
              num_hidden_layers=2048, intermediate_size=262144)
    msg = str(err.value)
    assert "parameters" in msg and f"{MAX_WEIGHT_BYTES / 2**40:.0f} TiB" in msg


def test_remote_code_gives_one_note_and_keeps_the_digest(tmp_path):
    cfg = {**BASE, "auto_map": {"AutoModel": "modeling_x.XModel"}, "trust_remote_code": True}
    spec = model_spec_from_config(cfg, source="x.json")
    assert len(spec.notes) == 1 and "never runs model code" in spec.notes[0]
    assert "auto_map / trust_remote_code" in spec.notes[0] and "x.json" in spec.notes[0]
    assert _spec().notes == ()
    assert spec.digest == replace(spec, notes=()).digest
    # wrappers keep auto_map at the top level, beside text_config
    wrapped = {"model_type": "wrap", "auto_map": {"AutoModel": "m.M"}, "text_config": BASE}
    assert len(model_spec_from_config(wrapped, source="w.json").notes) == 1
    # notes are not part of what determines work
    plain = dict(cfg)
    del plain["trust_remote_code"]
    p = tmp_path / "config.json"
    p.write_text(json.dumps(plain))
    assert len(load_model_spec(p).notes) == 1
