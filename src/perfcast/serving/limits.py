"""How much one simulation may do unless asked for more (imports nothing heavy: the CLI
reads it to write its help)."""

from __future__ import annotations

from perfcast.core.errors import ConfigError

# Requests one simulation may issue without `--allow-long-run`: 50,000 requests of
# Qwen3-8B (1024 in, 128 out, C=5000) simulate in about 8 s on one core; ten times that
# takes minutes, which is more often a typo (`--concurrency 1000000`) than a wish.
MAX_SIMULATED_REQUESTS = 100_000


def check_request_count(requests: int, field: str, allow: bool) -> None:
    """Refuse simulations of more than MAX_SIMULATED_REQUESTS requests unless allowed."""
    if requests > MAX_SIMULATED_REQUESTS and not allow:
        raise ConfigError(f"asks for {requests:,} simulated requests", field=field,
                          expected=f"at most {MAX_SIMULATED_REQUESTS:,} (more takes minutes "
                                   "to simulate), or --allow-long-run")
