"""Benchmarks that print figures (speed, memory); never timed tests."""
