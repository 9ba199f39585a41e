"""Hugging Face ``tokenizers`` files read and written by txf itself (no ``tokenizers`` import):
``read(path_or_folder) -> TokenizerJson`` with ``encode``, ``decode``, ``vocab_size``,
``token_to_id``, ``id_to_token``, ``bos_id`` / ``eos_id`` / ``pad_id`` / ``unk_id`` and
``save(folder)``. The implementation is txf.data.tokjson (the data layer, so that a run's saved
codec can load it too); this module is the door the Hugging Face imports use.
"""

from txf.data.tokjson import CONFIG_FILE, TOKENIZER_FILE, TokenizerJson, read

__all__ = ["CONFIG_FILE", "TOKENIZER_FILE", "TokenizerJson", "read"]
