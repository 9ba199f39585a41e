"""Analysis tools beside the Transformer (used by the notebooks, not by the model): word embeddings
from co-occurrence counts by PCA, and the analytic Jacobians of LayerNorm and softmax."""

from txf.analysis import cooccurrence, jacobians
