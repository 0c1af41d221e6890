"""Training layout (Megatron-LM style parallelism) and its checks against a model."""

from __future__ import annotations

from dataclasses import dataclass

from perfcast.core.errors import ConfigError

RECOMPUTE_MODES = ("none", "selective", "full")
ZERO_STAGES = (0, 1, 2, 3)


def _positive(value, flag: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"has value {value!r}", field=flag, expected="a positive integer")


@dataclass(frozen=True)
class TrainingLayout:
    """Degrees of parallelism of one training job.

    Devices = tp x pp x dp x cp. Rank order (innermost first) is tp, cp, dp, pp, as
    Megatron-LM lays them out; the tier of each group follows from its span. `ep`
    expert-parallel ranks are carved out of dp x tp (`ep / tp` DP ranks of `tp` devices
    each, experts not tensor-split: Megatron's expert tensor parallel size 1).
    `virtual_pipeline` > 1 selects the interleaved 1F1B schedule (Narayanan et al. 2021);
    `sequence_parallel` turns each TP all-reduce into reduce-scatter + all-gather;
    `recompute`: none | selective (attention core recomputed, Korthikanti et al. 2022) |
    full (each layer's forward recomputed from its input); `zero_stage`: 0 (gradient
    all-reduce), 1 (optimizer state sharded over dp x cp), 2 (+ gradients), 3 (+ weights).
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    virtual_pipeline: int = 1
    sequence_parallel: bool = False
    recompute: str = "none"
    zero_stage: int = 0
    # Megatron-LM --account-for-embedding-in-pipeline-split / --account-for-loss-in-
    # pipeline-split (get_num_layers_to_build, megatron/core/transformer/
    # transformer_block.py at d98e8a64): the input embedding (the loss) takes one layer
    # slot when the layers are cut into pp x V chunks, so the first (last) chunk builds one
    # transformer layer fewer
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False

    def __post_init__(self) -> None:
        for name, flag in (("tp", "--tp-size"), ("pp", "--pp-size"), ("dp", "--dp-size"),
                           ("cp", "--cp-size"), ("ep", "--ep-size"),
                           ("virtual_pipeline", "--virtual-pipeline-size")):
            _positive(getattr(self, name), flag)
        if self.recompute not in RECOMPUTE_MODES:
            raise ConfigError(f"has value {self.recompute!r}", field="--recompute",
                              expected=" | ".join(RECOMPUTE_MODES))
        if self.zero_stage not in ZERO_STAGES or isinstance(self.zero_stage, bool):
            raise ConfigError(f"has value {self.zero_stage!r}", field="--zero-stage",
                              expected="0 | 1 | 2 | 3")
        if self.virtual_pipeline > 1 and self.pp == 1:
            raise ConfigError(f"--virtual-pipeline-size={self.virtual_pipeline} needs "
                              f"pipeline parallelism", field="--virtual-pipeline-size",
                              expected="1 when --pp-size is 1")

    @property
    def num_devices(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def chunks(self) -> int:
        """Model chunks (virtual pipeline stages) over all pipeline ranks."""
        return self.pp * self.virtual_pipeline

    def pipeline_slots(self, num_layers: int) -> int:
        """Layer slots cut into the pp x V chunks: the layers, plus the embedding and the
        loss where they are accounted for in the split."""
        return (num_layers + int(self.account_for_embedding_in_pipeline_split)
                + int(self.account_for_loss_in_pipeline_split))

    @property
    def data_ranks(self) -> int:
        """Ranks holding a replica of the dense weights: gradients are reduced over dp x cp."""
        return self.dp * self.cp

    @property
    def expert_dp_groups(self) -> int:
        """DP ranks that form one expert-parallel group (`ep / tp`; 1 without EP)."""
        return max(1, self.ep // self.tp) if self.ep > 1 else 1

    @property
    def expert_data_ranks(self) -> int:
        """Ranks holding a replica of each expert: dp x cp x tp / ep."""
        return self.data_ranks * self.tp // self.ep if self.ep > 1 else self.data_ranks

    def check_devices(self, num_devices: int) -> None:
        if num_devices != self.num_devices:
            raise ConfigError(
                f"--num-devices={num_devices} but tp x pp x dp x cp = {self.tp} x {self.pp} x "
                f"{self.dp} x {self.cp} = {self.num_devices}", field="--num-devices",
                expected="the product of the parallel degrees")


def check_layout(layout: TrainingLayout, model, *, global_batch_size: int,
                 micro_batch_size: int, seq_length: int, moe: bool) -> int:
    """Divisibility checks of a layout against a model and batch; returns the number of
    microbatches per DP rank. Each error names the flag to change."""
    _positive(global_batch_size, "--global-batch-size")
    _positive(micro_batch_size, "--micro-batch-size")
    _positive(seq_length, "--seq-length")
    lay = layout
    slots = lay.pipeline_slots(model.num_layers)
    if slots % lay.chunks:
        what = (f"pp x virtual pipeline = {lay.pp} x {lay.virtual_pipeline} = {lay.chunks}"
                if lay.virtual_pipeline > 1 else f"pp = {lay.pp}")
        layers = f"num_hidden_layers={model.num_layers}" + (
            f" + the embedding and loss slots = {slots}" if slots != model.num_layers else "")
        raise ConfigError(f"{layers} is not divisible by {what}",
                          field="--virtual-pipeline-size" if lay.virtual_pipeline > 1
                          else "--pp-size", expected=f"a divisor of {slots}")
    if model.num_heads % lay.tp:
        raise ConfigError(f"num_attention_heads={model.num_heads} is not divisible by "
                          f"tp={lay.tp}", field="--tp-size",
                          expected=f"a divisor of {model.num_heads}")
    per_step = micro_batch_size * lay.dp
    if global_batch_size % per_step:
        raise ConfigError(f"--global-batch-size={global_batch_size} is not divisible by "
                          f"micro-batch x dp = {micro_batch_size} x {lay.dp} = {per_step}",
                          field="--global-batch-size", expected=f"a multiple of {per_step}")
    microbatches = global_batch_size // per_step
    if lay.virtual_pipeline > 1 and microbatches % lay.pp:
        raise ConfigError(f"the interleaved schedule needs the {microbatches} microbatches "
                          f"per DP rank to be a multiple of pp={lay.pp}",
                          field="--global-batch-size",
                          expected=f"a multiple of micro-batch x dp x pp = {per_step * lay.pp}")
    if seq_length % lay.cp or (lay.cp > 1 and (seq_length // lay.cp) % 2):
        raise ConfigError(f"--seq-length={seq_length} does not split into 2 x cp={lay.cp} "
                          f"equal chunks (load-balanced context parallelism)",
                          field="--cp-size", expected=f"a divisor of {seq_length} // 2")
    if lay.sequence_parallel and lay.tp == 1:
        raise ConfigError("sequence parallelism splits tokens over TP ranks",
                          field="--sequence-parallel", expected="--tp-size > 1")
    if lay.ep > 1:
        if not moe:
            raise ConfigError(f"--ep-size={lay.ep} but the model has no routed experts",
                              field="--ep-size", expected="1 for a dense model")
        if lay.ep % lay.tp or lay.dp % (lay.ep // lay.tp):
            raise ConfigError(f"ep={lay.ep} must be tp={lay.tp} times a divisor of "
                              f"dp={lay.dp} (expert-parallel ranks are carved out of dp x tp)",
                              field="--ep-size", expected="tp x k with k dividing dp")
    return microbatches
