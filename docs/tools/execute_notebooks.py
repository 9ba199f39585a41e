"""Execute the notebooks in small mode into docs/notebooks/ (git-ignored), for the site.

    python docs/tools/execute_notebooks.py [--force]
    TXF_DOCS_EXECUTE=0 mkdocs build      # a quick preview: the notebooks without outputs

``mkdocs build`` runs this first (docs/tools/hooks.py). A copy is executed again only when its key
changed: the SHA-256 of the notebook, of every ``.py`` file under txf/ and experiments/, of its
stored results under docs/results/NN_name*.json (a full run's, which it shows in small mode), and
of this file. Each runs as tests/test_notebooks.py runs it: nbclient on the ``python3`` kernel,
TXF_NOTEBOOK_SMALL=1, TXF_DATA unset, in a temporary working directory; its figures go to
docs/notebooks/figures/NN_name/, so tests/test_notebooks.py can check a current copy instead of
executing the notebook a second time.
"""

import glob
import hashlib
import importlib.metadata
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOKS = os.path.join(ROOT, "notebooks")
OUT = os.path.join(ROOT, "docs", "notebooks")
RESULTS = os.path.join(ROOT, "docs", "results")  # full runs' results a notebook shows in small mode
KEY = "txf_docs_key"
CELL_TIMEOUT_S = 600


def names():
  """NN_name of every notebooks/NN_name.ipynb."""
  return sorted(os.path.basename(p)[:-6] for p in glob.glob(os.path.join(NOTEBOOKS, "[0-9][0-9]_*.ipynb")))


def key(name):
  """Hex SHA-256 over the notebook, txf's and the experiments' sources, this file, and the Python and
  jax versions (a copy executed under another jax is not reused: .ci/run tests both)."""
  h = hashlib.sha256()
  h.update(f"python {sys.version_info[:2]} jax {importlib.metadata.version('jax')}".encode())
  paths = [os.path.join(NOTEBOOKS, f"{name}.ipynb"), os.path.abspath(__file__)]
  for folder in ("txf", "experiments"):
    paths += sorted(glob.glob(os.path.join(ROOT, folder, "**", "*.py"), recursive=True))
  paths += sorted(glob.glob(os.path.join(RESULTS, f"{name}*.json")))  # the stored full run it shows
  for path in paths:
    h.update(os.path.relpath(path, ROOT).encode())
    with open(path, "rb") as f:
      h.update(f.read())
  return h.hexdigest()


def current(name):
  """(executed notebook path, figures folder) when docs/notebooks holds a current copy, else None."""
  import nbformat
  path = os.path.join(OUT, f"{name}.ipynb")
  if not os.path.isfile(path):
    return None
  with open(path, encoding="utf-8") as f:
    nb = nbformat.read(f, as_version=4)
  if nb.metadata.get(KEY) != key(name):
    return None
  return path, os.path.join(OUT, "figures", name)


def execute(name):
  """Run notebooks/NN_name.ipynb in small mode; write docs/notebooks/NN_name.ipynb with its outputs."""
  import nbclient
  import nbformat
  from jupyter_client.manager import KernelManager
  figures = os.path.join(OUT, "figures", name)
  shutil.rmtree(figures, ignore_errors=True)
  os.makedirs(figures)
  env_before = dict(os.environ)
  os.environ.update(TXF_NOTEBOOK_SMALL="1", TXF_NOTEBOOK_OUT=figures, JAX_PLATFORMS="cpu",
                    PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
  os.environ.pop("TXF_DATA", None)  # 04 writes and reads its toy corpus, as in the tests
  try:
    with open(os.path.join(NOTEBOOKS, f"{name}.ipynb"), encoding="utf-8") as f:
      nb = nbformat.read(f, as_version=4)
    with tempfile.TemporaryDirectory() as cwd:
      # the kernel talks over local sockets in cwd (IPC), not TCP: no "running over TCP without
      # encryption" warning from each kernel in the build's log, and nothing left behind; the
      # notebook's own temporary folders (its runs, caches) go there too
      os.environ["TMPDIR"] = cwd
      km = KernelManager(kernel_name="python3", transport="ipc", ip=os.path.join(cwd, "kernel-ipc"))
      try:
        nbclient.NotebookClient(nb, km=km, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                resources={"metadata": {"path": cwd}}).execute()
      finally:  # a kernel manager passed in is the caller's to shut down (nbclient leaves it running)
        if km.has_kernel:
          km.shutdown_kernel(now=True)
  finally:
    os.environ.clear()
    os.environ.update(env_before)
  nb.metadata[KEY] = key(name)
  os.makedirs(OUT, exist_ok=True)
  tmp = os.path.join(OUT, f".{name}.ipynb.tmp")
  with open(tmp, "w", encoding="utf-8") as f:
    nbformat.write(nb, f)
  os.replace(tmp, os.path.join(OUT, f"{name}.ipynb"))


def main(force=False):
  """Execute every stale notebook; with TXF_DOCS_EXECUTE=0, copy the unexecuted ones that are missing
  instead (a quick preview of the site: no outputs, executed by the next build without it)."""
  for name in names():
    if not force and current(name):
      continue
    if os.environ.get("TXF_DOCS_EXECUTE", "1") == "0":
      if not os.path.exists(os.path.join(OUT, f"{name}.ipynb")):
        os.makedirs(OUT, exist_ok=True)
        shutil.copy(os.path.join(NOTEBOOKS, f"{name}.ipynb"), os.path.join(OUT, f"{name}.ipynb"))
      continue
    start = time.time()
    execute(name)
    print(f"docs: executed notebooks/{name}.ipynb in small mode ({time.time() - start:.0f} s)",
          file=sys.stderr)


if __name__ == "__main__":
  main(force="--force" in sys.argv[1:])
