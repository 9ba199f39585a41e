"""The layout page (docs/layout.md) is the import contract: its table lists, top to bottom, the
layers of pyproject.toml's first ``layers`` contract with their folders, every folder of txf/ is
in it, every folder it names exists, and no module but ``__init__.py`` and ``cli.py`` (and at most
one more) stands loose in txf/."""

import glob
import os
import re
import tomllib

from tests.conftest import ROOT


def _contract_layers():
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    contracts = tomllib.load(f)["tool"]["importlinter"]["contracts"]
  main = next(c for c in contracts if c["type"] == "layers" and "containers" not in c)
  return [sorted(part.strip().removeprefix("txf.") for part in layer.split("|"))
          for layer in main["layers"]]


def _page_layers():
  with open(os.path.join(ROOT, "docs", "layout.md")) as f:
    text = f.read()
  rows = re.findall(r"^\| (\d+) \| ([^|]+) \|", text, re.M)
  assert rows, "docs/layout.md has no layer table"
  assert [int(n) for n, _ in rows] == list(range(1, len(rows) + 1))
  return [sorted(name.strip().rstrip("/").removesuffix(".py")
                 for name in re.findall(r"`([^`]+)`", cell)) for _, cell in rows]


def test_the_page_lists_the_contract_s_layers_in_order():
  assert _page_layers() == _contract_layers()


def test_every_folder_is_on_the_page_and_every_named_one_exists():
  on_page = {name for layer in _page_layers() for name in layer}
  folders = {os.path.basename(os.path.dirname(p))
             for p in glob.glob(os.path.join(ROOT, "txf", "*", "__init__.py"))}
  assert folders - on_page == set(), "folders missing from docs/layout.md"
  named_folders = on_page - {"cli"}
  assert named_folders - folders == set(), "docs/layout.md names folders that do not exist"
  assert len(_contract_layers()) <= 14


def test_only_the_entry_points_are_loose_in_txf():
  loose = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "txf", "*.py")))
  assert {"__init__.py", "cli.py"} <= set(loose) and len(loose) <= 3, loose
