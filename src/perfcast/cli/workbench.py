"""`perfcast workbench`: the local web application and JSON API (read-only)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from perfcast.cli.errors import user_errors

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def workbench_command(
    host: Annotated[str, typer.Option(help="address to listen on (default loopback only; "
                                           "0.0.0.0 exposes it to the network)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port")] = 8080,
    store: Annotated[Optional[Path], typer.Option(
        "--store", help="evidence store folder (default: $PERFCAST_EVIDENCE_STORE or the user "
                        "data dir)")] = None,
    observation_store: Annotated[Optional[Path], typer.Option(
        "--observation-store", help="observation store (default: $PERFCAST_OBSERVATION_STORE "
                                    "or the user data dir)")] = None,
    calibration_store: Annotated[Optional[Path], typer.Option(
        "--calibration-store", help="calibration store (default: $PERFCAST_CALIBRATION_STORE "
                                    "or the user data dir)")] = None,
) -> None:
    """Serve the evidence workbench: pages at http://HOST:PORT/, the JSON API under /api,
    its OpenAPI page at /docs. Reads the stores; never writes evidence."""
    with user_errors():
        from perfcast.core.errors import ConfigError

        if not 0 < port < 65536:
            raise ConfigError(f"has value {port}", field="--port", expected="1..65535")
        if host not in LOOPBACK:
            print(f"warning: the workbench listens on {host}: anyone who can reach this "
                  "machine can use it (it has no login)", file=sys.stderr)
        # the CLI's record functions find the stores by these variables: one source
        for var, path in (("PERFCAST_EVIDENCE_STORE", store),
                          ("PERFCAST_OBSERVATION_STORE", observation_store),
                          ("PERFCAST_CALIBRATION_STORE", calibration_store)):
            if path is not None:
                os.environ[var] = str(path.resolve())
        from perfcast.workbench.app import serve
        from perfcast.workbench.state import Workbench

        serve(Workbench(evidence_root=store, observation_root=observation_store,
                        calibration_root=calibration_store), host=host, port=port)
