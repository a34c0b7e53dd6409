"""Torch-side helpers shared by the probe and the replay: which modules are layers, gradient norms.

They hold no state of a run and import nothing else of nnwatch, so the probe (live) and the
diagnosis (replay of a snapshot) measure a model the same way.
"""
