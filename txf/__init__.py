"""txf: the Transformer of "Attention Is All You Need" as pure JAX functions and Flax modules.

Rooms, bottom to top (each imports only from those below it; pyproject.toml's import-linter
contracts): ``ops`` (pure jnp math) <- ``nn`` (Flax modules; the KV cache layout, ``nn.kv_cache``)
<- ``models`` (the families, build/forward/loss) <- ``data`` (tasks, batches; knows no
model), ``parallel`` (runners; knows no model) <- ``decode`` (search algorithms that know only a
``logits_fn(ids, cache)`` callback, the model adapter that makes it, the compiled decoders) <-
``inference`` (load a run, evaluate) <- ``train`` <- ``commands`` / ``cli`` (the terminal).
The packages are imported on use: ``import txf`` alone loads no JAX.
"""

__version__ = "0.1.0"
