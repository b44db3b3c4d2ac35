"""GPT2GPT: Ramachandran, Liu & Le 2017 ("Unsupervised Pretraining for Sequence to Sequence
Learning") with the core's Transformer stacks in place of the paper's LSTMs.

The encoder is a source-side GPT run's decoder stack and the decoder a target-side GPT run's
(self-attention, feed-forward, positions, token table, and the output softmax tied to that table:
the paper shares the target LM's softmax with the seq2seq one); only the decoder's cross-attention
is new. `combine.py` builds such a run from the two GPT runs, and seq2seq fine-tuning of it trains
the paper's objective (`objective.py`): the seq2seq loss plus both language-model losses.

`model.causal_encoder` (default True) keeps GPT's causal mask in the encoder. The paper's encoder
is a unidirectional LM, and the source GPT's weights compute the function they were pretrained
for only under its mask; the decoder's cross-attention still reads every source position, so no
source token is hidden from the target. False runs the same weights bidirectionally (an encoder
that no longer computes what the LM learned at the start); the source LM loss is computed causally
either way.

Each stack keeps its own token table, as the paper's two LMs have their own vocabularies (here
both runs must share one tokenizer, which seq2seq fine-tuning reads). The decoder starts from EOS:
GPT's rows end every document with it, so the target LM reads it as "a text starts here".
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from bertology.families.gpt2gpt import objective
from bertology.models import Family, ModelConfig, encoder_config, flops, transformer_config
from bertology.models.transformer import Decoder, EncoderDecoder

EXTRA_KEYS = ("causal_encoder",)


class Model(EncoderDecoder):
    """Target logits [batch, target length, vocab] float32 (`logits`) under teacher forcing, or for
    the new tokens with `decode=True` (`EncoderDecoder`); `source_lm` and `target_lm` give the two
    language models' logits on the same parameters (the objective's regularisers)."""

    causal_encoder: bool = True
    decoder_start = "eos"

    def setup(self):
        cfg = dataclasses.replace(self.cfg, pooler=False)
        self.encoder = Decoder(cfg, causal=self.causal_encoder, name="encoder")
        self.decoder = Decoder(cfg.decoder_config(), cross=True, name="decoder")
        # The two LMs: the stacks' own parameters (shared scopes), run causally and, for the
        # target LM, without cross-attention (its parameters are simply not read).
        self.source_stack = Decoder(cfg)
        self.target_stack = Decoder(cfg.decoder_config())
        nn.share_scope(self.source_stack, self.encoder)
        nn.share_scope(self.target_stack, self.decoder)

    def __call__(self, batch: dict[str, jax.Array], *, deterministic: bool = True,  # type: ignore[override]
                 decode: bool = False) -> dict[str, jax.Array]:
        x = super().__call__(batch, deterministic=deterministic, decode=decode)
        return {"logits": self.cfg.real_logits(self.attend(x).astype(jnp.float32))}

    def attend(self, x: jax.Array) -> jax.Array:
        """The target LM's softmax (tied to the decoder's token table)."""
        return self.decoder.attend(x)

    def source_lm(self, batch: dict[str, jax.Array], *, deterministic: bool = True) -> jax.Array:
        """Next-token logits over the source (`input_ids`), the encoder run as the source GPT."""
        x = self.source_stack(batch, deterministic=deterministic)["sequence"]
        return self.cfg.real_logits(self.source_stack.attend(x).astype(jnp.float32))

    def target_lm(self, batch: dict[str, jax.Array], *, deterministic: bool = True) -> jax.Array:
        """Next-token logits over the decoder input (`decoder_input_ids`) without the source:
        the decoder run as the target GPT, cross-attention skipped."""
        target = {"input_ids": batch["decoder_input_ids"], "input_mask": batch["decoder_input_mask"]}
        x = self.target_stack(target, deterministic=deterministic)["sequence"]
        return self.cfg.real_logits(self.target_stack.attend(x).astype(jnp.float32))


def build(block: ModelConfig) -> Model:
    return Model(transformer_config(block, EXTRA_KEYS), causal_encoder=bool(dict(block).get("causal_encoder", True)))


def trunk(params: dict) -> dict:
    return params["encoder"]


def flops_per_token(config: ml_collections.ConfigDict, nominal: bool = False) -> float:
    """The seq2seq network (both stacks, cross-attention, output layer), as BART's count."""
    return flops.encoder_decoder(encoder_config(config.model), config.data.max_seq_length,
                                 config.data.max_target_length)


# No fine-tuning trunk: classification reads a GPT run itself (its causal trunk), not this encoder.
FAMILY = Family(Model, trunk, flops_per_token, extra_keys=EXTRA_KEYS, build=build, task_modes=(),
                seq2seq_training=objective.seq2seq_training(Model))
