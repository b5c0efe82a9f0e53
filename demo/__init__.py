"""The CPU demo: a synthetic arithmetic task, a tiny causal LM that brorl creates itself,
its supervised warm-start and its evaluation. Depends on torch/transformers; the services
only ever see the model directory it writes (Hugging Face format)."""
