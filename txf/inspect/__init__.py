"""Inside a trained model: capture, patch and ablate its named intermediates, and the logit lens.

``capture(run, batch, names)``, ``patch(run, batch, {name: value or fn})``, ``ablate(run, batch,
heads=[(module, head)], units=[(module, unit)], mode="zero"|"mean", reference=batch)`` and
``logit_lens(run, batch)`` over a run loaded with ``txf.inference.load_run`` (or any object with
``model_cfg`` and ``params``); ``list_points(run, batch)`` names the points with their shapes.
The names are txf.inspect.points'. ``txf inspect`` and ``txf ablate-heads`` serve them.
"""

from txf.inspect.operations import (ablate, ablation_masks, capture, lens_stack, list_points,
                                    logit_lens, num_layers, patch)
from txf.inspect.inputs import encode_text
from txf.inspect.points import Hooks, forward, hooked, inspect_config, inspect_params
