"""Every variant table of a run, imported by name: what ``txf.core.config.validate`` checks the
config's fields against.

The tables live beside their formulas (ops, kernels, nn, models, the optimizer) and declare their
names as the allowed values of their config fields when they are built (``txf.core.variants``).
``txf.core.config`` is below all of them and imports none; a caller that validates a config before
it builds anything (``txf plan``, a sweep's grid) calls :func:`validate` here, so the dependency is
an import the contract sees, not a side effect.
"""

from typing import Optional

import ml_collections

from txf.core import config as config_lib
from txf.kernels.attention import ATTENTION
from txf.kernels.select import ATTENTION_IMPLS
from txf.models.encoder_classifier import POOLINGS
from txf.nn.layers import NORMS
from txf.nn.positional import POSITIONAL
from txf.nn.qk_norm import QK_NORMS
from txf.nn.stack import REMAT
from txf.ops.feedforward import ACTIVATIONS
from txf.ops.positional import LAYOUTS
from txf.train.optimizer import OPTIMIZERS, SCHEDULES

# The tables with a config field, each the one list of that field's allowed values.
TABLES = (ACTIVATIONS, LAYOUTS, POSITIONAL, NORMS, QK_NORMS, ATTENTION, ATTENTION_IMPLS, REMAT,
          POOLINGS, OPTIMIZERS, SCHEDULES)


def validate(cfg: ml_collections.ConfigDict, data_lengths: Optional[dict] = None) -> None:
  """``txf.core.config.validate(cfg, data_lengths)`` with every table of ``TABLES`` declared."""
  config_lib.validate(cfg, data_lengths)
