"""The `--evidence` options shared by the commands that cost tasks through the resolver
(`estimate`, `train`, ...): one declaration, one help text."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

EvidenceOption = Annotated[Optional[list[str]], typer.Option(
    "--evidence", help="snapshot digest/prefix, saved database or AIConfigurator folder "
                       "(repeat; earlier ones are asked first)")]
EvidencePolicyOption = Annotated[str, typer.Option(
    "--evidence-policy", help="exact | interpolate | extrapolate")]
StoreOption = Annotated[Optional[Path], typer.Option("--store", help="evidence store folder")]
AllowForeignOption = Annotated[bool, typer.Option(
    "--allow-foreign-evidence", help="use evidence measured on another device than "
                                     "--device (every such answer says so)")]
RuntimeVersionOption = Annotated[str, typer.Option("--runtime-version")]
RuntimeOption = Annotated[str, typer.Option("--runtime", help="runtime of the evidence to use")]
ImplementationOption = Annotated[Optional[list[str]], typer.Option(
    "--implementation", help="KERNEL (every op) or OP=KERNEL (repeat)")]
