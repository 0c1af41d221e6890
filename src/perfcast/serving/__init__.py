"""Serving: step cost model, engine policies, clients, simulator, search, silicon validation."""
