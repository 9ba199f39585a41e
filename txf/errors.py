"""The one exception type for errors in what a user gave txf.

``TxfError`` (and its subclasses: ``ConfigError``, ``DataError``, ``RunConflictError``,
``NonFiniteLossError``, ...) means the input is at fault: a config that cannot work, a missing or
malformed file, an occupied workdir. ``txf`` prints such an error as one ``txf: error: ...`` line
naming the problem and the fix, and exits with status 2. Every other exception is a bug inside txf
and keeps its traceback. This module imports nothing, so every layer may raise it.
"""


class TxfError(Exception):
  """Bad input, found on purpose by txf: the message names the problem and the fix."""
