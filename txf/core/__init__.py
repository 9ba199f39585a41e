"""The bottom layer, without jax: errors, the run config (its defaults, rules and mesh arithmetic),
the model families, the variant tables and the pretraining objectives' lengths.

Everything above reads these; nothing here imports another txf layer.
"""
