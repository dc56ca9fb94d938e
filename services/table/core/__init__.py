"""The round's pure core: ``decide`` and ``evolve``, and the read model they build.

``decide(state, command, now_ms)`` answers what a command or the passing of time does to a
round: the events it causes (none when it does nothing). ``evolve(state, event)`` folds one
event into the round's state. Neither does I/O nor reads a clock (``now_ms`` is an argument):
the machines around them load a round, decide, and save what was decided (``round_base.py``),
and the servicer answers GetRound and ListRounds from the state ``evolve`` folds out of a
round's events (``view.py``). The import contract ``pure-round-core`` (pyproject.toml) keeps
the store, the ports, the clock and the metrics out of this package.
"""
