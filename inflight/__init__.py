"""inflight"""
