"""The math behind the rules: hand censuses, exact and Monte Carlo RTP, and the math reports.

Nothing a round needs lives here: the table, the ledger and the rest of the running
backend use ``bull.rules`` and ``bull.variants`` only (an import-linter contract keeps
``services`` and ``backbone`` from importing this package). The rules CLI
(``niuniu-rules``), the report generator (``python -m tools.rules.reports``), the
benchmarks and the tests do. Pure like the rest of ``bull``: a Monte Carlo takes its
generator as an argument, and a report is the same bytes on every run.
"""
