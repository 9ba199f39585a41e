"""WMT14 English -> German with a 1.0B-parameter Transformer: a model that needs a mesh.

NEEDS A DOWNLOAD AND ACCELERATORS (data as experiments/wmt14_en_de_base.py). d_model 2048, 8+8
layers, d_ff 8192, 16 heads, 32k shared vocabulary: 1.005B parameters. It is the big config
(experiments/wmt14_en_de_big.py) made wider and deeper, with bf16 compute and FSDP. Its float32 parameters and
Adam moments alone are 12 GB, 16 GB with the gradients: it cannot train on one 16 GB device.
With FSDP over 64 devices (``mesh_shape=(1, -1, 1)``) each holds 1/64 of them; size it first:

  txf plan --config experiments/wmt14_en_de_1b.py --devices 64

(The wider 24+24-layer variant, ``--config.model.num_encoder_layers=24
--config.model.num_decoder_layers=24``, has 2.9B parameters.) Not tuned: a sizing example, with the
big model's recipe.
"""

from txf.core.config import load_experiment


def get_config():
  config = load_experiment("wmt14_en_de_big")
  config.name = "wmt14_en_de_1b"             # workdir defaults to runs/wmt14_en_de_1b
  config.parallelism = "mesh"                # jit over a device mesh ...
  config.mesh_shape = (1, -1, 1)             # ... FSDP over every device: params and Adam state sharded 1/N
  config.model.d_model = 2048                # big: 1024
  config.model.d_ff = 8192                   # big: 4096
  config.model.num_encoder_layers = 8        # big: 6
  config.model.num_decoder_layers = 8
  config.model.dtype = "bfloat16"            # bf16 compute, float32 parameters and Adam state
  config.optimizer.warmup_steps = 8000       # a longer warmup for the deeper, wider model
  config.data.tokens_per_batch = 65536       # 256 rows of 256 pieces: rows divide over 64 devices
  return config
