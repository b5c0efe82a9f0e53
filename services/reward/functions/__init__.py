"""Reward functions (the serving side): verifiers, text rewards, composites, pipelines, judge, code,
reward models.

Each module knows nothing of gRPC; the registry builds them from config specs. Nothing here imports
``services.reward.training`` or ``demo`` — what serving and training share about a reward-model
directory lives in ``rm_format``.
"""
