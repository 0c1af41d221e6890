"""Uneven pipeline split: with Megatron-LM's --account-for-embedding-in-pipeline-split /
--account-for-loss-in-pipeline-split the embedding (the loss) takes one layer slot when the
layers are cut into pp x V chunks, and the first (last) chunk builds one layer fewer
(`get_num_layers_to_build`, megatron/core/transformer/transformer_block.py at d98e8a64).
Llama 3 (arXiv:2407.21783, section 3.3.2): "we reduce one Transformer layer each from the
first and the last stages ... the first model chunk on the first stage has only the
embedding, and the last model chunk on the last stage has only output projection and loss
calculation"."""

from __future__ import annotations

from dataclasses import replace

import pytest

from perfcast.core.errors import ConfigError
from perfcast.training import TrainingLayout, TrainingRequest, estimate_training

from .tiny_models import LLAMA

BOTH = dict(account_for_embedding_in_pipeline_split=True,
            account_for_loss_in_pipeline_split=True)


def run(layers: int, pp: int, v: int, **flags):
    return estimate_training(TrainingRequest(
        model=replace(LLAMA, num_layers=layers), device="h100_sxm",
        layout=TrainingLayout(pp=pp, virtual_pipeline=v, **flags),
        global_batch_size=4, micro_batch_size=1, seq_length=128))


def layers_per_chunk(res) -> list[int]:
    out = []
    for c in res.chunks:
        runs = {t.lineage.split(".", 1)[0]: t for t in c.forward.tasks
                if t.layers is not None}
        out.append(sum(t.layers[1] - t.layers[0] + 1 for t in runs.values()))
    return out


def groups(chunk) -> set[str]:
    return {t.group for t in chunk.forward.tasks}


def test_first_and_last_chunk_one_layer_fewer():
    # 6 layers + 2 slots = 8 cut into 2 x 2 chunks of 4 slots (as Megatron's example)
    res = run(6, 2, 2, **BOTH)
    assert layers_per_chunk(res) == [1, 2, 2, 1]
    assert [c.device for c in res.chunks] == [0, 1, 0, 1]
    assert "embed.lookup" in groups(res.chunks[0])
    assert {"final.lm_head", "loss.cross_entropy"} <= groups(res.chunks[-1])
    # the same model FLOPs and parameters as the even split of the 6 layers over 2 ranks
    even = run(6, 2, 1)
    assert layers_per_chunk(even) == [3, 3]
    assert res.model_flops == pytest.approx(even.model_flops, rel=1e-12)
    assert sum(c.params for c in res.chunks) == sum(c.params for c in even.chunks)


def test_one_flag_only():
    res = run(7, 2, 2, account_for_embedding_in_pipeline_split=True)
    assert layers_per_chunk(res) == [1, 2, 2, 2]
    res = run(7, 2, 2, account_for_loss_in_pipeline_split=True)
    assert layers_per_chunk(res) == [2, 2, 2, 1]


def test_chunks_of_one_slot_hold_only_the_embedding_and_only_the_head():
    # Llama 3's wording: one slot per chunk, so chunk 0 is the embedding alone and the last
    # chunk the output projection and the loss alone
    res = run(2, 2, 2, **BOTH)
    assert layers_per_chunk(res) == [0, 1, 1, 0]
    first, last = res.chunks[0], res.chunks[-1]
    assert {t.operation for t in first.forward.tasks} == {"embedding"}
    assert groups(last) == {"final.norm", "final.lm_head", "loss.cross_entropy"}
    present = {t.lineage for t in last.forward.tasks}
    assert all(d in present for t in last.forward.tasks for d in t.deps)
    assert res.step_time_s > 0


def test_renamed_runs_keep_their_dependencies():
    res = run(6, 2, 1, **BOTH)     # 8 slots: chunk 0 L1-3 (embedding in slot 0), chunk 1 L4-6
    for c in res.chunks:
        present = {t.lineage for t in c.forward.tasks}
        assert all(d in present for t in c.forward.tasks for d in t.deps)
    assert {t.lineage.split(".", 1)[0] for t in res.chunks[0].forward.tasks
            if t.layers is not None} == {"L1-3"}
    assert {t.count for t in res.chunks[0].forward.tasks if t.layers is not None} == {3}


def test_slots_must_divide():
    with pytest.raises(ConfigError, match="embedding and loss slots = 8"):
        run(6, 3, 1, **BOTH)
    with pytest.raises(ConfigError, match="num_hidden_layers=6 is not divisible"):
        run(6, 2, 2)
