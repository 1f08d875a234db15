"""rollout_worker"""
