"""Compiled programs kept whole across processes: a warm start skips tracing and lowering too.

XLA's persistent cache (``txf.runtime.compile_cache``) keys a program by its lowered module, so every
process still traces the Python function and lowers it before it can look the program up: about
1 s for the default model's train step and 2 s for ``base``'s, on every start. This cache keys a
program by what determines the module instead, and keeps the executable (``jax.experimental.
serialize_executable``) under ``<compile cache folder>/programs``:

  key = sha256(the function's module and name,
               its static arguments and everything its closure holds,
               the dynamic arguments' tree, shapes and dtypes,
               the code: the txf package and every other loaded module outside the Python
                 installation, by content, and what their names are bound to now (a
                 monkeypatched function or constant is seen); the versions of jax, jaxlib,
                 flax, optax, numpy and Python,
               the jax configuration, the JAX_*/XLA_*/TXF_* environment, the devices and
                 the CPU)

(``txf.runtime.fingerprint`` computes the parts.) Only a program XLA compiled in this process is kept:
XLA:CPU serialises an executable that jax's persistent cache handed back without some of its
functions, so such a program is used and not kept. After a code change that leaves the lowered
module as it was, jax's cache keeps serving it, as it did before this cache existed.

A change made at run time inside an installed library (a monkeypatched ``flax`` or ``jax``
function) is not seen: turn the cache off for such experiments (``TXF_COMPILE_CACHE=off``).

Not cached here, compiled as ``jax.jit`` would: a function whose closure holds something the
fingerprint cannot describe (an object of unknown kind, a live tracer), multi-process runs, and
arguments sharded over several devices. A kept program is loaded onto the one device it was
compiled for. A corrupt or unreadable entry is compiled again by XLA and kept in its place, with
the process's one cache line (``txf.runtime.cache_repair``). The folder is bounded by the compile cache's size bound (least recently used entries go first). It is off
whenever the compile cache is off.

Loading is C++ work that releases the GIL: ``CachedJit.prefetch`` starts it on a thread, so a
program loads while the caller builds its inputs (the train loop loads its step while the
parameters are initialised).
"""

import contextlib
import copyreg
import dataclasses
import functools
import hashlib
import io
import os
import pickle
import threading
from concurrent import futures
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import jax
import numpy as np
from jax.experimental import serialize_executable

from txf.runtime import cache_repair, compile_cache
from txf.runtime.fingerprint import (Unfingerprintable, closure_fingerprint, code_fingerprint,
                             environment_fingerprint)

try:  # jax's layouts (an aval's layout on jax 0.12: AutoLayout, compared by identity)
  from jax._src import layout as _layout
except ImportError:  # a jax without the module: nothing to keep
  _layout = None

try:  # True outside any jax transformation (eval_shape, jit, grad): only then is a program run
  from jax._src.core import trace_state_clean as _top_level
except ImportError:  # a jax without it: an op staged into a trace makes a tracer
  def _top_level() -> bool:
    return not isinstance(jax.lax.full((), 0), jax.core.Tracer)

SUBDIR = compile_cache.PROGRAMS_SUBDIR


def _auto_layout():
  """jax's ``AutoLayout`` singleton: what a pickled reference to it becomes when read back."""
  return _layout.AutoLayout


def _keep_auto_layout_singleton() -> None:
  """Pickles jax's ``AutoLayout`` as a reference to the singleton.

  On jax 0.12 an aval carries a layout, ``AutoLayout`` by default, compared by identity. A
  serialised executable pickles its avals; read back with pickle's default, their layout is a new
  object, unequal to ``AutoLayout``, so the arrays a kept program returns have avals that no longer
  match the ones jax builds, and ``jax.grad`` over them fails ("Expected cotangent type
  float32[3,2] but got float32[3,2]"). A jax whose singleton survives pickling is left alone."""
  auto = getattr(_layout, "AutoLayout", None)
  if auto is None or pickle.loads(pickle.dumps(auto)) is auto:
    return
  copyreg.pickle(type(auto), lambda _: (_auto_layout, ()))


_keep_auto_layout_singleton()
cache_repair.install()  # a corrupt entry of jax's cache is replaced in the run that finds it
_SUFFIXES = (".program", ".shapes")  # whole programs; the results of eval_shape


# ------------------------------------------------------------------------------------ the store

def folder() -> Optional[str]:
  """Where programs are kept: ``<the compile cache's folder>/programs``, or None when the compile
  cache is off (as jax was configured: ``jax_compilation_cache_dir``)."""
  base = jax.config.values.get("jax_compilation_cache_dir")
  if not base or not jax.config.values.get("jax_enable_compilation_cache", True):
    return None
  return os.path.join(base, SUBDIR)


def _read(path: str):
  """What ``_write`` kept at ``path`` (a program: payload, in_tree, out_tree, device ids), or None
  when there is none."""
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
  try:
    with io.open(tmp, "wb") as f:
      pickle.dump(entry, f, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):  # a write that failed half-way (a full disk) leaves nothing behind
      os.remove(tmp)
  _evict(os.path.dirname(path), compile_cache.max_bytes())


def _evict(where: str, limit: int) -> None:
  """Removes the least recently used entries of ``where`` until it holds at most ``limit`` bytes
  (-1: no bound)."""
  if limit < 0:
    return
  entries = []
  for name in os.listdir(where):
    if name.endswith(_SUFFIXES):
      try:
        st = os.stat(os.path.join(where, name))
      except FileNotFoundError:  # another process evicted it meanwhile
        continue
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
    self._plain = False  # the closure cannot be fingerprinted: always plain jax.jit
    self._lock = threading.Lock()
    functools.update_wrapper(self, fun)

  def lower(self, *args):
    """``jax.jit(...).lower(*args)``."""
    return self._jit.lower(*args)

  def _cache_size(self) -> int:
    return len(self._programs) + self._jit._cache_size()  # pylint: disable=protected-access

  def __call__(self, *args):
    if self._plain or not _top_level():  # not cacheable here, or inside eval_shape or another
      return self._jit(*args)            # trace: staged, as jax.jit is
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
    """(tree, ((shape, dtype, weak type) per leaf), ((index, value) per static argument)) of a
    call, this process's key for its program; None when these arguments are not cached here."""
    described = _avals(self._dynamic(args))
    if described is None:
      return None
    return described + (tuple((i, args[i]) for i in self._static),)

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
      if loaded is None or loaded is _UNREADABLE:
        loaded = self._compile_and_store(args, program.path, replace=loaded is _UNREADABLE)
      program.compiled = loaded
    return program.compiled

  def _key(self, signature) -> Optional[str]:
    tree, avals, statics = signature
    try:
      if self._closure is None:
        self._closure = closure_fingerprint(self._fun)
    except Unfingerprintable:
      self._plain = True
      return None
    try:
      static_part = closure_fingerprint([value for _, value in statics])
    except Unfingerprintable:
      return None
    text = "\n".join([getattr(self._fun, "__module__", ""), getattr(self._fun, "__qualname__", ""),
                      self._closure, static_part, str(tree), repr(avals), code_fingerprint(),
                      environment_fingerprint()])
    return hashlib.sha256(text.encode()).hexdigest()[:40]

  def _compile_and_store(self, args, path: str, replace: bool = False):
    """Compiles (``replace``: by XLA, never read back from jax's cache, so that it can be kept in
    place of an unreadable entry) and keeps the program at ``path`` where it can."""
    with cache_repair.compiling_fresh() if replace else contextlib.nullcontext():
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
      compile_cache.entry_problem(f"a compiled program could not be written ({e.strerror or e}): "
                                  "it is compiled again next time")
    return compiled


def _avals(args) -> Optional[Tuple[Any, Tuple]]:
  """(tree, ((shape, dtype, weak type) per leaf)) of arrays or ShapeDtypeStructs; None when a leaf
  is sharded over several devices."""
  leaves, tree = jax.tree_util.tree_flatten(args)
  avals = []
  for leaf in leaves:
    sharding = getattr(leaf, "sharding", None)
    if isinstance(leaf, jax.Array) and sharding is not None and len(sharding.device_set) > 1:
      return None
    shape, dtype = np.shape(leaf), getattr(leaf, "dtype", None)
    if dtype is None:
      dtype = np.asarray(leaf).dtype
    avals.append((tuple(shape), str(dtype), bool(getattr(leaf, "weak_type", False))))
  return tree, tuple(avals)


def cached_eval_shape(fun: Callable, *args):
  """``jax.eval_shape(fun, *args)``, its result kept beside the programs and keyed like them (what
  ``fun``'s closure holds, the arguments' tree, shapes and dtypes, the code, the environment):
  a warm start does not trace ``fun`` for its shapes. Computed as jax does when the cache is off,
  in a multi-process run, or when ``fun`` cannot be described."""
  where = folder()
  described = _avals(args) if where is not None and jax.process_count() == 1 else None
  if described is None:
    return jax.eval_shape(fun, *args)
  try:
    closure = closure_fingerprint(fun)
  except Unfingerprintable:
    return jax.eval_shape(fun, *args)
  text = "\n".join(["eval_shape", getattr(fun, "__module__", ""), getattr(fun, "__qualname__", ""),
                    closure, str(described[0]), repr(described[1]), code_fingerprint(),
                    environment_fingerprint()])
  path = os.path.join(where, f"{hashlib.sha256(text.encode()).hexdigest()[:40]}.shapes")
  try:
    kept = _read(path)
    if kept is not None:
      return kept
  except Exception as e:  # pylint: disable=broad-except  # an unreadable entry: traced, replaced
    compile_cache.unreadable_entry(f"{type(e).__name__}: {e}")
  out = jax.eval_shape(fun, *args)
  try:
    _write(path, out)
  except (pickle.PicklingError, TypeError, AttributeError):
    pass  # a result pickle cannot keep: traced again next time
  except OSError as e:
    compile_cache.entry_problem(f"shapes could not be written ({e.strerror or e}): traced again "
                                "next time")
  return out


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


_UNREADABLE = "unreadable"  # what _load returns for an entry it could not read (removed)


def _load(path: str):
  """The compiled program kept at ``path``, None when there is none, or ``_UNREADABLE`` (the
  entry is removed, and the process's one cache line says so)."""
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
    compile_cache.unreadable_entry(f"{type(e).__name__}: {e}")
    try:
      os.remove(path)
    except OSError:
      pass
    return _UNREADABLE


@functools.lru_cache(maxsize=1)
def _pool() -> futures.ThreadPoolExecutor:
  return futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="txf-program-load")


def cached_jit(fun: Optional[Callable] = None, *, static_argnums: Sequence[int] = (),
               donate_argnums: Sequence[int] = ()):
  """Decorator form of ``CachedJit``: ``@cached_jit`` or ``@cached_jit(static_argnums=(1,))``."""
  if fun is None:
    return lambda f: CachedJit(f, static_argnums, donate_argnums)
  return CachedJit(fun, static_argnums, donate_argnums)
