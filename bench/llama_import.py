"""Import and greedy-decode a Llama-shaped model of real size on this machine, beside transformers.

  python -m bench.llama_import                      # SmolLM2-135M's shape, 64 new tokens
  python -m bench.llama_import --new_tokens 32 --layers 4   # a quicker look

The model is SmolLM2-135M's config (hidden 576, 30 layers, 9 heads over 3 key/value heads,
intermediate 1536, vocabulary 49152, tied embeddings, rope_theta 100000) with random weights drawn
by transformers (``LlamaForCausalLM``, seed 0) and saved with ``save_pretrained`` into a
temporary folder (outside every timing). Then, each in a fresh process under ``/usr/bin/time -v``
(wall seconds and peak resident memory, the "Maximum resident set size"):

* ``txf import-hf DIR --workdir W`` (config check, safetensors read, permutation, params.msgpack);
* txf's greedy decode of one prompt of ids (``txf.inference.sample_prompts`` at temperature 0,
  what ``txf generate --temperature 0`` runs): timed once to compile and run, then again (the
  compiled program cached in the process): tokens/s = new tokens / the second run's seconds;
* transformers' ``generate(do_sample=False)`` of the same prompt from the same folder (torch,
  float32, its KV cache): one warm-up call, then the timed one.

It prints one table and whether the two greedy continuations agree token for token (random
weights give nearly flat logits, so a near-tie may break differently in float32).
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                    rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True,
                    bos_token_id=1, eos_token_id=2)
PROMPT = [1, 504, 3458, 282, 4390, 314, 253, 1345, 30, 378, 2356, 1250]

SAVE = """
import json, sys, torch, transformers
shape = json.loads(sys.argv[2])
torch.manual_seed(0)
model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape))
model.save_pretrained(sys.argv[1])
"""

TXF_DECODE = """
import json, sys, time
from txf.decode import DecodingSpec
from txf.inference import load_run, sample_prompts
workdir, prompt, new = sys.argv[1], sys.argv[2], int(sys.argv[3])
t0 = time.perf_counter()
run = load_run(workdir)
t1 = time.perf_counter()
greedy = DecodingSpec(temperature=0.0, top_k=0, top_p=1.0)
first = sample_prompts(run, [prompt], new, greedy)[0][0]
t2 = time.perf_counter()
again = sample_prompts(run, [prompt], new, greedy)[0][0]
t3 = time.perf_counter()
print(json.dumps({"load_s": t1 - t0, "first_s": t2 - t1, "decode_s": t3 - t2, "text": again}))
"""

HF_DECODE = """
import json, sys, time, torch, transformers
folder, prompt, new = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
if int(sys.argv[4]):
  torch.set_num_threads(int(sys.argv[4]))
t0 = time.perf_counter()
model = transformers.LlamaForCausalLM.from_pretrained(folder).eval()
t1 = time.perf_counter()
ids = torch.tensor([prompt])
kw = dict(attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new,
          min_new_tokens=new, pad_token_id=2)
with torch.no_grad():
  model.generate(ids, **kw)
  t2 = time.perf_counter()
  out = model.generate(ids, **kw)
  t3 = time.perf_counter()
print(json.dumps({"load_s": t1 - t0, "decode_s": t3 - t2, "ids": out[0, len(prompt):].tolist()}))
"""


def timed(args, env):
  """(stdout, wall seconds, peak RSS in MiB) of ``/usr/bin/time -v ARGS``."""
  proc = subprocess.run(["/usr/bin/time", "-v", *args], capture_output=True, text=True, env=env,
                        cwd=ROOT)
  if proc.returncode:
    raise RuntimeError(f"{' '.join(args[:4])} failed:\n{proc.stderr[-3000:]}")
  peak = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr).group(1))
  wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", proc.stderr).group(1)
  seconds = sum(float(p) * 60 ** i for i, p in enumerate(reversed(wall.split(":"))))
  return proc.stdout, seconds, peak / 1024


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--new_tokens", type=int, default=64)
  parser.add_argument("--layers", type=int, default=SMOLLM2_135M["num_hidden_layers"])
  parser.add_argument("--torch_threads", type=int, default=0,
                      help="torch.set_num_threads for transformers (0: torch's default, the cores)")
  args = parser.parse_args(argv)
  shape = {**SMOLLM2_135M, "num_hidden_layers": args.layers}
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  with tempfile.TemporaryDirectory(prefix="bench-llama-") as tmp:
    folder, workdir = os.path.join(tmp, "hf"), os.path.join(tmp, "txf")
    subprocess.run([sys.executable, "-c", SAVE, folder, json.dumps(shape)], check=True, env=env,
                   capture_output=True)
    size = os.path.getsize(os.path.join(folder, "model.safetensors")) / 2 ** 20
    _, import_s, import_mib = timed([sys.executable, "-m", "txf.cli", "import-hf", folder,
                                     "--workdir", workdir, "--max_len", "256"], env)
    prompt = " ".join(map(str, PROMPT))
    out, txf_wall, txf_mib = timed([sys.executable, "-c", TXF_DECODE, workdir, prompt,
                                    str(args.new_tokens)], env)
    ours = json.loads(out.strip().splitlines()[-1])
    out, hf_wall, hf_mib = timed([sys.executable, "-c", HF_DECODE, folder, json.dumps(PROMPT),
                                  str(args.new_tokens), str(args.torch_threads)], env)
    theirs = json.loads(out.strip().splitlines()[-1])
  our_ids = [int(t) for t in ours["text"].split()][len(PROMPT):]
  same = sum(a == b for a, b in zip(our_ids, theirs["ids"]))
  first_diff = next((i for i, (a, b) in enumerate(zip(our_ids, theirs["ids"])) if a != b), None)
  n = args.new_tokens
  print(f"model: Llama, {args.layers} layers of SmolLM2-135M's shape, random weights; "
        f"model.safetensors {size:.0f} MiB; prompt {len(PROMPT)} ids, {n} new tokens greedy")
  print(f"{'':34} {'wall s':>8} {'peak MiB':>9} {'tokens/s':>9}")
  print(f"{'txf import-hf':34} {import_s:8.1f} {import_mib:9.0f} {'':>9}")
  print(f"{'txf greedy decode (process)':34} {txf_wall:8.1f} {txf_mib:9.0f} {'':>9}")
  print(f"{'  load_run':34} {ours['load_s']:8.2f}")
  print(f"{'  first call (compile + decode)':34} {ours['first_s']:8.2f}")
  print(f"{'  second call (decode)':34} {ours['decode_s']:8.2f} {'':>9} {n / ours['decode_s']:9.1f}")
  print(f"{'transformers generate (process)':34} {hf_wall:8.1f} {hf_mib:9.0f}")
  print(f"{'  from_pretrained':34} {theirs['load_s']:8.2f}")
  print(f"{'  second generate call':34} {theirs['decode_s']:8.2f} {'':>9} {n / theirs['decode_s']:9.1f}")
  print(f"(torch threads: {args.torch_threads or 'default'}; load average "
        f"{os.getloadavg()[0]:.1f} at the end)")
  print(f"greedy ids: {same}/{n} equal"
        + ("" if first_diff is None else f" (first difference at new token {first_diff})"))


if __name__ == "__main__":
  main()
