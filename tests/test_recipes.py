"""The recipes of docs/extending.md, each done as the page says: a plugin file written into
a temporary folder, then the run through the ordinary entry points (``txf train`` and the serving
command; for a Hugging Face architecture ``txf import-hf``, the serving command and ``txf export-hf``:
the ``slow`` tier). Each recipe's files go into one folder (``mine``), and the test checks that
they are exactly the files its section of the page names in its "Files:" line, and that each
plugin is the page's code block, character for character.

Each plugin registers into a process-wide table, so every test takes its names out again."""

import json
import os
import re
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txf.core import config as config_lib, families, formats
from txf.data import builders
from txf.decode import DecodingSpec, decoders
from txf.kernels.attention import ATTENTION
from txf.nn.layers import NORMS
from txf.ops.feedforward import ACTIVATIONS

# the tiny translation run every recipe trains (synthetic data unless the recipe is the data)
TINY = ["--config", "default", "--progress=false", "--config.model.d_model=16",
        "--config.model.num_heads=2", "--config.model.d_ff=32", "--config.model.num_encoder_layers=1",
        "--config.model.num_decoder_layers=1", "--config.batch_size=8", "--config.num_train_steps=3",
        "--config.log_every=1", "--config.eval_every=0", "--config.checkpoint_every=0",
        "--config.decode_examples=0", "--config.eval_batches=1", "--config.optimizer.warmup_steps=2"]


PAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                    "extending.md")
FILE_NAME = re.compile(r"`((?:[\w.-]+/)*[\w-]+\.(?:py|jsonl|json|txt|safetensors))`")


def page_sections():
  """{heading: text} of the page's ``## `` sections."""
  with open(PAGE, encoding="utf-8") as f:
    parts = re.split(r"^## (.+)$", f.read(), flags=re.M)
  return dict(zip(parts[1::2], parts[2::2]))


def page_files(heading: str) -> list:
  """The files the reader writes for the recipe ``heading``: the file names of its "Files:"
  paragraph, up to "Inside txf" (what a change inside txf would touch instead)."""
  text = page_sections()[heading]
  paragraph = text[text.index("Files:"):].split("\n\n", 1)[0].split("Inside txf", 1)[0]
  return sorted(FILE_NAME.findall(paragraph))


def written(folder) -> list:
  """Every file under ``folder``, relative to it."""
  return sorted(os.path.relpath(os.path.join(d, n), str(folder)).replace(os.sep, "/")
                for d, _, names in os.walk(str(folder)) for n in names)


def write(folder, name: str, text: str) -> str:
  """Write ``folder/name`` (dedented; the folders made) and return its path."""
  path = os.path.join(str(folder), name)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    f.write(textwrap.dedent(text).lstrip())
  return path


@pytest.fixture
def mine(tmp_path):
  """The folder of the files a recipe's reader writes (its plugin, its data)."""
  return tmp_path / "mine"


def load(path: str):
  """Import a plugin file as ``txf train --config.plugins=PATH`` does."""
  families.import_plugins(os.path.abspath(path))


def train_and_translate(txf_cli, tmp_path, *overrides, lines=("s1 s2 s3",)):
  """``txf train`` (TINY plus ``overrides``) and ``txf translate`` of ``lines``: the stdout."""
  workdir = str(tmp_path / "run")
  trained = txf_cli("train", *TINY, "--workdir", workdir, *overrides)
  assert trained.returncode == 0, trained.stderr[-3000:]
  (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
  served = txf_cli("translate", "--workdir", workdir, "--input", str(tmp_path / "in.txt"))
  assert served.returncode == 0, served.stderr[-3000:]
  assert len(served.stdout.splitlines()) == len(lines)
  return workdir, served.stdout


# ----------------------------------------------------------------------------- a local data format

JSONL_PLUGIN = '''
    # my_jsonl.py: JSON lines {"src": ..., "tgt": ...} as parallel text
    import json
    from txf.core import formats
    from txf.core.errors import TxfError

    def read_jsonl(files, spec):
      records = []
      with open(files[0], encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
          if not line.strip():
            continue
          try:
            row = json.loads(line)
            records.append({"source": row["src"], "target": row["tgt"]})
          except (ValueError, KeyError, TypeError) as e:
            raise TxfError(f"{files[0]}:{lineno}: not a JSON object with 'src' and 'tgt' ({e}): "
                           f"fix that line")
      return records, {"total": len(records)}

    formats.register("jsonl", formats.DataFormat(kind="parallel", reader=read_jsonl,
                                                 files="{split}.jsonl"))
'''


def write_jsonl_data(folder, pairs, bad_line: bool = False):
  os.makedirs(folder, exist_ok=True)
  for split in ("train", "val"):
    rows = [json.dumps({"src": s, "tgt": t}) for s, t in pairs]
    if bad_line and split == "train":
      rows.insert(1, '{"src": "no target"}')
    write(folder, f"{split}.jsonl", "\n".join(rows) + "\n")


JSONL = "A local data format read from a `jsonl` file"  # its section of the page


@pytest.fixture
def jsonl_plugin(mine):
  path = write(mine, "my_jsonl.py", JSONL_PLUGIN)
  yield path
  formats.unregister("jsonl")


def test_recipe_data_format_reads_jsonl_into_parallel_records(tmp_path, mine, jsonl_plugin):
  load(jsonl_plugin)
  assert "jsonl" in config_lib.allowed_values("data.format")
  pairs = [("a b c", "x y"), ("d e", "z w v")]
  write_jsonl_data(mine / "corpus", pairs)
  assert written(mine) == page_files(JSONL)
  spec = builders.local_spec(str(mine / "corpus"), "jsonl", ["train", "val", "test"], "en",
                             "de", 1000, 0.9)
  prepared = builders.prepare_local(str(mine / "corpus"), spec, str(tmp_path / "tfds"))
  got = [(r["source"].decode(), r["target"].decode()) for r in prepared.sources["train"]]
  assert got == pairs
  # a malformed line is one error naming the file and line
  write_jsonl_data(tmp_path / "bad", pairs, bad_line=True)
  spec = builders.local_spec(str(tmp_path / "bad"), "jsonl", ["train", "val", "test"], "en", "de",
                             1000, 0.9)
  with pytest.raises(Exception, match=r"train.jsonl:2: not a JSON object"):
    builders.prepare_local(str(tmp_path / "bad"), spec, str(tmp_path / "tfds"))


@pytest.mark.slow
def test_recipe_data_format_jsonl_trains_and_translates(tmp_path, mine, txf_cli, jsonl_plugin):
  rng = np.random.default_rng(0)
  words = [f"w{i}" for i in range(12)]
  pairs = [(" ".join(rng.choice(words, 4)), " ".join(rng.choice(words, 3))) for _ in range(40)]
  write_jsonl_data(mine / "corpus", pairs)
  assert written(mine) == page_files(JSONL)
  workdir, _ = train_and_translate(
      txf_cli, tmp_path, f"--config.plugins={jsonl_plugin}",
      f"--config.data.source=text:{mine / 'corpus'}", "--config.data.format=jsonl",
      "--config.data.tokenizer=char", f"--config.data.data_dir={tmp_path / 'tfds'}",
      "--config.data.test_split=val", lines=("w1 w2 w3",))
  assert json.load(open(os.path.join(workdir, "config.json")))["data"]["format"] == "jsonl"
  bad = txf_cli("train", *TINY, "--workdir", str(tmp_path / "bad"),
                f"--config.data.source=text:{mine / 'corpus'}", "--config.data.format=jsonl")
  # without the plugin the format is unknown: the config's error, exit 2
  assert bad.returncode == 2 and bad.stderr.startswith("txf: error: invalid config")
  assert "data.format='jsonl' is not one of" in bad.stderr


# ----------------------------------------------------------------------------- variants

ATTENTION_PLUGIN = '''
    # my_attention.py: attention over cosine similarities
    import jax, jax.numpy as jnp
    from txf.kernels.attention import ATTENTION, Attention

    def cosine_attention(q, k, v, mask, tau=10.0):
      unit = lambda t: t / jnp.linalg.norm(t, axis=-1, keepdims=True)
      logits = tau * jnp.einsum("bhqd,bhkd->bhqk", unit(q), unit(k))
      weights = jax.nn.softmax(jnp.where(mask, logits, -1e30), axis=-1)
      return weights @ v, weights

    ATTENTION.register("cosine", Attention(cosine_attention))
'''

ACTIVATION_PLUGIN = '''
    # my_activation.py: the squared ReLU (Primer)
    import jax.numpy as jnp
    from txf.ops.feedforward import ACTIVATIONS

    def squared_relu(z):
      return jnp.square(jnp.maximum(z, 0.0))

    ACTIVATIONS.register("squared_relu", squared_relu)
'''

NORM_PLUGIN = '''
    # my_norm.py: a norm that only scales by a learned gain (no statistics)
    import jax.numpy as jnp
    from txf.nn.layers import NORMS

    def gain_only(module, cfg, x):
      gain = module.param("scale", lambda key, shape: jnp.ones(shape), (x.shape[-1],))
      return x * gain

    NORMS.register("gain_only", gain_only)
'''

VARIANTS = {  # recipe: (plugin file, its text, table, name, config field, its section of the page)
    "attention": ("my_attention.py", ATTENTION_PLUGIN, ATTENTION, "cosine", "model.attention",
                  "An attention formula"),
    "activation": ("my_activation.py", ACTIVATION_PLUGIN, ACTIVATIONS, "squared_relu",
                   "model.activation", "An activation"),
    "norm": ("my_norm.py", NORM_PLUGIN, NORMS, "gain_only", "model.norm", "A norm"),
}


@pytest.fixture(params=sorted(VARIANTS))
def variant(request, mine):
  filename, text, table, name, field, heading = VARIANTS[request.param]
  path = write(mine, filename, text)
  assert written(mine) == page_files(heading)
  yield path, table, name, field
  if name in table:
    table.unregister(name)


def test_recipe_variant_is_validated_and_computes_its_formula(variant):
  path, table, name, field = variant
  cfg = config_lib.base_config()
  section, leaf = field.split(".")
  cfg[section][leaf] = name
  with pytest.raises(config_lib.ConfigError, match=f"{field}='{name}' is not one of"):
    config_lib.validate(cfg)
  cfg.plugins = path          # validate imports the plugin: the name is then allowed
  config_lib.validate(cfg)
  entry = table[name]
  x = np.random.default_rng(0).normal(size=(2, 3, 4, 8)).astype(np.float32)
  if name == "cosine":
    mask = np.tril(np.ones((4, 4), bool))[None, None]
    out, w = entry.formula(jnp.asarray(x), jnp.asarray(x), jnp.asarray(x), jnp.asarray(mask))
    unit = x / np.linalg.norm(x, axis=-1, keepdims=True)
    logits = np.where(mask, 10.0 * unit @ np.swapaxes(unit, -1, -2), -np.inf)
    ref = np.exp(logits - logits.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    np.testing.assert_allclose(np.asarray(w), ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(out), ref @ x, rtol=1e-5, atol=1e-5)
  elif name == "squared_relu":
    np.testing.assert_allclose(np.asarray(entry(jnp.asarray(x))), np.maximum(x, 0) ** 2)


@pytest.mark.slow
def test_recipe_variant_trains_and_translates(variant, tmp_path, txf_cli):
  path, _, name, field = variant
  workdir, _ = train_and_translate(txf_cli, tmp_path, f"--config.plugins={path}",
                                   f"--config.{field}={name}")
  section, leaf = field.split(".")
  assert json.load(open(os.path.join(workdir, "config.json")))[section][leaf] == name


# ----------------------------------------------------------------------------- a decoding strategy

DECODING_PLUGIN = '''
    # my_search.py: greedy search that never repeats the token it just emitted
    import dataclasses
    import jax.numpy as jnp
    from txf.decode import DecodingSpec, decoders, greedy_decode

    @dataclasses.dataclass(frozen=True)
    class NoRepeatSpec(DecodingSpec):
      repeat_penalty: float = 1e9       # the new spec field: subtracted from the last token's logit

      @property
      def strategy(self):
        return "no_repeat"

    def no_repeat_search(logits_fn, cache, rows, max_len, spec, *, bos_id, never_ids):
      def penalised(ids, cache):
        logits, cache = logits_fn(ids, cache)
        last = ids[:, -1]
        hit = jnp.arange(logits.shape[-1])[None, :] == last[:, None]
        return jnp.where(hit, logits - spec.repeat_penalty, logits), cache
      return greedy_decode(penalised, cache, rows, max_len, bos_id=bos_id, never_ids=never_ids)

    decoders.SEARCHES["no_repeat"] = no_repeat_search
'''


def test_recipe_decoding_strategy_gets_its_spec_field(mine):
  path = write(mine, "my_search.py", DECODING_PLUGIN)
  assert written(mine) == page_files("A decoding strategy with a new spec field")
  load(path)
  try:
    import txf_plugin_my_search as plugin  # pylint: disable=import-outside-toplevel,import-error
    spec = plugin.NoRepeatSpec.from_config(config_lib.base_config(), max_extra=5)
    spec = spec.replace(repeat_penalty=3.5)
    kept = spec.search_settings()     # the compiled search's key keeps the new field
    assert type(kept) is plugin.NoRepeatSpec and kept.repeat_penalty == 3.5
    assert kept.max_extra == DecodingSpec().max_extra   # batch shaping is not the search's
    seen = {}

    def spy(logits_fn, cache, rows, max_len, spec, **kwargs):
      seen["penalty"] = spec.repeat_penalty
      return plugin.no_repeat_search(logits_fn, cache, rows, max_len, spec, **kwargs)

    decoders.SEARCHES["no_repeat"] = spy
    from txf.models import init_params, model_config_for  # pylint: disable=import-outside-toplevel
    cfg = config_lib.base_config()
    cfg.model.update(d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1, num_decoder_layers=1)
    model_cfg = model_config_for(cfg, vocab_size=8)
    batch = {"inputs": jnp.ones((1, 4), jnp.int32), "targets": jnp.ones((1, 4), jnp.int32)}
    params = init_params(model_cfg, jax.random.key(0), batch)
    sources = [np.array([4, 5, 6, 2], np.int32)]
    ids = decoders.translate_ids(model_cfg, params, sources, 4, 8, spec, batch_size=1)
    assert seen["penalty"] == 3.5
    assert all(a != b for a, b in zip(ids[0][:-1], ids[0][1:]) if a != 2), ids
  finally:
    decoders.SEARCHES.pop("no_repeat", None)


# ----------------------------------------------------------------------------- the page itself

def test_each_plugin_is_the_pages_code_block_as_written():
  from tests.test_recipe_families import FAMILY_PLUGIN, LOSS_PLUGIN  # pylint: disable=import-outside-toplevel
  from tests.test_recipe_hf import HF_PLUGIN  # pylint: disable=import-outside-toplevel
  plugins = {"my_jsonl.py": JSONL_PLUGIN, "my_attention.py": ATTENTION_PLUGIN,
             "my_activation.py": ACTIVATION_PLUGIN, "my_norm.py": NORM_PLUGIN,
             "my_search.py": DECODING_PLUGIN, "my_family.py": FAMILY_PLUGIN,
             "my_loss.py": LOSS_PLUGIN, "my_hf_arch.py": HF_PLUGIN}
  with open(PAGE, encoding="utf-8") as f:
    blocks = re.findall(r"^```python\n(.*?)^```", f.read(), flags=re.M | re.S)
  shown = {re.match(r"# (\w+\.py):", b).group(1): b for b in blocks if re.match(r"# \w+\.py:", b)}
  assert sorted(shown) == sorted(plugins)
  for name, text in plugins.items():
    assert shown[name] == textwrap.dedent(text).lstrip(), f"docs/extending.md's {name} differs from the test's"
  # every recipe names its files; each is one of the plugins above or the data a test writes
  for heading in ("A model family", "An attention formula", "An activation", "A norm",
                  "A decoding strategy with a new spec field", JSONL, "A loss",
                  "A Hugging Face architecture"):
    files = page_files(heading)
    assert files and [f for f in files if f.endswith(".py")][0] in plugins, heading
