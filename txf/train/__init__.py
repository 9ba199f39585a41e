"""Training: the pure train step (``steps``), optimizer and schedules (``optimizer``), the loop's
phases (``loop``), its log window (``logs``) and when it stops early (``stopping``).

``train(config, workdir, loss_fn=None, model=None)`` is the public entry point.
"""

from txf.train.loop import train
from txf.train.steps import TrainState, create_train_state, make_train_step
from txf.train.stopping import NonFiniteLossError
