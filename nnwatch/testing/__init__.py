"""Scaffolding for nnwatch's own tests, benchmarks and screenshots, kept apart from the product.

- :mod:`~nnwatch.testing.synthetic`: a trainer without torch (``python -m nnwatch.testing.synthetic``):
  a real ring, command socket and run log, fed synthetic records at a set rate;
- :mod:`~nnwatch.testing.synthetic_job`: a many-rank job of such trainers on simulated hosts;
- :mod:`~nnwatch.testing.fixture`: a deterministic run source and recorded runs written to order;
- :mod:`~nnwatch.testing.tui`: driving the dashboard headless (fixed hardware, waiting for data).

Nothing in the product imports this package: the import contracts put it above the CLI.
"""
