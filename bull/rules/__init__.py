"""The rules of the four Niu Niu variants: pure functions over frozen values.

Nothing in this package does I/O, reads a clock or draws randomness: the deck
order, the envelope amounts and the configuration arrive as arguments, so any
round can be recomputed by an auditor from its events alone. Only what a round needs
is here; the census, RTP and math reports built on it are in ``bull.analysis``.
"""
