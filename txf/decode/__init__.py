"""Model-agnostic decoding over a ``logits_fn(ids, cache)`` callback: greedy, beam search, sampling.

``logits_fn(ids int32 [N, L], cache) -> (logits float32 [N, V] at the last position, new_cache)``;
leaves of ``cache`` with leading dimension N are per-row state, 0-d leaves are shared counters.
Special ids: PAD=0, BOS=1, EOS=2. Decoding starts by feeding BOS.
"""

from txf.decode.beam import (beam_rows, beam_search, expand_to_beams, gather_beams, gather_rows,
                             length_penalty)
from txf.decode.greedy import greedy_decode
from txf.decode.sampling import filter_logits, sample
