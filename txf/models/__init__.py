"""The model families (translation, classification, language modelling; BERT's masked LM), built
from one set of txf.nn modules (``build``: modules, parameters, forward, the run's model config,
vocabulary padding) and the default training objective (``loss``).
Which module a ``model.family`` names, and what the rest of txf knows of it, is its record in
``txf.core.families``."""

from txf.models.build import (ModelBuilder, abstract_params, build_model, has_token_head,
                              count_params, forward, forward_hidden, init_boxed_params, init_params,
                              model_config_for, model_config_from, model_inputs, pad_vocab,
                              param_axes, unpad_vocab)
from txf.models.decoder_lm import DecoderLM
from txf.models.encoder_classifier import EncoderClassifier
from txf.models.encoder_decoder import EncoderDecoder, shift_right
from txf.models.loss import FUSED_HEAD_MIN_VOCAB, LossFn, cross_entropy_loss, default_loss
