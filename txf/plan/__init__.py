"""Sizing a job before launch (``txf plan``): compile its init and train step on a device mesh,
never run them, and read memory and FLOPs (``sizing``); TPU slices from a CPU host (``topology``)."""

from txf.plan import topology
from txf.plan.sizing import batch_shape, format_plan, plan
