"""Writes notebooks/NN_name.ipynb from notebooks/src/NN_name.py (outputs empty).

The sources use the "percent" cell format (as jupytext and VS Code read it): a line ``# %%`` starts
a code cell, ``# %% [markdown]`` a Markdown cell whose lines are comments (``# `` is stripped).
A source file also runs as a plain script (``python notebooks/src/01_math.py``).

  python notebooks/build_notebooks.py          # rebuild every notebook
  python notebooks/build_notebooks.py 02       # only those whose name starts with 02

Edit the source, rebuild, and commit both. Every notebook runs top to bottom on a CPU in minutes,
in well under a minute with TXF_NOTEBOOK_SMALL=1, and saves its figures as PNGs under
$TXF_NOTEBOOK_OUT (default: a temporary folder).
"""

import glob
import os
import sys
from typing import List, Tuple

import nbformat

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_percent(text: str) -> List[Tuple[str, str]]:
  """Percent-format source -> [("markdown" | "code", cell source), ...] (empty cells dropped)."""
  cells, kind, lines = [], None, []

  def flush():
    body = "\n".join(lines).strip("\n")
    if kind is not None and body.strip():
      cells.append((kind, body))

  for line in text.splitlines():
    if line.startswith("# %%"):
      flush()
      kind, lines = ("markdown" if "[markdown]" in line else "code"), []
    elif kind == "markdown":
      lines.append(line[2:] if line.startswith("# ") else line.lstrip("#"))
    elif kind == "code":
      lines.append(line)
  flush()
  return cells


def build(cells: List[Tuple[str, str]]) -> nbformat.NotebookNode:
  """Cells -> a v4 notebook on the ``python3`` kernel, no outputs, stable cell ids."""
  nb = nbformat.v4.new_notebook()
  nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
  nb.metadata["language_info"] = {"name": "python"}
  for i, (kind, source) in enumerate(cells):
    make = nbformat.v4.new_markdown_cell if kind == "markdown" else nbformat.v4.new_code_cell
    cell = make(source)
    cell["id"] = f"cell-{i:02d}"
    nb.cells.append(cell)
  nbformat.validate(nb)
  return nb


def main(argv: List[str]) -> None:
  prefixes = argv[1:] or [""]
  for src in sorted(glob.glob(os.path.join(HERE, "src", "[0-9][0-9]_*.py"))):
    name = os.path.basename(src)[:-3] + ".ipynb"
    if not any(name.startswith(p) for p in prefixes):
      continue
    with open(src, encoding="utf-8") as f:
      nb = build(parse_percent(f.read()))
    with open(os.path.join(HERE, name), "w", encoding="utf-8") as f:
      nbformat.write(nb, f)
    print("wrote", os.path.join(HERE, name))


if __name__ == "__main__":
  main(sys.argv)
