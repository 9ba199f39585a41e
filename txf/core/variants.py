"""Variant tables: for each kind of model variant, one table that lists its names and maps each
name to its formula (and, where a backend has its own, its kernels).

A table lives beside its formulas and is the one list of that kind's choices:

* feed-forward activations: ``txf.ops.feedforward.ACTIVATIONS`` (``model.activation``): dense
  f(z), and gated FFNs (``Gated(f)``: reglu, geglu, swiglu);
* position encodings: ``txf.nn.positional.POSITIONAL`` (``model.positional``; re-exported by
  ``txf.nn.layers``) and the sinusoid's
  column layouts ``txf.ops.positional.LAYOUTS`` (``model.positional_layout``);
* normalisation: ``txf.nn.layers.NORMS`` (``model.norm``) and QK-norm ``txf.nn.qk_norm.QK_NORMS``
  (``model.qk_norm``);
* attention: ``txf.kernels.attention.ATTENTION`` (the formula with its kernels; one entry, no config
  field yet) and the ways of running it ``txf.kernels.select.ATTENTION_IMPLS``
  (``model.attention_impl``);
* the output head: ``txf.nn.layers.HEADS`` (``model.tie_output``: tied or untied);
* recomputation in the backward pass: ``txf.nn.stack.REMAT`` (``model.remat``).
* the classifier's pooling: ``txf.models.encoder_classifier.POOLINGS`` (``model.pooling``).
* optimizers and learning-rate schedules: ``txf.train.optimizer.OPTIMIZERS`` (``optimizer.name``)
  and ``SCHEDULES`` (``optimizer.schedule``).

A table with a config field declares its names as that field's allowed values
(:func:`txf.core.config.declare_choices`) when it is built and whenever an entry is registered, so
``txf.core.config.validate`` checks the field against exactly the names the table can look up. Adding a
variant is its formula, one ``table.register(name, entry)`` line (or one line of the table's literal)
and its test.
"""

import contextlib
from typing import Any, Iterator, Mapping, Optional, Tuple

from txf.core import config


class UnknownVariant(KeyError, ValueError):
  """A name that a variant table does not hold; the message lists the names it does."""

  def __str__(self) -> str:
    return str(self.args[0])


class Table(Mapping):
  """An ordered, read-only name -> entry mapping of one kind of variant, extended by
  :meth:`register`.

  Args:
    key: the config field (dotted path, e.g. "model.activation") whose allowed values are this
      table's names, or None for a kind without a config field.
    entries: the initial {name: entry}, in the order the names are listed.
    also: names the config also accepts that are no entry of their own (e.g. "auto", resolved to an
      entry by the caller, or "none"); listed first, before the entries' names.
  """

  def __init__(self, key: Optional[str], entries: Mapping[str, Any] = (), *,
               also: Tuple[str, ...] = ()):
    self.key, self.also = key, tuple(also)
    self._entries = dict(entries)
    self._declare()

  def _declare(self) -> None:
    if self.key is not None:
      config.declare_choices(self.key, self.names())

  def names(self) -> Tuple[str, ...]:
    """Every name the config field accepts: ``also``, then the entries' names."""
    return self.also + tuple(self._entries)

  def register(self, name: str, entry: Any) -> Any:
    """Add ``entry`` under the new ``name`` (which then becomes an allowed value of the config
    field); returns ``entry``. Raises ValueError for a name the table already has."""
    if name in self.names():
      raise ValueError(f"{self.key or 'variant'} {name!r} is already registered")
    self._entries[name] = entry
    self._declare()
    return entry

  def unregister(self, name: str) -> None:
    """Remove the entry ``name`` (and its name from the config's allowed values)."""
    del self._entries[name]
    self._declare()

  @contextlib.contextmanager
  def registered(self, name: str, entry: Any) -> Iterator[Any]:
    """Within the block the table holds ``entry`` under ``name`` (a test's toy variant)."""
    self.register(name, entry)
    try:
      yield entry
    finally:
      self.unregister(name)

  def __getitem__(self, name: str) -> Any:
    try:
      return self._entries[name]
    except KeyError:
      raise UnknownVariant(f"{self.key or 'variant'}={name!r} is not one of {self.names()}") from None

  def __iter__(self):
    return iter(self._entries)

  def __len__(self) -> int:
    return len(self._entries)

  def __repr__(self) -> str:
    return f"Table({self.key!r}, names={self.names()})"
