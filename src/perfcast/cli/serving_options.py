"""Options shared by `serve` and `search` (speculative decoding, prefix caching, the
operator stack; `validate silicon` takes the stack too): one declaration, one help text."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

SpeculativeOption = Annotated[Optional[str], typer.Option(
    "--speculative", help="speculative decoding: mtp | eagle | eagle3 | ngram")]
NumSpeculativeTokensOption = Annotated[int, typer.Option(
    "--num-speculative-tokens", help="draft tokens K per verify step")]
AcceptanceOption = Annotated[Optional[str], typer.Option(
    "--acceptance", help="mean accepted draft tokens per verify step (0..K), or K "
    "comma-separated per-position acceptance rates")]
DraftModelOption = Annotated[Optional[Path], typer.Option(
    "--draft-model", help="EAGLE head config.json (default: one Llama layer of the "
    "target's width)")]
# the profile names of perfcast/workload/stacks.yaml, written out: `serve --help` reads no
# YAML (tests/serving/test_serve_stack.py checks they are all listed)
StackOption = Annotated[str, typer.Option(
    "--stack", help="operator conventions of every step graph, as `perfcast estimate "
    "--stack`: auto (tensorcast on Ascend NPUs, else default; the MLA call follows the "
    "stack) | default | tensorcast | vllm-ascend-0.18 (workload/stacks.yaml)")]
