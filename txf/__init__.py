"""txf: the Transformer of "Attention Is All You Need" as pure JAX functions and Flax modules.

Layers (who may import whom): ``ops`` (pure jnp math) <- ``nn`` (Flax modules) <- ``models``;
``decode`` knows only a ``logits_fn(ids, cache)`` callback; ``data`` knows no model; ``parallel``
wraps any step function; ``train`` joins them; ``cli`` wires everything.
"""

__version__ = "0.1.0"
