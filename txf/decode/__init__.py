"""Decoding: the search algorithms, the model adapter and the compiled decoders.

- ``greedy``, ``beam``, ``sampling``: model-agnostic algorithms over a ``logits_fn(ids, cache)``
  callback, ``logits_fn(ids int32 [N, L], cache) -> (logits float32 [N, V] at the last position,
  new_cache)``; leaves of ``cache`` with leading dimension N are per-row state, 0-d leaves are
  shared counters. Special ids: PAD=0, BOS=1, EOS=2. Decoding starts by feeding BOS. They import
  no model (import-linter).
- ``adapter``: txf's models as such a callback: the KV cache, one step's logits, the beam layout
  (txf.nn.kv_cache) and an uncached reference.
- ``decoders``: both joined under one jit: translation ids and texts, samplers.
- ``spec``: ``DecodingSpec``, every setting of a search in one frozen record (beam, length
  penalty, early stopping, max extra tokens, banned ids, sampling), passed whole from the config
  or the command line down to the compiled decoders.
"""

from txf.decode.adapter import (OUTPUT_KERNEL, cast_for_decoding, expand_cache, init_cache,
                                init_uncached_cache, make_logits_fn, make_uncached_logits_fn,
                                prepare_for_decoding, reorder_cache)
from txf.decode.beam import (beam_rows, beam_search, expand_to_beams, gather_beams, gather_rows,
                             length_penalty)
from txf.decode.decoders import (compiled_ragged_sampler, compiled_sampler, decode_buffer_len,
                                 greedy_continuation, text_logits_fn, translate_ids,
                                 translate_texts)
from txf.decode.greedy import greedy_decode
from txf.decode.spec import SAMPLING, DecodingSpec
from txf.decode.sampling import filter_logits, sample
