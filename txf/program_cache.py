"""Compiled programs kept whole across processes: a warm start skips tracing and lowering too.

XLA's persistent cache (``txf.compile_cache``) keys a program by its lowered module, so every
process still traces the Python function and lowers it before it can look the program up: about
1 s for the default model's train step and 2 s for ``base``'s, on every start. This cache keys a
program by what determines the module instead, and keeps the executable (``jax.experimental.
serialize_executable``) under ``<compile cache folder>/programs``:

  key = sha256(the function's module and name,
               its static arguments and everything its closure holds (``closure_fingerprint``),
               the dynamic arguments' tree, shapes and dtypes,
               the code: every ``.py`` file of the txf package and every other loaded module
                 outside the Python installation, by content; the versions of jax, jaxlib,
                 flax, optax, numpy and Python,
               the jax configuration, the ``JAX_*``/``XLA_*``/``TXF_*`` environment, the
                 devices and the CPU (the compile cache's folder fingerprint))

Only a program XLA compiled in this process is kept: XLA:CPU serialises an executable that
jax's persistent cache handed back without some of its functions, so such a program is used and
not kept (after a code change that leaves the lowered module as it was, jax's cache keeps serving
it, as it did before this cache existed). A function whose closure holds something the fingerprint cannot describe (an object of unknown
kind, a live tracer) is never cached here: it is compiled as ``jax.jit`` would. Multi-process runs
and arguments sharded over several devices are not cached here either. A corrupt or unreadable
entry is one warning line and a normal compile. The folder is bounded by the compile cache's size
bound (least recently used entries go first). Off whenever the compile cache is off.

Loading is C++ work that releases the GIL: ``CachedJit.prefetch`` starts it on a thread, so a
program loads while the caller builds its inputs (the train loop loads its step while the
parameters are initialised).
"""

import dataclasses
import enum
import functools
import hashlib
import io
import os
import pickle
import sys
import sysconfig
import threading
import types
from concurrent import futures
from typing import Any, Callable, Dict, Iterable, Optional, Sequence, Tuple

import jax
import numpy as np
from jax.experimental import serialize_executable

from txf import compile_cache

try:  # True outside any jax transformation (eval_shape, jit, grad): only then is a program run
  from jax._src.core import trace_state_clean as _top_level
except ImportError:  # a jax without it: an op staged into a trace makes a tracer
  def _top_level() -> bool:
    return not isinstance(jax.lax.full((), 0), jax.core.Tracer)

SUBDIR = compile_cache.PROGRAMS_SUBDIR
# environment variables that only say where and whether to cache or log: not part of a program
_ENV_SKIP = ("TXF_COMPILE_CACHE", "JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE", "JAX_LOG",
             "JAX_ENABLE_COMPILATION_CACHE", "TXF_PROGRESS")
_CONFIG_SKIP = ("cache", "log", "explain")
_VERSIONED = ("jax", "jaxlib", "flax", "optax", "numpy", "ml_collections")
_MAX_ARRAY_BYTES = 64 << 20


class Unfingerprintable(Exception):
  """The closure holds something whose effect on the program cannot be described."""


def closure_fingerprint(obj: Any) -> str:
  """sha256 hex of a description of ``obj`` that changes whenever what it would make a traced
  program compute could change: values by value, functions by module, name, code, defaults and
  closure cells (recursively), the plain-data globals their code names, dataclasses (flax modules
  and configs) and NamedTuples (optax transformations) field by field, arrays by their bytes.
  Raises ``Unfingerprintable`` for anything else."""
  h = hashlib.sha256()
  _describe(obj, h, {})
  return h.hexdigest()


def _describe(obj: Any, h, seen: Dict[int, int]) -> None:
  """Feeds ``obj``'s description to ``h``; ``seen``: id -> position, for shared and cyclic parts."""
  put = lambda *parts: h.update(("\x1f".join(str(p) for p in parts) + "\x1e").encode())
  if obj is None or isinstance(obj, (bool, int, float, complex, str, bytes)):
    put(type(obj).__name__, repr(obj))
    return
  if id(obj) in seen:
    put("ref", seen[id(obj)])
    return
  seen[id(obj)] = len(seen)
  kind = type(obj)
  if isinstance(obj, enum.Enum):
    put("enum", kind.__module__, kind.__qualname__, obj.name)
  elif isinstance(obj, (types.ModuleType,)):
    put("module", obj.__name__)
  elif isinstance(obj, type):
    put("class", obj.__module__, obj.__qualname__)
  elif isinstance(obj, np.dtype):
    put("dtype", obj.str)
  elif isinstance(obj, (np.ndarray, np.generic)):
    _describe_array(np.asarray(obj), h, put)
  elif isinstance(obj, jax.core.Tracer):
    raise Unfingerprintable("a traced value")
  elif isinstance(obj, jax.Array):
    if jax.dtypes.issubdtype(obj.dtype, jax.dtypes.prng_key):
      put("key", str(obj.dtype))
      obj = jax.random.key_data(obj)
    _describe_array(np.asarray(obj), h, put)
  elif isinstance(obj, jax.ShapeDtypeStruct):
    put("sds", obj.shape, obj.dtype, getattr(obj, "weak_type", False))
  elif dataclasses.is_dataclass(obj):
    put("dataclass", kind.__module__, kind.__qualname__)
    for field in dataclasses.fields(obj):
      put("field", field.name)
      _describe(getattr(obj, field.name, None), h, seen)
  elif isinstance(obj, functools.partial):
    put("partial")
    for part in (obj.func, obj.args, obj.keywords):
      _describe(part, h, seen)
  elif isinstance(obj, types.MethodType):
    put("method")
    _describe(obj.__func__, h, seen)
    _describe(obj.__self__, h, seen)
  elif isinstance(obj, types.FunctionType):
    _describe_function(obj, h, seen, put)
  elif isinstance(obj, types.BuiltinFunctionType):
    put("builtin", getattr(obj, "__module__", ""), obj.__qualname__)
  elif hasattr(obj, "__wrapped__") and callable(obj):  # jax.jit and functools.wraps wrappers
    put("wrapper", kind.__module__, kind.__qualname__)
    _describe(obj.__wrapped__, h, seen)
  elif isinstance(obj, tuple) and hasattr(obj, "_fields"):  # NamedTuple
    put("namedtuple", kind.__module__, kind.__qualname__, len(obj))
    for item in obj:
      _describe(item, h, seen)
  elif isinstance(obj, (list, tuple)):
    put(kind.__name__, len(obj))
    for item in obj:
      _describe(item, h, seen)
  elif isinstance(obj, (set, frozenset)):
    put(kind.__name__, len(obj))
    for item in sorted(obj, key=repr):
      _describe(item, h, seen)
  elif isinstance(obj, dict) or hasattr(obj, "to_dict") and hasattr(obj, "items"):
    items = sorted(obj.items(), key=lambda kv: repr(kv[0]))
    put("mapping", kind.__module__, kind.__qualname__, len(items))
    for k, v in items:
      _describe(k, h, seen)
      _describe(v, h, seen)
  elif hasattr(obj, "__dict__") and not callable(obj) and kind.__module__.split(".")[0] in ("flax",):
    put("object", kind.__module__, kind.__qualname__)  # flax's sentinels (an unset parent)
    _describe(dict(vars(obj)), h, seen)
  else:
    raise Unfingerprintable(f"{kind.__module__}.{kind.__qualname__}")


def _describe_array(arr: np.ndarray, h, put) -> None:
  if arr.nbytes > _MAX_ARRAY_BYTES:
    raise Unfingerprintable(f"an array of {arr.nbytes} bytes")
  put("array", arr.dtype.str, arr.shape)
  h.update(np.ascontiguousarray(arr).tobytes())


def _describe_function(fn: types.FunctionType, h, seen, put) -> None:
  put("function", fn.__module__, fn.__qualname__)
  _describe_code(fn.__code__, put)
  for part in (fn.__defaults__, fn.__kwdefaults__):
    _describe(part, h, seen)
  for cell in fn.__closure__ or ():
    try:
      value = cell.cell_contents
    except ValueError:  # an empty cell
      put("empty-cell")
      continue
    _describe(value, h, seen)
  for name in _global_names(fn.__code__):  # plain data the code reads from its module
    value = fn.__globals__.get(name)
    if value is None or isinstance(value, (types.ModuleType, type, types.FunctionType,
                                           types.BuiltinFunctionType, functools.partial)) or callable(value):
      continue
    put("global", name)
    _describe(value, h, seen)


def _describe_code(code: types.CodeType, put) -> None:
  put("code", code.co_name, code.co_code.hex(), code.co_names, code.co_varnames, code.co_freevars)
  for const in code.co_consts:
    if isinstance(const, types.CodeType):
      _describe_code(const, put)
    else:
      put("const", type(const).__name__, repr(const))


def _global_names(code: types.CodeType) -> Iterable[str]:
  yield from code.co_names
  for const in code.co_consts:
    if isinstance(const, types.CodeType):
      yield from _global_names(const)


# ----------------------------------------------------------------------------------------- code

_file_hashes: Dict[Tuple[str, int, int], str] = {}


def _file_digest(path: str) -> str:
  st = os.stat(path)
  key = (path, st.st_mtime_ns, st.st_size)
  if key not in _file_hashes:
    with open(path, "rb") as f:
      _file_hashes[key] = hashlib.sha256(f.read()).hexdigest()
  return _file_hashes[key]


@functools.lru_cache(maxsize=1)
def _installation_dirs() -> Tuple[str, ...]:
  paths = sysconfig.get_paths()
  dirs = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
  dirs |= {sys.prefix, sys.base_prefix, sys.exec_prefix}
  dirs = {os.path.realpath(d) for d in dirs if d} | {os.path.abspath(d) for d in dirs if d}
  return tuple(d + os.sep for d in sorted(dirs))


_outside: Dict[str, Optional[str]] = {}  # a module's __file__ -> its real path, or None (installed)


def _own_file(path: str) -> Optional[str]:
  """The real path of a module file outside the Python installation, else None (memoised)."""
  if path not in _outside:
    installed = _installation_dirs()
    real = "" if not path.endswith(".py") or path.startswith(installed) else os.path.realpath(path)
    _outside[path] = real if real and not real.startswith(installed) else None
  return _outside[path]


def code_fingerprint() -> str:
  """sha256 hex over the txf package's ``.py`` files and every loaded module's file that lies
  outside the Python installation (experiments, plugins, benchmarks), by content (re-read when a
  file's size or modification time changes), and the versions of the libraries that trace and
  compile."""
  h = hashlib.sha256()
  package = os.path.dirname(os.path.abspath(__file__))
  files = set()
  for root, _, names in os.walk(package):
    files.update(os.path.join(root, n) for n in names if n.endswith(".py"))
  for module in list(sys.modules.values()):
    path = getattr(module, "__file__", None)
    own = _own_file(path) if isinstance(path, str) else None
    if own is not None:
      files.add(own)
  for path in sorted(files):
    if not os.path.isfile(path):
      continue
    h.update(f"{os.path.relpath(path, package) if path.startswith(package) else path}="
             f"{_file_digest(path)}\n".encode())
  h.update(_versions().encode())
  return h.hexdigest()


@functools.lru_cache(maxsize=1)
def _versions() -> str:
  return "".join(f"{name}=={compile_cache._version(name)}\n"  # pylint: disable=protected-access
                 for name in _VERSIONED) + sys.version


def environment_fingerprint() -> str:
  """sha256 hex over the jax configuration, the ``JAX_*``/``XLA_*``/``TXF_*``/``TPU_*``/``LIBTPU*``
  environment (less the cache's and logging's own switches), the devices and processes."""
  h = hashlib.sha256()
  for name, value in sorted(jax.config.values.items()):
    if not any(s in name for s in _CONFIG_SKIP):
      h.update(f"{name}={value!r}\n".encode())
  for name, value in sorted(os.environ.items()):
    if name.startswith(("JAX_", "XLA_", "TXF_", "TPU_", "LIBTPU")) and not name.startswith(_ENV_SKIP):
      h.update(f"env {name}={value}\n".encode())
  for d in jax.devices():
    h.update(f"device {d.platform} {d.device_kind} {d.id} {d.process_index}\n".encode())
  h.update(f"processes {jax.process_count()} {compile_cache.fingerprint()}".encode())
  return h.hexdigest()


# ------------------------------------------------------------------------------------ the store

def folder() -> Optional[str]:
  """Where programs are kept: ``<the compile cache's folder>/programs``, or None when the compile
  cache is off (as jax was configured: ``jax_compilation_cache_dir``)."""
  base = jax.config.values.get("jax_compilation_cache_dir")
  if not base or not jax.config.values.get("jax_enable_compilation_cache", True):
    return None
  return os.path.join(base, SUBDIR)


def _read(path: str):
  """(payload, in_tree, out_tree, device ids) from ``path``, or None when there is none."""
  try:
    with open(path, "rb") as f:
      blob = f.read()
  except FileNotFoundError:
    return None
  os.utime(path)  # least recently used goes first
  return pickle.loads(blob)


def _write(path: str, entry) -> None:
  """Writes ``entry`` to ``path`` atomically (a temporary file renamed), then trims the folder."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = f"{path}.tmp{os.getpid()}"
  with io.open(tmp, "wb") as f:
    pickle.dump(entry, f, protocol=pickle.HIGHEST_PROTOCOL)
  os.replace(tmp, path)
  _evict(os.path.dirname(path), compile_cache.max_bytes())


def _evict(where: str, limit: int) -> None:
  """Removes the least recently used entries of ``where`` until it holds at most ``limit`` bytes
  (-1: no bound)."""
  if limit < 0:
    return
  entries = []
  for name in os.listdir(where):
    if name.endswith(".program"):
      st = os.stat(os.path.join(where, name))
      entries.append((st.st_mtime_ns, st.st_size, name))
  total = sum(size for _, size, _ in entries)
  for _, size, name in sorted(entries):
    if total <= limit:
      break
    try:
      os.remove(os.path.join(where, name))
    except FileNotFoundError:
      pass
    total -= size


# ------------------------------------------------------------------------------------ the jit

@dataclasses.dataclass
class _Program:
  path: str = ""
  compiled: Any = None
  pending: Optional[futures.Future] = None


class CachedJit:
  """``jax.jit(fun, static_argnums, donate_argnums)`` whose compiled programs are also kept in, and
  read back from, the program cache (see the module docstring). Calls, ``lower`` and
  ``_cache_size`` (programs this process holds) work as on the jitted function; results are
  those of the same executable, bit for bit."""

  def __init__(self, fun: Callable, static_argnums: Sequence[int] = (),
               donate_argnums: Sequence[int] = ()):
    self._fun = fun
    self._static = tuple(static_argnums)
    self._jit = jax.jit(fun, static_argnums=self._static, donate_argnums=tuple(donate_argnums))
    self._programs: Dict[Any, _Program] = {}
    self._last: Optional[Callable] = None  # the program of the last call, and its static arguments
    self._last_statics: Tuple = ()
    self._closure: Optional[str] = None
    self._lock = threading.Lock()
    functools.update_wrapper(self, fun)

  def lower(self, *args):
    """``jax.jit(...).lower(*args)``."""
    return self._jit.lower(*args)

  def _cache_size(self) -> int:
    return len(self._programs) + self._jit._cache_size()  # pylint: disable=protected-access

  def __call__(self, *args):
    if not _top_level():  # inside eval_shape or another trace: staged, as jax.jit is
      return self._jit(*args)
    statics = tuple(args[i] for i in self._static)
    if self._last is not None and _same(statics, self._last_statics):
      try:
        return self._last(*self._dynamic(args))
      except TypeError:  # other shapes or dtypes: their own program
        pass
    program = self._program(args)
    if program is None:
      self._last = None
      return self._jit(*args)
    self._last, self._last_statics = program, statics
    return program(*self._dynamic(args))

  def prefetch(self, *args) -> None:
    """Starts loading the program for these arguments (arrays or ``jax.ShapeDtypeStruct``s in the
    dynamic positions) on a thread, when the cache holds it; the call with matching arguments
    waits for it. Does nothing when the cache is off or does not hold it."""
    self._program(args, wait=False)

  def _dynamic(self, args):
    return [a for i, a in enumerate(args) if i not in self._static]

  def _signature(self, args):
    """(in-process key, leaves) or None when these arguments are not cached here."""
    dyn = self._dynamic(args)
    leaves, tree = jax.tree_util.tree_flatten(dyn)
    avals = []
    for leaf in leaves:
      sharding = getattr(leaf, "sharding", None)
      if isinstance(leaf, jax.Array) and sharding is not None and len(sharding.device_set) > 1:
        return None
      shape, dtype = np.shape(leaf), getattr(leaf, "dtype", None)
      if dtype is None:
        dtype = np.asarray(leaf).dtype
      avals.append((tuple(shape), str(dtype), bool(getattr(leaf, "weak_type", False))))
    statics = tuple((i, args[i]) for i in self._static)
    return (tree, tuple(avals), statics)

  def _program(self, args, wait: bool = True) -> Optional[Callable]:
    where = folder()
    if where is None or jax.process_count() > 1:
      return None
    signature = self._signature(args)
    if signature is None:
      return None
    with self._lock:
      program = self._programs.get(signature)
      if program is None:
        key = self._key(signature)
        if key is None:
          return None
        path = os.path.join(where, f"{key}.program")
        if not wait and not os.path.exists(path):
          return None
        program = self._programs[signature] = _Program(path)
        if os.path.exists(path):
          program.pending = _pool().submit(_load, path)
    if not wait:
      return None
    if program.compiled is None:
      loaded = program.pending.result() if program.pending is not None else None
      program.pending = None
      if loaded is None:
        loaded = self._compile_and_store(args, program.path)
      program.compiled = loaded
    return program.compiled

  def _key(self, signature) -> Optional[str]:
    tree, avals, statics = signature
    try:
      if self._closure is None:
        self._closure = closure_fingerprint(self._fun)
      static_part = closure_fingerprint([value for _, value in statics])
    except Unfingerprintable:
      return None
    text = "\n".join([getattr(self._fun, "__module__", ""), getattr(self._fun, "__qualname__", ""),
                      self._closure, static_part, str(tree), repr(avals), code_fingerprint(),
                      environment_fingerprint()])
    return hashlib.sha256(text.encode()).hexdigest()[:40]

  def _compile_and_store(self, args, path: str):
    compiled, fresh = _compile(self._jit.lower(*args))
    if not fresh:  # read back from jax's cache: such a program serialises incomplete
      return compiled
    devices = {d.id for sharding in jax.tree_util.tree_leaves((compiled.input_shardings,
                                                               compiled.output_shardings))
               for d in sharding.device_set}
    if len(devices) != 1:  # kept only for one device, which loading binds it to again
      return compiled
    try:
      payload, in_tree, out_tree = serialize_executable.serialize(compiled)
      _write(path, (payload, in_tree, out_tree, sorted(devices)))
    except (ValueError, NotImplementedError, TypeError, pickle.PicklingError, AttributeError):
      pass  # a program jax cannot serialise (closed-over constants): kept in this process only
    except OSError as e:
      compile_cache.warn(f"a compiled program could not be written ({e.strerror or e}): "
                         "it is compiled again next time")
    return compiled


_REQUESTED = "/jax/compilation_cache/compile_requests_use_cache"
_READ_BACK = "/jax/compilation_cache/cache_hits"


def _compile(lowered) -> Tuple[Any, bool]:
  """(the compiled program, whether XLA compiled it in this call). A program jax's persistent
  cache handed back is not fresh: XLA:CPU serialises such an executable without some of its
  functions (it fails when run), so only fresh ones are kept here. Not fresh either when jax's
  cache events are not seen at all."""
  me, seen = threading.get_ident(), set()

  def listen(event: str, **_) -> None:
    if threading.get_ident() == me:
      seen.add(event)

  jax.monitoring.register_event_listener(listen)
  try:
    compiled = lowered.compile()
  finally:
    jax.monitoring.unregister_event_listener(listen)
  return compiled, _REQUESTED in seen and _READ_BACK not in seen


def _same(a: Tuple, b: Tuple) -> bool:
  return len(a) == len(b) and all(x is y or x == y for x, y in zip(a, b))


def _load(path: str):
  """The compiled program kept at ``path``, or None (a warning line when it is unreadable)."""
  try:
    entry = _read(path)
    if entry is None:
      return None
    payload, in_tree, out_tree, device_ids = entry
    by_id = {d.id: d for d in jax.devices()}
    if any(i not in by_id for i in device_ids):
      return None
    return serialize_executable.deserialize_and_load(
        payload, in_tree, out_tree, execution_devices=[by_id[i] for i in device_ids])
  except Exception as e:  # pylint: disable=broad-except  # any unreadable entry: compile instead
    compile_cache.warn(f"a kept program could not be read ({type(e).__name__}: {str(e)[:120]}): "
                       "compiled as usual")
    try:
      os.remove(path)
    except OSError:
      pass
    return None


@functools.lru_cache(maxsize=1)
def _pool() -> futures.ThreadPoolExecutor:
  return futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="txf-program-load")


def cached_jit(fun: Optional[Callable] = None, *, static_argnums: Sequence[int] = (),
               donate_argnums: Sequence[int] = ()):
  """Decorator form of ``CachedJit``: ``@cached_jit`` or ``@cached_jit(static_argnums=(1,))``."""
  if fun is None:
    return lambda f: CachedJit(f, static_argnums, donate_argnums)
  return CachedJit(fun, static_argnums, donate_argnums)
