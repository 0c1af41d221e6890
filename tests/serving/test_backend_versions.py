"""Backend defaults per engine version range: selection, notes, sources, callers."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from perfcast.cli.main import app
from perfcast.core.errors import ConfigError
from perfcast.hardware import load_system
from perfcast.serving.backends import is_version, load_backend
from perfcast.serving.silicon import ModelResolver, load_rules, row_config

H100, H200, A100 = (load_system(n) for n in ("h100_sxm", "h200_sxm", "a100_sxm"))


def _file(tmp_path: Path, ranges: list, when: list | None = None) -> str:
    """The shipped vLLM file's base sections with the given ranges (and `when`)."""
    doc = yaml.safe_load(Path(load_backend("vllm").source).read_text())
    doc.pop("when")
    doc["version_ranges"] = ranges
    if when is not None:
        doc["when"] = when
    path = tmp_path / "ranged.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(path)


def _budget(budget: int) -> dict:
    return {"token_budget": budget, "token_budget_source": f"test value {budget}"}


TWO_RANGES = [
    {"since": "1.0.0", "until": "1.2.0", "source": "old releases", "scheduler": _budget(1000)},
    {"since": "1.4.0", "until": "2.0.0", "default": True, "source": "new releases",
     "scheduler": _budget(3000)},
]


def test_range_selection_exact_between_older_newer_and_labels(tmp_path):
    path = _file(tmp_path, TWO_RANGES)
    cases = {  # version -> (range, token budget, note contains)
        "1.1.3": (">=1.0.0,<1.2.0", 1000, None),
        "1.0.0rc2": (">=1.0.0,<1.2.0", 1000, "older than every range"),  # rc before 1.0.0
        "1.4.0": (">=1.4.0,<2.0.0", 3000, None),
        "1.9.9.post1": (">=1.4.0,<2.0.0", 3000, None),
        "1.3.0": (">=1.0.0,<1.2.0", 1000, "between ranges"),   # one minor from each: older
        "1.2.0": (">=1.0.0,<1.2.0", 1000, "between ranges"),   # `until` is exclusive
        "1.3.9": (">=1.0.0,<1.2.0", 1000, "between ranges"),
        "0.4.0": (">=1.0.0,<1.2.0", 1000, "older than every range"),
        "2.5.0": (">=1.4.0,<2.0.0", 3000, "newer than every range"),
        "nightly": (">=1.4.0,<2.0.0", 3000, "not a release number"),
        "": (">=1.4.0,<2.0.0", 3000, "no engine version given"),
    }
    for version, (label, budget, note) in cases.items():
        b = load_backend(path, version)
        assert (b.version_range, b.scheduler.token_budget) == (label, budget), version
        assert b.version == version
        if note is None:
            assert b.version_note == "", version
        else:
            assert note in b.version_note and label in b.version_note, version


def test_nearest_range_counts_release_numbers_not_string_order(tmp_path):
    ranges = [{"since": "0.2.0", "until": "0.9.0", "source": "a", "scheduler": _budget(1000)},
              {"since": "0.18.0", "default": True, "source": "b", "scheduler": _budget(3000)}]
    path = _file(tmp_path, ranges)
    assert load_backend(path, "0.16.0").scheduler.token_budget == 3000  # 2 minors from 0.18
    assert load_backend(path, "0.10.0").scheduler.token_budget == 1000  # 1 minor from 0.9
    assert load_backend(path, "v0.19.1").version_note == ""             # a leading v is fine


def test_release_number_or_label():
    for text in ("0.5.8.post1", "1.2.0rc6.post1", "0.11.2", "1.0.0rc3", "v0.8.0", "2.0.0.dev1"):
        assert is_version(text), text
    for text in ("glm5-hopper", "gpt-oss-dev", "", "latest", "0.5.x"):
        assert not is_version(text), text


def test_when_entries_follow_the_deployment(tmp_path):
    when = [{"if": {"memory_gib_below": 100, "tp_at_least": 4}, "source": "small and wide",
             "scheduler": _budget(512)}]
    ranges = [{"since": "1.0.0", "default": True, "source": "r", "scheduler": _budget(3000),
               "when": [{"if": {"devices": ["h200_sxm"]}, "source": "h200 only",
                         "scheduler": _budget(7000)}]}]
    path = _file(tmp_path, ranges, when)
    # file-level `when` comes first, the range overrides it, then the range's `when`
    assert load_backend(path, "1.0.0", system=H100, tp=8).scheduler.token_budget == 3000
    assert load_backend(path, "1.0.0", system=H200, tp=1).scheduler.token_budget == 7000
    ranges[0].pop("scheduler")
    path = _file(tmp_path, ranges, when)
    assert load_backend(path, "1.0.0", system=H100, tp=8).scheduler.token_budget == 512
    assert load_backend(path, "1.0.0", system=H100, tp=2).scheduler.token_budget == 8192
    assert load_backend(path, "1.0.0", system=H200, tp=8).scheduler.token_budget == 7000
    # facts the caller does not give match no condition that needs them
    assert load_backend(path, "1.0.0").scheduler.token_budget == 8192
    applied = load_backend(path, "1.0.0", system=H100, tp=8).conditions
    assert applied == ("memory_gib_below 100, tp_at_least 4: small and wide",)


@pytest.mark.parametrize("broken, field", [
    (lambda r: r[0]["scheduler"].pop("token_budget_source"), "token_budget"),
    (lambda r: r[0].update(scheduler={"chunked_prefill": False}), "chunked_prefill"),
    (lambda r: r[0].update(cuda_graph={"capture_sizes": [1, 2]}), "capture_sizes"),
    (lambda r: r[0].pop("source"), "source"),
    (lambda r: r[1].update(when=[{"if": {"tp_at_least": 2}, "scheduler": _budget(9)}]),
     "when"),
    (lambda r: r[1].update(when=[{"if": {"gpu_name": "h100"}, "source": "x"}]), "if"),
    (lambda r: r[1].update(since="1.1.0"), "overlap"),
    (lambda r: r[0].update(default=True), "default"),
    (lambda r: r[0].update(until="banana"), "release number"),
])
def test_versioned_values_need_sources_and_ranges_must_be_sound(tmp_path, broken, field):
    ranges = json.loads(json.dumps(TWO_RANGES))
    broken(ranges)
    with pytest.raises(ConfigError, match=field):
        load_backend(_file(tmp_path, ranges), "1.1.0")


def test_defaults_stay_immutable_and_cached():
    a = load_backend("sglang", "0.5.9", system=H100, tp=8, pp=1)
    assert load_backend("sglang", "0.5.9", system=H100, tp=8, pp=1) is a
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.version_range = "x"  # type: ignore[misc]


def test_shipped_vllm_ranges():
    v0 = load_backend("vllm", "0.7.3", system=H100, tp=1, pp=1)
    assert (v0.scheduler.token_budget, v0.scheduler.max_running_requests) == (2048, 256)
    assert v0.cuda_graph.decode_only and v0.cuda_graph.max_batch == 256
    sync = load_backend("vllm", "0.12.0", system=H100, tp=1, pp=1)
    assert (sync.scheduler.token_budget, sync.scheduler.max_running_requests) == (8192, 1024)
    assert not sync.overheads.host_overlapped and not sync.cuda_graph.decode_only
    assert load_backend("vllm", "0.18.0", system=H100, tp=1, pp=1).overheads.host_overlapped
    assert not load_backend("vllm", "0.18.0", system=H100, tp=1, pp=2).overheads.host_overlapped
    a100 = load_backend("vllm", "0.18.0", system=A100)
    assert (a100.scheduler.token_budget, a100.scheduler.max_running_requests) == (2048, 256)
    old = load_backend("vllm", "0.5.4", system=H100)
    assert old.version_range == ">=0.7.0,<0.8.0" and "older than every range" in old.version_note


def test_shipped_sglang_and_trtllm_ranges():
    before = load_backend("sglang", "0.5.1.post1", system=H100, tp=8)
    assert (before.cuda_graph.max_batch, max(before.cuda_graph.capture_sizes)) == (160, 160)
    assert 12 not in before.cuda_graph.capture_sizes
    assert load_backend("sglang", "0.5.1.post1", system=H200, tp=8).cuda_graph.max_batch == 256
    after = load_backend("sglang", "0.5.9", system=H100, tp=8)
    assert after.cuda_graph.max_batch == 512 and 12 in after.cuda_graph.capture_sizes
    assert load_backend("sglang", "0.5.9", system=H100, tp=2).cuda_graph.max_batch == 256
    assert after.scheduler.token_budget == 8192
    glm = load_backend("sglang", "glm5-hopper", system=H200, tp=8)
    assert glm.version_range == ">=0.5.3" and "not a release number" in glm.version_note
    dynamo = load_backend("trtllm", "0.8.1.post3", system=H100)
    assert dynamo.version_range == ">=1.0.0rc0" and "older than every range" in dynamo.version_note
    assert load_backend("trtllm", "1.3.0rc1", system=H100).version_note == ""


def _serve(*args: str) -> dict:
    res = CliRunner().invoke(app, ["serve", "Qwen/Qwen3-0.6B", "--concurrency", "2", "--isl",
                                   "128", "--osl", "8", "--backend", "vllm", *args,
                                   "--format", "json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_serve_backend_version_selects_scheduler_defaults_through_the_cli():
    old, new = _serve("--backend-version", "0.7.3"), _serve("--backend-version", "0.18.0")
    assert (old["inputs"]["scheduler"]["token_budget"],
            old["inputs"]["scheduler"]["max_running_requests"]) == (2048, 256)
    assert (new["inputs"]["scheduler"]["token_budget"],
            new["inputs"]["scheduler"]["max_running_requests"]) == (8192, 1024)
    assert old["inputs"]["backend_defaults"]["version_range"] == ">=0.7.0,<0.8.0"
    assert new["inputs"]["backend_defaults"] == {
        "file": "vllm.yaml", "version_range": ">=0.14.0", "note": None, "conditions": []}


def test_serve_says_when_the_version_is_not_in_a_range():
    doc = _serve("--backend-version", "0.6.0")
    note = doc["inputs"]["backend_defaults"]["note"]
    assert "older than every range" in note and ">=0.7.0,<0.8.0" in note
    assert note in doc["inputs"]["notes"]
    res = CliRunner().invoke(app, ["serve", "Qwen/Qwen3-0.6B", "--concurrency", "2", "--isl",
                                   "128", "--osl", "8", "--backend", "sglang",
                                   "--backend-version", "glm5-hopper"])
    assert res.exit_code == 0, res.output
    assert "defaults   sglang.yaml range >=0.5.3" in res.stdout
    assert "'glm5-hopper' is not a release number" in res.stdout


def _row(backend: str, version: str, system: str = "h100_sxm", tp: str = "8") -> dict:
    row = {"id": "x", "backend": backend, "backend_version": version,
           "model_path": "meta-llama/Llama-3.1-8B", "system": system, "precision": "bf16",
           "mode": "agg", "isl": "1000", "osl": "100", "gemm_quant_mode": "bf16",
           "moe_quant_mode": "", "batch_size": "8", "tp_size": tp, "pp_size": "1",
           "attention_dp_size": "", "moe_tp_size": "", "moe_ep_size": "1",
           "silicon_ttft_ms": "1", "silicon_tpot_ms": "1"}
    rules = load_rules()
    return row_config(row, ModelResolver(None, rules), rules)


def test_silicon_rows_use_their_own_backend_version():
    old, _ = _row("sglang", "0.5.1.post1")
    new, _ = _row("sglang", "0.5.9")
    assert old.backend.version_range == ">=0.5.0,<0.5.3"
    assert new.backend.version_range == ">=0.5.3"
    assert 12 in new.backend.cuda_graph.capture_sizes
    assert 12 not in old.backend.cuda_graph.capture_sizes
    # the harness's chunked-prefill size, not the engine default, in validation
    assert old.backend.scheduler.token_budget == new.backend.scheduler.token_budget == 16384
    _, notes = _row("sglang", "glm5-hopper", system="h200_sxm")
    assert any("'glm5-hopper' is not a release number" in n for n in notes)


def _sglang_fraction(version: str, system, tp: int, dp: int = 1, **changes) -> float:
    """SGLang's own mem_fraction_static for a stage of tp x dp GPUs (`changes`: the
    chunk or CUDA-graph batch a launch sets)."""
    bk = load_backend("sglang", version, system=system, tp=tp * dp)
    return bk.kv_cache.reserved_memory.fraction(
        memory_gib=system.device.memory.capacity_bytes / 2**30,
        chunk_tokens=changes.get("chunk", bk.scheduler.token_budget),
        graph_max_batch=changes.get("graph", bk.cuda_graph.max_batch),
        stage_gpus=tp * dp, pp=1, dp=dp)


def test_sglang_derives_its_memory_fraction_per_release():
    gib = H100.device.memory.capacity_bytes / 2**30
    assert gib == 80 and H200.device.memory.capacity_bytes / 2**30 == 141
    # since PR #10975: 512 + 1.5 x 8192 + 2 x 256 + 1 x 1024 / 8 MiB held back
    assert _sglang_fraction("0.5.9", H100, 1) == round(1 - (512 + 12288 + 512 + 128) / 81920, 3)
    assert _sglang_fraction("0.5.9", H100, 1) == 0.836
    # TP 8 captures graphs up to 512 and holds 1024 MiB for the parallel size
    assert _sglang_fraction("0.5.9", H100, 8) == round(1 - (512 + 12288 + 1024 + 1024) / 81920, 3)
    # a 16384-token chunk (a launch setting) holds 1.5 MiB more per chunk token
    assert _sglang_fraction("0.5.9", H100, 1, chunk=16384) == round(
        1 - (512 + 24576 + 512 + 128) / 81920, 3)
    # the 10 GiB floor above 60 GiB: a 2048-token chunk and no graphs still hold 10 GiB
    assert _sglang_fraction("0.5.9", H100, 1, chunk=512, graph=0) == round(1 - 10240 / 81920, 3)
    # DP attention: + 3 MiB per graph batch per rank, x 1.5 above a 300 batch
    plain, dp8 = _sglang_fraction("0.5.9", H200, 8), _sglang_fraction("0.5.9", H200, 1, dp=8)
    assert round((plain - dp8) * 141 * 1024) == pytest.approx(512 * 8 * 3 * 1.5, abs=150)
    # PR #7054 to #10975: (9.5 + tp x pp / 2) GiB on 35-90 GB, (12 + ...) on H200
    assert _sglang_fraction("0.5.1.post1", H100, 1) == round(1 - 10.0 / 80, 3) == 0.875
    assert _sglang_fraction("0.5.1.post1", H100, 8) == round(1 - 13.5 / 80, 3)
    assert _sglang_fraction("0.5.1.post1", H200, 1) == round(1 - 12.5 / 141, 3)
    assert _sglang_fraction("0.5.1.post1", H100, 1, dp=2) == round(1 - (10.5 + 4) / 80, 3)
    # the older rule does not depend on the chunk
    assert _sglang_fraction("0.5.1.post1", H100, 1, chunk=32768) == 0.875
    # other engines keep their stated fraction
    assert load_backend("vllm").kv_cache.reserved_memory is None
    assert load_backend("trtllm").kv_cache.reserved_memory is None


def test_sglang_kv_pool_follows_its_derived_fraction_and_a_launch_fraction_replaces_it():
    from dataclasses import replace

    from perfcast.evidence.factory import build_resolver
    from perfcast.serving.deploy import GIB, kv_capacity_tokens, memory_fraction
    from perfcast.serving.step_cost import StepCostModel
    from perfcast.workload import ParallelPlan, load_model_spec

    spec = load_model_spec("Qwen/Qwen3-8B")
    step = StepCostModel(spec, ParallelPlan(tp=1), H100, build_resolver(H100))
    bk = load_backend("sglang", "0.5.9", system=H100, tp=1)
    assert memory_fraction(step, bk) == 0.836
    bigger_chunk = bk.with_scheduler(token_budget=16384)
    per_token = step.memory_facts().kv_bytes_per_request(2048) / 2048
    lost = kv_capacity_tokens(step, bk) - kv_capacity_tokens(step, bigger_chunk)
    assert lost == pytest.approx(1.5 * 8192 * 2**20 / per_token, rel=0.01)
    # an EAGLE/MTP draft holds 2 GiB more; a launch's fraction ends the derivation
    assert memory_fraction(step, bk, draft_model=True) == round(
        1 - (512 + 12288 + 512 + 128 + 2048) / 81920, 3)
    launched = replace(bk, kv_cache=bk.kv_cache.with_memory_fraction(0.8))
    assert launched.kv_cache.reserved_memory is None
    assert memory_fraction(step, launched.with_scheduler(token_budget=32768)) == 0.8
    weights = step.memory_facts().weights
    assert kv_capacity_tokens(step, launched) == int((80 * GIB * 0.8 - weights) // per_token)
    # no room: the message names the engine's own derivation
    huge = bk.with_scheduler(token_budget=50_000)
    with pytest.raises(ConfigError, match="the engine's own, from 50000-token chunks"):
        kv_capacity_tokens(StepCostModel(load_model_spec("Qwen/Qwen3-32B"), ParallelPlan(tp=1),
                                         H100, build_resolver(H100)), huge)


def test_reserved_memory_terms_are_checked(tmp_path):
    doc = yaml.safe_load(Path(load_backend("sglang").source).read_text())
    doc["kv_cache"]["reserved_memory"] = {"base_mib": 512, "per_gpu_typo": 3}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(ConfigError, match="known terms"):
        load_backend(str(path))
    doc["kv_cache"]["reserved_memory"] = {"base_mib": 512}
    doc["kv_cache"].pop("reserved_memory_source")
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(ConfigError, match="source"):
        load_backend(str(path))


@settings(max_examples=200, deadline=None)
@given(chunk=st.integers(1, 65536), graphs=st.integers(0, 1024),
       gpus=st.sampled_from([1, 2, 4, 8]), dp=st.sampled_from([1, 2, 4, 8]), version=st.sampled_from(["0.5.1.post1", "0.5.9"]),
       system=st.sampled_from([H100, H200]))
def test_sglang_fraction_never_rises_with_what_the_engine_holds_back(chunk, graphs, gpus, dp,
                                                                     version, system):
    """More chunk tokens, a larger CUDA-graph batch, more GPUs per stage or a draft model
    never leave the engine a larger share of memory, which stays below 1 (it may reach
    0 or less: SGLang's rule then leaves no room, and kv_capacity_tokens says so)."""
    rule = load_backend("sglang", version, system=system, tp=gpus).kv_cache.reserved_memory
    gib = system.device.memory.capacity_bytes / 2**30

    def frac(**changes):
        facts = dict(memory_gib=gib, chunk_tokens=chunk, graph_max_batch=graphs,
                     stage_gpus=gpus, pp=1, dp=min(dp, gpus))
        return rule.fraction(**{**facts, **changes})

    base = frac()
    assert base < 1
    assert frac(chunk_tokens=chunk * 2) <= base
    assert frac(graph_max_batch=graphs + 64) <= base
    assert frac(stage_gpus=gpus * 2) <= base
    assert frac(speculative=True) <= base


def test_sglang_graph_batch_follows_every_memory_tier():
    """PR #10372's chain: 8 below 20 GB, 24 / 80 (TP < 4 / >= 4) below 35 GB, 32 / 160
    below 60 GB, 256 / 512 below 160 GB, 512 above."""
    cases = {("b200_sxm", 1): 512, ("gb300", 8): 512, ("b60", 1): 24, ("b60", 4): 80,
             ("l40s", 1): 32, ("l40s", 8): 160, ("h100_sxm", 2): 256, ("h200_sxm", 4): 512}
    for (name, tp), batch in cases.items():
        bk = load_backend("sglang", "0.5.9", system=load_system(name), tp=tp)
        assert bk.cuda_graph.max_batch == batch, (name, tp)
    b200 = load_backend("sglang", "0.5.9", system=load_system("b200_sxm"))
    assert b200.scheduler.token_budget == 16384
