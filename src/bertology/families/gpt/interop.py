"""Our `gpt` family's Hugging Face records: GPT-2 (`GPT2LMHeadModel`, pre-LN) first, then
OpenAI GPT (`OpenAIGPTLMHeadModel`, post-LN); export takes the first whose settings a run has.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from bertology.errors import UserError
from bertology.interop import hf_config, names
from bertology.interop.records import CORE, GELUS, Block, BySource, HFConfig, HFModel
from bertology.models.transformer import TransformerConfig

if TYPE_CHECKING:
    from bertology.data.tokenizers import Tokenizer


GPT2_EMBEDDINGS = (
    ("embeddings/token", "wte", "embedding"),
    ("embeddings/position", "wpe", "embedding"),
)
OPENAI_GPT_EMBEDDINGS = (
    ("embeddings/token", "tokens_embed", "embedding"),
    ("embeddings/position", "positions_embed", "embedding"),
)
GPT_LAYER = (  # GPT and GPT-2 name a block alike: ln_1 belongs to attention, ln_2 to the MLP
    ("attention_{i}/norm", "h.{i}.ln_1", "norm"),
    ("attention_{i}/query", "h.{i}.attn.c_attn", "conv1d_to_heads", (0, 3)),
    ("attention_{i}/key", "h.{i}.attn.c_attn", "conv1d_to_heads", (1, 3)),
    ("attention_{i}/value", "h.{i}.attn.c_attn", "conv1d_to_heads", (2, 3)),
    ("attention_{i}/output", "h.{i}.attn.c_proj", "conv1d_from_heads"),
    ("ffn_{i}/norm", "h.{i}.ln_2", "norm"),
    ("ffn_{i}/intermediate", "h.{i}.mlp.c_fc", "conv1d"),
    ("ffn_{i}/output", "h.{i}.mlp.c_proj", "conv1d"),
)
FINAL_NORM = (("final_norm", "ln_f", "norm"),)  # pre-LN only


@dataclasses.dataclass(frozen=True)
class FeedForwardWidth:
    """GPT-2's `n_inner` (None: 4·hidden); OpenAI GPT has no key (`key=None`) and always 4·hidden."""

    key: str | None

    def from_hf(self, hf: BySource, block: Block, where: dict[str, str]) -> None:
        inner = hf_config._main(hf)[self.key] if self.key else None
        block["intermediate_size"] = inner or 4 * block["hidden_size"]

    def to_hf(self, block: Block, cfg: TransformerConfig, hf: HFConfig, tokenizer: Tokenizer | None) -> None:
        if self.key:
            hf[self.key] = cfg.intermediate_size
        elif cfg.intermediate_size != 4 * cfg.hidden_size:
            raise UserError(f"{hf['model_type']}'s feed-forward width is 4·hidden = {4 * cfg.hidden_size}; "
                            f"model.intermediate_size={cfg.intermediate_size} has no {hf['model_type']} counterpart")


@dataclasses.dataclass(frozen=True)
class EndOfText:
    """GPT-2 begins and ends texts with its `<|endoftext|>`: export names the run tokenizer's id, so
    HF generation stops where ours does (null without a tokenizer: no id to name)."""

    def from_hf(self, hf: BySource, block: Block, where: dict[str, str]) -> None:
        pass

    def to_hf(self, block: Block, cfg: TransformerConfig, hf: HFConfig, tokenizer: Tokenizer | None) -> None:
        eos = tokenizer.eos_id if tokenizer is not None else None
        hf.update(bos_token_id=eos, eos_token_id=eos)


GPT_KEYS = (  # GPT and GPT-2 (the feed-forward width and the embedding dropout are translations)
    ("vocab_size", "vocab_size"),
    ("hidden_size", "n_embd"),
    ("num_layers", "n_layer"),
    ("num_heads", "n_head"),
    ("max_position_embeddings", "n_positions"),
    ("dropout_rate", "resid_pdrop"),
    ("attention_dropout_rate", "attn_pdrop"),
    ("layer_norm_eps", "layer_norm_epsilon"),
    ("initializer_range", "initializer_range"),
)


GPT = {**CORE, "type_vocab_size": 0, "embedding_norm": False}
GPT_DEFAULTS = dict(n_positions=512, n_embd=768, n_layer=12, n_head=12, resid_pdrop=0.1, embd_pdrop=0.1,
                    attn_pdrop=0.1, layer_norm_epsilon=1e-5, initializer_range=0.02, tie_word_embeddings=True)


GPT2_REQUIRED = dict(scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False, reorder_and_upcast_attn=False,
                     add_cross_attention=False, tie_word_embeddings=True)


GPT2 = HFModel(
    "gpt2", "gpt", {"model": "GPT2LMHeadModel"}, prefix="transformer",
    layout=(names.Part("model", "decoder", "transformer", (GPT2_EMBEDDINGS, GPT_LAYER, FINAL_NORM),
                       trunk=True),),
    keys=GPT_KEYS, activation=("activation_function", GELUS), fixed={"norm": "pre", **GPT},
    imported={"scale_residual_init": True, "pooler": False},
    defaults={**GPT_DEFAULTS, **GPT2_REQUIRED, "vocab_size": 50257, "n_positions": 1024, "n_inner": None,
              "activation_function": "gelu_new"},
    tokenizer="GPT2Tokenizer", required=GPT2_REQUIRED,
    translations=(FeedForwardWidth("n_inner"), hf_config.SameValue("embd_pdrop", "resid_pdrop", "dropout_rate"),
                  EndOfText()),
    tied={"lm_head.weight": "transformer.wte.weight"},
    generates=True,
)
OPENAI_GPT = HFModel(
    "openai-gpt", "gpt", {"model": "OpenAIGPTLMHeadModel"}, prefix="transformer",
    layout=(names.Part("model", "decoder", "transformer", (OPENAI_GPT_EMBEDDINGS, GPT_LAYER),
                       trunk=True),),
    keys=GPT_KEYS, activation=("afn", {"gelu": "gelu_tanh"}),  # its "gelu" is the tanh approximation
    fixed={"norm": "post", **GPT}, imported={"scale_residual_init": False, "pooler": False},
    defaults={**GPT_DEFAULTS, "vocab_size": 40478, "afn": "gelu"},
    tokenizer="OpenAIGPTTokenizer", required={"tie_word_embeddings": True},
    translations=(FeedForwardWidth(None), hf_config.SameValue("embd_pdrop", "resid_pdrop", "dropout_rate"),
                  EndOfText()),
    tied={"lm_head.weight": "transformer.tokens_embed.weight"},
    # transformers 5's OpenAIGPTDoubleHeadsModel ties the other way round (its `_tied_weights_keys`
    # is {"transformer.tokens_embed.weight": "lm_head.weight"}), so it saves lm_head.weight alone.
    tied_if_absent={"transformer.tokens_embed.weight": "lm_head.weight"},
    generates=True,
)

HF_RECORDS = (GPT2, OPENAI_GPT)
