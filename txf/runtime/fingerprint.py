"""Fingerprints of what a traced and compiled program depends on, without tracing it.

``closure_fingerprint(fn)``: the values a function's closure holds (recursively: functions by
their code, defaults and cells, dataclasses and NamedTuples field by field, arrays by their
bytes); ``Unfingerprintable`` for anything it cannot describe. ``code_fingerprint()``: the txf
package's source and every loaded module outside the Python installation, by content, and the
versions of the libraries that trace and compile. ``environment_fingerprint()``: the jax
configuration, the ``JAX_*``/``XLA_*``/``TXF_*`` environment, the devices and the CPU.
``txf.runtime.program_cache`` keys its programs by them.
"""

import dataclasses
import enum
import functools
import hashlib
import os
import sys
import sysconfig
import types
from typing import Any, Dict, Iterable, Optional, Tuple

import jax
import numpy as np

from txf.runtime import compile_cache

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
  program compute could change: values by value; functions by module, name, code, defaults and
  closure cells (recursively) and the globals their code names (a function or class from a source
  file by name: ``code_fingerprint`` covers its file; one defined in a notebook or by ``exec`` by
  its code and body); dataclasses (flax modules and configs) and NamedTuples (optax
  transformations) field by field; arrays by their bytes. Raises ``Unfingerprintable`` for
  anything else."""
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
    if not _from_file(obj):  # defined in a notebook cell or by exec: its body is part of it
      for name, value in sorted(vars(obj).copy().items()):
        if not name.startswith("__") or name == "__call__":
          put("attribute", name)
          _describe(value, h, seen)
      for base in obj.__bases__:
        _describe(base, h, seen)
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
    mapping = obj.copy() if isinstance(obj, dict) else obj  # a copy: no change mid-iteration
    items = sorted(mapping.items(), key=lambda kv: repr(kv[0]))
    put("mapping", kind.__module__, kind.__qualname__, len(items))
    for k, v in items:
      _describe(k, h, seen)
      _describe(v, h, seen)
  elif hasattr(obj, "__dict__") and not callable(obj) and kind.__module__.split(".")[0] in ("flax",):
    put("object", kind.__module__, kind.__qualname__)  # flax's sentinels (an unset parent)
    _describe(vars(obj).copy(), h, seen)
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
  for name in _global_names(fn.__code__):  # what the code reads from its module's globals
    value = fn.__globals__.get(name)
    if value is None or isinstance(value, (types.ModuleType, types.BuiltinFunctionType)):
      continue
    if isinstance(value, (type, types.FunctionType)) and _from_file(value):
      continue  # a source file's class or function: its file is part of the code fingerprint
    put("global", name)
    _describe(value, h, seen)


def _from_file(obj) -> bool:
  """True when ``obj`` (a function or class) was defined in a module loaded from a source file."""
  module = sys.modules.get(getattr(obj, "__module__", None) or "")
  path = getattr(module, "__file__", None)
  return isinstance(path, str) and path.endswith(".py")


def _describe_code(code: types.CodeType, put) -> None:
  put("code", code.co_name, code.co_code.hex(), code.co_names, code.co_varnames, code.co_freevars)
  for const in code.co_consts:
    if isinstance(const, types.CodeType):
      _describe_code(const, put)
    else:
      put("const", type(const).__name__, _const_repr(const))


def _const_repr(const) -> str:
  """A code constant's repr, the same in every process: a frozenset's (``x in {"a", "b"}``)
  elements sorted, since their order follows string hashing, which each process seeds anew."""
  if isinstance(const, frozenset):
    return "frozenset(" + ", ".join(sorted(_const_repr(c) for c in const)) + ")"
  if isinstance(const, tuple):
    return "(" + ", ".join(_const_repr(c) for c in const) + ")"
  return repr(const)


def _global_names(code: types.CodeType) -> Iterable[str]:
  yield from code.co_names
  for const in code.co_consts:
    if isinstance(const, types.CodeType):
      yield from _global_names(const)


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
  package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # txf/
  files = set()
  for root, _, names in os.walk(package):
    files.update(os.path.join(root, n) for n in names if n.endswith(".py"))
  own_modules = []
  # one copy in one C call: iterating sys.modules itself allocates, and a collection run then
  # may call a finaliser that imports ("dictionary changed size during iteration")
  for name, module in sys.modules.copy().items():
    path = getattr(module, "__file__", None)
    own = _own_file(path) if isinstance(path, str) else None
    if own is not None:
      files.add(own)
      own_modules.append((name, module))
  for path in sorted(files):
    if not os.path.isfile(path):
      continue
    h.update(f"{os.path.relpath(path, package) if path.startswith(package) else path}="
             f"{_file_digest(path)}\n".encode())
  for name, module in sorted(own_modules, key=lambda nm: nm[0]):
    _describe_bindings(name, module, h)
  h.update(_versions().encode())
  return h.hexdigest()


def _describe_bindings(name: str, module: types.ModuleType, h) -> None:
  """Feeds what ``module``'s names are bound to now, so that a binding changed at run time (a
  monkeypatched function or constant, a replaced method) changes the fingerprint: functions and
  classes by where they were defined (a class of this module with its methods), other public
  values by value where they can be described, by type where not. Private data (``_cache``-like
  names) is left out: it changes as a run goes."""
  put = lambda *parts: h.update(("\x1f".join(str(p) for p in parts) + "\x1e").encode())
  put("bindings", name)
  for key, value in sorted(vars(module).copy().items(), key=lambda kv: kv[0]):
    if key.startswith("__"):
      continue
    if isinstance(value, types.ModuleType):
      put(key, "module", value.__name__)
    elif isinstance(value, (types.FunctionType, type)):
      put(key, _defined_as(value))
      if isinstance(value, type) and value.__module__ == name:
        for attr, member in sorted(vars(value).copy().items(), key=lambda kv: kv[0]):
          if isinstance(member, (types.FunctionType, staticmethod, classmethod, property)):
            put(key, attr, _defined_as(getattr(member, "__func__", None) or
                                       getattr(member, "fget", None) or member))
    elif not key.startswith("_"):
      put(key, "value", _value_digest(value))


# id -> (the object, its digest), for objects that do not change once made (functions, classes,
# tuples, strings, numbers, frozen dataclasses): described once a process; the object is held so
# that its id is not reused
_memo: Dict[int, Tuple[Any, str]] = {}


def _immutable(value) -> bool:
  if isinstance(value, (types.FunctionType, type, tuple, frozenset, str, bytes, int, float)):
    return True
  params = getattr(type(value), "__dataclass_params__", None)
  return bool(params is not None and params.frozen)


def _value_digest(value) -> str:
  """sha256 hex of ``_describe(value)``, or its type's name where it cannot be described."""
  hit = _memo.get(id(value))
  if hit is not None and hit[0] is value:
    return hit[1]
  sub = hashlib.sha256()
  try:
    _describe(value, sub, {})
    digest = sub.hexdigest()
  except Unfingerprintable:
    digest = f"object {type(value).__module__}.{type(value).__qualname__}"
  if _immutable(value):
    _memo[id(value)] = (value, digest)
  return digest


def _defined_as(obj) -> str:
  """A function's or class's module and qualified name; with its code and what its closure holds
  when no file holds the code or the function is a closure (a wrapper may copy another's name)."""
  where = f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', type(obj).__name__)}"
  closure = isinstance(obj, types.FunctionType) and (obj.__closure__ or obj.__defaults__)
  if closure or isinstance(obj, (types.FunctionType, type)) and not _from_file(obj):
    return f"{where} {_value_digest(obj)}"
  return where


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
