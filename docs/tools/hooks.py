"""mkdocs hooks of txf's documentation site (mkdocs.yml `hooks:`).

Every page under docs/ is its own source: no hook copies text from README.md or elsewhere (the
changelog page includes CHANGELOG.md whole with a ``pymdownx.snippets`` line). What the hooks do:

1. The configuration reference. The line ``<!-- config: reference -->`` of docs/config.md becomes
   one table per config section with every field's default, allowed values and meaning, read from
   ``txf.core.config.reference()``, so the page cannot fall behind txf/core/config.py.
2. The maths page links into the API reference. On docs/formulas.md, each
   ``txf/PACKAGE/MODULE.py::NAME`` reference becomes a link to that object's heading in the API
   reference, and each table row gets the anchor ``formula-ROW``; each API object's heading then
   links back to its rows (and, with ``repo_url``, to its source lines in the repository).
3. MathJax 3 is served from the ``django-static-mathjax`` package (no CDN): its script, fonts and TeX
   extensions are added to the site as files.
4. The notebooks are executed in small mode into docs/notebooks/ (git-ignored) by
   ``docs/tools/execute_notebooks.py`` when the copy there is missing or stale, and rendered by
   mkdocs-jupyter from there. Each notebook page starts with a link to download the committed
   notebook (notebooks/NN_name.ipynb, without outputs), served at notebooks/download/.
"""

import os
import posixpath
import re
import shutil
import sys

from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import execute_notebooks  # noqa: E402  (docs/tools/execute_notebooks.py)

DIRECTIVE = re.compile(r"^<!-- config: (.+?) -->[ \t]*$", re.M)


def _read(path):
  with open(os.path.join(ROOT, path), encoding="utf-8") as f:
    return f.read()


API_PACKAGES = ("ops", "kernels", "nn", "models", "decode", "data", "parallel", "train", "inference")
SOURCE_REF = re.compile(r"`txf/(\w+)/(\w+)\.py::([\w.]+)`")


def _api_path(package, module, name):
  """txf.PACKAGE.MODULE.NAME as the API reference's heading id (private parts dropped:
  Embed.__call__ -> Embed), or None for a package without an API page."""
  if package not in API_PACKAGES:
    return None
  parts = [p for p in name.split(".") if not p.startswith("_")]
  return ".".join(["txf", package] + ([] if module == "__init__" else [module]) + parts)


def _link_sources(markdown, page_src):
  """`txf/ops/norm.py::layer_norm` -> a link to txf.ops.norm.layer_norm in the API reference; each
  table row gets the anchor ``formula-ROW`` (ROW its first cell: 1, 1b, ...), the target of the API
  pages' links back to the maths."""
  def link(m):
    path = _api_path(*m.groups())
    if path is None:
      return m.group(0)
    target = posixpath.relpath(f"api/{path.split('.')[1]}.md", posixpath.dirname(page_src) or ".")
    return f"[`{path}`]({target}#{path})"
  markdown = FORMULA_ROW.sub(lambda m: f'| <a id="formula-{m.group(1)}"></a>{m.group(1)} |', markdown)
  return SOURCE_REF.sub(link, markdown)


FORMULA_ROW = re.compile(r"^\| (\d+[a-z]?) \|", re.M)


def formula_rows():
  """{API object path: [formula row, ...]} of the maths page's table (docs/formulas.md)."""
  rows = {}
  for line in _read("docs/formulas.md").splitlines():
    m = FORMULA_ROW.match(line)
    if not m:
      continue
    for ref in SOURCE_REF.finditer(line):
      path = _api_path(*ref.groups())
      if path and m.group(1) not in rows.setdefault(path, []):
        rows[path].append(m.group(1))
  return rows


API_HEADING = re.compile(r'(<h([1-6]) id="(txf\.[\w.]+)"[^>]*>.*?</h\2>)', re.S)


def source_url(path, repo_url, ref="main"):
  """``REPO/blob/REF/txf/x/y.py#Lstart-Lend`` of the object named by ``path`` (txf.x.y.name), or None
  when it is not a function, class or method defined in a file of the repository."""
  import importlib
  import inspect
  parts = path.split(".")
  for i in range(len(parts), 0, -1):  # the longest importable module prefix, then attributes
    try:
      obj = importlib.import_module(".".join(parts[:i]))
    except ImportError:
      continue
    try:
      for name in parts[i:]:
        obj = getattr(obj, name)
      obj = inspect.unwrap(obj)
      file = inspect.getsourcefile(obj)
      lines, start = inspect.getsourcelines(obj)
    except (AttributeError, TypeError, OSError):
      return None
    break
  else:
    return None
  rel = os.path.relpath(file, ROOT).replace(os.sep, "/")
  if rel.startswith(".."):
    return None
  url = f"{repo_url.rstrip('/')}/blob/{ref}/{rel}"
  return url if inspect.ismodule(obj) else f"{url}#L{start}-L{start + len(lines) - 1}"


def _api_links(html, page_dir, repo_url):
  """After each API object's heading: a link to its source in the repository (when the site has a
  ``repo_url``) and, when the maths table names it, links to its rows there."""
  rows = formula_rows()
  formulas = posixpath.relpath("formulas/", page_dir)
  ref = os.environ.get("TXF_REPO_REF", "main")

  def add(m):
    out = m.group(1)
    url = source_url(m.group(3), repo_url, ref) if repo_url else None
    if url:
      out += f'\n<p class="txf-source"><a href="{url}">source</a></p>'
    found = rows.get(m.group(3))
    if found:
      links = ", ".join(f'<a href="{formulas}/#formula-{r}">{r}</a>' for r in found)
      out += f'\n<p class="txf-maths">The maths: formula {links}</p>'
    return out
  return API_HEADING.sub(add, html)


def on_page_markdown(markdown, page, config, files):
  """Expand the ``<!-- config: reference -->`` line of a page; link the
  ``txf/PACKAGE/MODULE.py::NAME`` references of the maths page into the API reference."""
  if page.file.src_uri == "formulas.md":
    markdown = _link_sources(markdown, page.file.src_uri)
  return expand_directives(markdown, page.file.src_uri)


def expand_directives(markdown, src_uri):
  """``<!-- config: reference -->`` replaced by the configuration reference's tables; any other
  ``<!-- config: ... -->`` is an error naming the page."""
  def expand(m):
    if m.group(1) != "reference":
      raise PluginError(f"{src_uri}: unknown directive <!-- config: {m.group(1)} --> "
                        "(known: <!-- config: reference -->)")
    return config_reference()
  return DIRECTIVE.sub(expand, markdown)


CONFIG_SECTIONS = (("", "Run"), ("model.", "model"), ("optimizer.", "optimizer"), ("data.", "data"),
                   ("pretrain.", "pretrain"), ("sharding_rules.", "sharding_rules"))


def _cell(value):
  """Markdown table cell text: pipes escaped."""
  return str(value).replace("|", "\\|")


def config_reference():
  """Markdown of every config field (``txf.core.config.reference``): one table per section with the
  field, its default, its allowed values and its meaning."""
  import txf.models  # noqa: F401  (the variant tables declare their fields' allowed values)
  from txf.core import config as config_lib
  fields = config_lib.reference()
  out = []
  for prefix, title in CONFIG_SECTIONS:
    rows = [f for f in fields if f["key"].startswith(prefix) and
            not any(f["key"].startswith(p) for p, _ in CONFIG_SECTIONS if p and p != prefix and
                    len(p) > len(prefix))]
    out += [f"## {title}", "", "| field | default | allowed values | meaning |", "|---|---|---|---|"]
    for f in rows:
      allowed = ", ".join(f"`{a}`" for a in f["allowed"]) if f["allowed"] else ""
      out.append(f"| `{f['key']}` | `{_cell(repr(f['default']))}` | {_cell(allowed)} | "
                 f"{_cell(f['meaning'])} |")
    out.append("")
  return "\n".join(out)


DOWNLOADS = "notebooks/download"  # site folder of the downloadable notebooks
MATHJAX_FILES = ("tex-mml-chtml.js", "output/chtml/fonts/woff-v2", "input/tex/extensions")


@event_priority(100)  # before mkdocs-jupyter wraps the notebooks
def on_files(files, config):
  """Add MathJax (from the django-static-mathjax package) to the site's files."""
  try:
    import mathjax  # django-static-mathjax: MathJax 3 under mathjax/static/mathjax/es5
  except ImportError as e:
    raise PluginError("MathJax is missing: pip install -e '.[docs]' (django-static-mathjax)") from e
  es5 = os.path.join(os.path.dirname(mathjax.__file__), "static", "mathjax", "es5")
  for item in MATHJAX_FILES:
    full = os.path.join(es5, item)
    paths = [full] if os.path.isfile(full) else [
        os.path.join(d, n) for d, _, names in os.walk(full) for n in names]
    for path in paths:
      rel = os.path.relpath(path, es5).replace(os.sep, "/")
      files.append(File.generated(config, f"assets/mathjax/{rel}", abs_src_path=path))
  return files


def download_links(name, page_dir):
  """HTML of a notebook's download link (the committed .ipynb, without outputs) and its source."""
  href = posixpath.relpath(f"{DOWNLOADS}/{name}.ipynb", page_dir)
  return (f'<p class="txf-download"><a href="{href}" download>Download {name}.ipynb</a> '
          f"(without outputs; run it with <code>jupyter lab</code>) · source "
          f"<code>notebooks/src/{name}.py</code></p>")


def on_page_content(html, page, config, files):
  """Each notebook page starts with its download link; each API object links to its source in the
  repository (with ``repo_url``) and back to its rows of the maths table."""
  src = page.file.src_uri
  if src.startswith("api/"):
    return _api_links(html, posixpath.dirname(page.file.dest_uri), config.get("repo_url"))
  if src.startswith("notebooks/") and src.endswith(".ipynb"):
    name = posixpath.basename(src)[:-len(".ipynb")]
    # the page is served at notebooks/NN_name/ (directory URLs)
    return download_links(name, posixpath.dirname(page.file.dest_uri)) + html
  return html


def on_pre_build(config):
  """Execute the notebooks into docs/notebooks/ when that copy is missing or stale; copy the
  committed ones to docs/notebooks/download/ (a static file there: mkdocs-jupyter's
  ``notebooks/*.ipynb`` does not match it)."""
  execute_notebooks.main()
  downloads = os.path.join(config["docs_dir"], DOWNLOADS)
  os.makedirs(downloads, exist_ok=True)
  for name in execute_notebooks.names():
    shutil.copyfile(os.path.join(ROOT, "notebooks", f"{name}.ipynb"), os.path.join(downloads, f"{name}.ipynb"))
