"""What bench/e2e.py reads of a pipeline run: its per-step metrics (steps.py)."""
