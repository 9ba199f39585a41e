"""The planning page's ``txf plan`` table against ``txf plan --json``: published figures come from the command.

Each row of the table of docs/planning.md (before "The real topology") names a model and a device count; ``ROW_ARGS``
says which ``txf plan`` command gives it. The test plans the rows that compile in seconds on a CPU
and compares every column: parameter and Adam bytes to 1%, XLA's temporaries and peak to
``TOLERANCE``, TFLOP/step to 1%. The rows whose compile takes minutes are checked by hand with

    python -m tests.test_readme_plan_table            # prints every row as the page should read

which runs each row's command and prints the table rows to paste (on a quiet machine: minutes).
"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOLERANCE = 0.10  # temporaries and peak: XLA's CPU compiler schedules a little differently by version
FSDP = ["--config.parallelism=mesh", "--config.mesh_shape=(1,-1,1)", "--config.data.tokens_per_batch=32768"]
ROW_ARGS = {  # model -> txf plan arguments of its rows (the devices are the row's)
    "base": ["--config", "experiments/wmt14_en_de_base.py", *FSDP],
    "big": ["--config", "experiments/wmt14_en_de_big.py", *FSDP],
    "1b": ["--config", "experiments/wmt14_en_de_1b.py"],
}
CHEAP_ROWS = [("base", 8)]  # compiled by the test; the others take minutes
PAGE = "docs/planning.md"


def readme_rows():
  """{(model, devices): {column: text}} of the planning page's plan table."""
  with open(os.path.join(ROOT, PAGE), encoding="utf-8") as f:
    text = f.read()
  header = "| model | params | devices | mesh (data, fsdp, tensor) |"
  lines = text[text.index(header):].splitlines()
  columns = [c.strip() for c in lines[0].strip("|").split("|")]
  rows = {}
  for line in lines[2:]:
    if not line.startswith("|"):
      break
    cells = dict(zip(columns, (c.strip() for c in line.strip("|").split("|"))))
    rows[(cells["model"], int(cells["devices"]))] = cells
  return rows


def size_bytes(text):
  number, unit = text.split()
  return float(number) * {"KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30}[unit]


def size_text(b):
  for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20)):
    if b >= scale:
      return f"{b / scale:.2f} {unit}" if unit == "GiB" else f"{b / scale:.1f} {unit}"
  return f"{b / 2 ** 10:.1f} KiB"


def plan(model, devices, tmp_dir):
  out = os.path.join(tmp_dir, f"{model}_{devices}.json")
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  env.pop("TXF_PLAN_FAKE_DEVICES", None)
  r = subprocess.run([sys.executable, "-m", "txf.cli", "plan", *ROW_ARGS[model], "--devices",
                      str(devices), "--json", out], capture_output=True, text=True, timeout=1800,
                     cwd=ROOT, env=env)
  assert r.returncode == 0, r.stderr[-3000:]
  with open(out) as f:
    return json.load(f)


def row_text(model, p):
  """The page's row that plan JSON ``p`` gives."""
  b = p["batch"]
  return (f"| {model} | {p['params'] / 1e6:.1f}M | {p['devices']} | ({', '.join(map(str, p['mesh_shape']))}) | "
          f"{b['rows']} x {b['source_len']}/{b['target_len']} | {size_text(p['param_bytes_per_device'])} | "
          f"{size_text(p['opt_bytes_per_device'])} | {size_text(p['temp_bytes_per_device'])} | "
          f"{size_text(p['peak_bytes_per_device'])} | {p['flops_per_step'] / 1e12:.1f} |")


def test_every_row_of_the_table_has_its_command():
  rows = readme_rows()
  assert rows and all(model in ROW_ARGS for model, _ in rows), sorted(rows)
  assert all(row in rows for row in CHEAP_ROWS)


@pytest.mark.slow
@pytest.mark.parametrize("model,devices", CHEAP_ROWS)
def test_the_readme_plan_rows_are_what_txf_plan_prints(model, devices, tmp_path):
  cells = readme_rows()[(model, devices)]
  p = plan(model, devices, str(tmp_path))
  assert cells["params"] == f"{p['params'] / 1e6:.1f}M"
  assert cells["mesh (data, fsdp, tensor)"] == f"({', '.join(map(str, p['mesh_shape']))})"
  for column, key, tolerance in (("params/dev", "param_bytes_per_device", 0.01),
                                 ("Adam/dev", "opt_bytes_per_device", 0.01),
                                 ("temporaries/dev", "temp_bytes_per_device", TOLERANCE),
                                 ("peak/dev", "peak_bytes_per_device", TOLERANCE)):
    assert size_bytes(cells[column]) == pytest.approx(p[key], rel=tolerance), (column, row_text(model, p))
  assert float(cells["TFLOP/step"]) == pytest.approx(p["flops_per_step"] / 1e12, rel=0.01)


if __name__ == "__main__":
  import tempfile
  with tempfile.TemporaryDirectory() as d:
    for model, devices in readme_rows():
      print(row_text(model, plan(model, devices, d)), flush=True)
