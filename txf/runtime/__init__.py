"""The process and its files: process set-up (``process``: XLA flags, tcmalloc, quiet logging),
the machine's description, the supervising parent of a multi-process job, agreement between
processes, the compilation and program caches with their fingerprint, storage (local or cloud
paths) and the run directory's files (``workdir``).

Above ``txf.core`` only; the model, data and training layers build on it.
"""
