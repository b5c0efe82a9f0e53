"""Reward-model training (``python -m services.reward.training.rm_train``) and preference-data
generation (``python -m services.reward.training.prefgen``). Offline tools: the service never
imports this package.
"""
