"""reward_server"""
