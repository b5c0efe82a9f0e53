"""The Countdown task (issue 23): ``task`` (problems, labels, splits, the demonstrator),
``solver`` (the exact solver) and ``warmstart`` (the supervised warm-start and its pass@k)."""
