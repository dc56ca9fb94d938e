"""The round's pure core: ``decide`` and ``evolve``, and the read model they build.

``decide(state, command, now_ms)`` answers what a command or the passing of time does to a
round: the events it causes (none when it does nothing). ``evolve(state, event)`` folds one
event into the round's state. Neither does I/O nor reads a clock (``now_ms`` is an argument).
In production ``evolve`` and ``view.py`` answer GetRound, ListRounds and WatchTable from the state folded
out of a round's events, and the settlement event is built here (``settlement.py``); the
running machines (``round_base.py`` and its shapes) still decide their phases themselves, so
``decide`` is the executable specification of a round, held by the Hypothesis tests
(tests/table/test_round_core.py), not yet the code the machines call. The import contract
``pure-round-core`` (pyproject.toml) keeps the store, the ports, the clock and the metrics out
of this package.
"""
