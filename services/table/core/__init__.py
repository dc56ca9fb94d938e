"""The round's pure core: ``decide`` and ``evolve``, and the read model they build.

``decide(state, command, now_ms)`` answers what a command or the passing of time does to a
round: the events it causes (none when it does nothing). ``evolve(state, event)`` folds one
event into the round's state. Neither does I/O nor reads a clock (``now_ms`` is an argument).

The running machines (``round_base.py`` and its shapes, driven by ``runner.py``) are load ->
decide -> save: a step loads the round's state under its row lock (its events folded with
``evolve``, its bets as the store holds them, the sealed deck or grabs and the next reveal's
time from its rows), asks ``decide`` with a ``Tick`` or the command, and saves exactly the
events it returned with the rows they change, in one transaction. Every phase transition of a
live round is decided here: closing bidding and betting, the deal and the envelope (the rng's
answer given as ``Deal``, ``Split`` or ``RngFailed``), each reveal, the settlement (the
wallet's hold check and the jackpot pool's balance given as ``Settle``) and every void (``Void``
for CloseTable and a dealer's hold the wallet does not cover). Not yet through ``decide``: the
round's opening (``RoundOpened``, with the rng's commitment and the banker seat), the players'
commands (bets, cancels, changes and bids are admitted and recorded by ``bets.py``,
``envelope_commands.py`` and ``recording.py``; ``PlaceBet``, ``CancelBet``, ``ChangeBet`` and
``PlaceBid`` state the same rules for the Hypothesis tests, tests/table/test_round_core.py), the
seed reveal after the round, and an operator's void of a settled round (``void_rejected``,
which uses ``decide.voided``). ``evolve`` and ``view.py`` also answer GetRound, ListRounds and WatchTable,
and the settlement event is built here (``settlement.py``). The import contract
``pure-round-core`` (pyproject.toml) keeps the store, the ports, the clock and the metrics out
of this package.
"""
