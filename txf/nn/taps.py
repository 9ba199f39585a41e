"""Named points inside a module's forward that the inspection tools (txf.inspect) read or replace.

``tap(self, name, x)`` returns ``x`` unchanged. Assigned as a method of a Flax module
(``tap = taps.tap`` in its class body) it becomes a wrapped module method, so that
``flax.linen.intercept_methods`` sees each call with the module, the point's name and the value,
and may hand back another value. Without an interceptor it adds nothing to the traced program.
"""


def tap(self, name: str, x):
  """Identity: ``x`` (any array) at the point ``name`` of this module's forward."""
  del self, name
  return x
