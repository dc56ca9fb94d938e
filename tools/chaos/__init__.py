"""Fault injection: a TCP fault proxy and the niuniu-chaos command."""
