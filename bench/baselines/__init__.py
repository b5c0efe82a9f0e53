"""What bench/e2e.py compares the pipeline with: the rollout as its workers run it, alone."""
