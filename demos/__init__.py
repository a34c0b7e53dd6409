"""The nnwatch demos: short training scripts, each with one real problem for nnwatch to catch.

Run one with ``nnwatch demo NAME`` or ``python demos/NAME.py``; ``nnwatch demo --list`` describes
them. The package is installed as ``nnwatch.demos`` (``nnwatch/demos`` links here), so that
``nnwatch demo`` finds the scripts in a wheel as well as in a checkout.
"""
