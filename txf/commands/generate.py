"""``txf generate --workdir runs/lm [--prompt "..."] [--max_new_tokens 200] [--temperature 0.8]
[--top_k 0] [--top_p 0.95] [--seed 0] [--num_samples 1] [--params ...]``.

Samples continuations from a decoder_lm run and prints prompt + continuation (each sample under a
``--- sample i`` header when there are several). Refuses other model families.
"""

from absl import flags

from txf import inference
from txf.errors import TxfError

flags.DEFINE_string("workdir", None, "run directory of a trained decoder_lm run", required=True)
flags.DEFINE_string("prompt", "", "text to continue (empty: sample from the start)")
flags.DEFINE_string("params", None, "parameter file in the workdir (default params.msgpack), e.g. "
                    "params_avg5.msgpack from `txf average-checkpoints`, or a path")
flags.DEFINE_integer("max_new_tokens", 200, "most tokens to generate (lowered to fit the context "
                     "the model was trained on, data.max_target_len)")
flags.DEFINE_float("temperature", 0.8, "softmax temperature (0 = greedy)")
flags.DEFINE_integer("top_k", 0, "sample among the k most likely tokens (0 = off)")
flags.DEFINE_float("top_p", 0.95, "nucleus sampling: the smallest set with this much mass (1 = off)")
flags.DEFINE_integer("seed", 0, "random seed")
flags.DEFINE_integer("num_samples", 1, "how many continuations to sample")


def main(argv):
  if len(argv) > 1:
    raise TxfError(f"unexpected arguments {argv[1:]}: quote the prompt, --prompt \"...\"")
  f = flags.FLAGS
  run = inference.load_run(f.workdir, f.params)
  inference.require_family(run, "decoder_lm", "generate")
  texts = inference.sample_texts(run, f.prompt, f.max_new_tokens, f.temperature, f.top_k, f.top_p,
                                    f.seed, f.num_samples)
  for i, text in enumerate(texts):
    if len(texts) > 1:
      print(f"--- sample {i + 1}")
    print(text, flush=True)
