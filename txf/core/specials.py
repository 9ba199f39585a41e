"""The special token ids every tokenizer, batch and model of txf shares, defined once here.

PAD (0) fills rows and is never predicted on purpose; BOS (1) starts every decoder input; EOS (2)
ends every sequence; UNK (3) stands for what the vocabulary lacks. ``txf.data`` (tokenizers,
batches) and ``txf.nn`` (masks, decoding) import them from this module.
"""

PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
