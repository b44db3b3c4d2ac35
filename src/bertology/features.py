"""Contextual embeddings from any pretraining checkpoint, as a function and a CLI.

    python -m bertology.features --checkpoint runs/tiny --input sentences.txt --out features.npz \\
        [--layers=-1] [--max_seq_length=128]

`extract` returns, per sentence, the token vectors of the chosen layers (0 is the embedding
output, -1 the last layer; several are averaged) and a sentence vector: the mean over its real
tokens, [CLS] and [SEP] included. Mean pooling is used rather than [CLS] because a pretrained
[CLS] only ever learned NSP/SOP (or nothing, for RoBERTa/ELECTRA) and is a poor sentence summary
without fine-tuning. A causal trunk (GPT's) gives its last real token instead, the only one that
has read the whole sentence, as its fine-tuning head reads it. The layers are those of the trunk
fine-tuning builds (`models/tasks.py`): the family's `task_trunk` where it has one (XLNet's
content stream, MobileBERT's bottleneck stack, ELMo's biLM, GPT's causal decoder), else the
shared Encoder. An ELMo checkpoint gives its biLM's layers (0: the char
CNN's [x; x], then each LSTM layer's [forward; backward]) over the words of each sentence, read
between `<S>` and `</S>` (`models/elmo.task_inputs` says how task text becomes words). Inputs
take BERT's layout, [CLS] first and padding on the right, whatever the family. The CLI takes one
sentence per line and writes an .npz with `sentence` [n, H], `tokens` [n, max_seq_length, H]
(zero at padding), `input_ids` and `input_mask`.
"""

from __future__ import annotations

import pathlib
import re
import sys
from typing import Any, Iterator, Sequence

import numpy as np
from absl import flags

from bertology import cli
from bertology.errors import UserError
from bertology.files import atomic_file


def extract(
    checkpoint: str | pathlib.Path,
    texts: Sequence[str],
    *,
    layers: Sequence[int] = (-1,),
    max_seq_length: int = 128,
    batch_size: int = 32,
) -> dict[str, np.ndarray]:
    """{'tokens', 'sentence', 'input_ids', 'input_mask'} for `texts` under the checkpoint's encoder."""
    import jax

    trunk, variables, arrays, n_layers, causal = _trunk(checkpoint, texts, max_seq_length)
    if any(not -n_layers <= i < n_layers for i in layers):
        raise UserError(f"layers {list(layers)} out of range for {n_layers - 1} layers; use 0..{n_layers - 1} or negative")

    # The weights are an argument, not closed over: closed over, they are constants of the
    # program, which XLA compiles more slowly the larger they are (the whole embedding table).
    @jax.jit
    def run(variables: dict, batch: dict[str, Any]) -> tuple[jax.Array, jax.Array]:
        out = trunk.apply(variables, batch)["layers"]
        tokens = sum(out[i] for i in layers) / len(layers)
        tokens = tokens * batch["input_mask"][..., None]
        return tokens, _sentence(tokens, batch["input_mask"], causal)

    tokens, sentence = [], []
    for batch, n in _batches(arrays, batch_size):
        t, s = run(variables, batch)
        tokens.append(np.asarray(t)[:n])
        sentence.append(np.asarray(s)[:n])
    return {"tokens": np.concatenate(tokens), "sentence": np.concatenate(sentence),
            "input_ids": arrays["input_ids"], "input_mask": arrays["input_mask"]}


def layer_states(checkpoint: str | pathlib.Path, texts: Sequence[str] | Sequence[Sequence[str]], *,
                 max_seq_length: int = 128, batch_size: int = 32) -> dict[str, np.ndarray]:
    """{'layers' [n, layers, max_seq_length, H] (every layer of the trunk, 0 the embeddings; zero at
    padding), 'sentence' [n, layers, H] (each layer's sentence vector, as `extract` gives it),
    'input_ids', 'input_mask'}: what the analysis tools read (`bertology.analysis`).

    A sentence given as its words (a list of strings, as tagged corpora have it) is encoded word by
    word as token tagging encodes it (`tasks.encode.encode_words`), and the result has
    'word_index' [n, max_seq_length]: the word each position starts, -1 elsewhere (its later
    pieces, the specials, padding, and words cut off at max_seq_length)."""
    import jax
    import jax.numpy as jnp

    trunk, variables, arrays, _, causal = _trunk(checkpoint, texts, max_seq_length)
    words = arrays.pop("word_index", None)

    @jax.jit
    def run(variables: dict, batch: dict[str, Any]) -> tuple[jax.Array, jax.Array]:
        layers = jnp.stack(trunk.apply(variables, batch)["layers"], 1) * batch["input_mask"][:, None, :, None]
        return layers, jax.vmap(lambda x: _sentence(x, batch["input_mask"], causal), 1, 1)(layers)

    out = [[x[:n] for x in jax.device_get(run(variables, batch))] for batch, n in _batches(arrays, batch_size)]
    states = {"layers": np.concatenate([o[0] for o in out]), "sentence": np.concatenate([o[1] for o in out]),
              "input_ids": arrays["input_ids"], "input_mask": arrays["input_mask"]}
    return states if words is None else {**states, "word_index": words}


def _sentence(tokens: Any, mask: Any, causal: bool) -> Any:
    """The sentence vector of each row of `tokens` [b, L, H] (module docstring): the mean over
    its real tokens, or a causal trunk's last real token."""
    from bertology.models import tasks
    from bertology.models.transformer import last_real

    return last_real(tokens, mask) if causal else tasks.masked_mean(tokens, mask)


def attention_maps(checkpoint: str | pathlib.Path, texts: Sequence[str], *, max_seq_length: int = 128,
                   batch_size: int = 32) -> Iterator[dict[str, np.ndarray]]:
    """Per batch of `texts`: {'attention' [b, layers, heads, max_seq_length, max_seq_length] (each
    layer's softmax over the keys it may see, the rows of padding queries zero), 'input_ids',
    'input_mask'}, from the trunk fine-tuning builds, as `layer_states` reads its layers. Batches,
    not one array: the maps of a few hundred sentences of BERT-base outgrow memory.

    The maps are what every attention layer sows (`attention.sow`), in layer order: a layer
    shared by the stack (ALBERT) gives one map per application, a scanned stack one per layer. A
    trunk whose attention sows none (relative attention of its own, block-sparse) is refused."""
    import jax
    import jax.numpy as jnp

    trunk, variables, arrays, _, _ = _trunk(checkpoint, texts, max_seq_length)

    def maps(variables: dict, batch: dict[str, Any]) -> jax.Array:
        _, state = trunk.apply(variables, batch, mutable=["intermediates"])
        sown = sorted(((_natural(path), leaf) for path, leaf in jax.tree_util.tree_leaves_with_path(state)
                       if jax.tree_util.DictKey("probs") in path), key=lambda item: item[0])
        layers = [m for _, leaf in sown for m in (leaf if leaf.ndim == 5 else leaf[None])]  # scanned: [layers, ...]
        if not layers:
            return jnp.zeros((0,))
        return jnp.stack(layers, 1) * batch["input_mask"][:, None, None, :, None]

    first = {k: v[:1] for k, v in arrays.items()}
    if not jax.eval_shape(maps, variables, first).size:
        from bertology.train.checkpoint import read_json

        family = read_json(pathlib.Path(checkpoint) / "config.json", "")["model"]["family"]
        raise UserError(f"a {family} run's attention is not the shared softmax attention whose maps this reads "
                        "(its own relative or block-sparse attention); use a run of a BERT-style encoder, GPT or T5")
    run = jax.jit(maps)
    for batch, n in _batches(arrays, batch_size):
        yield {"attention": np.asarray(run(variables, batch))[:n], "input_ids": batch["input_ids"][:n],
               "input_mask": batch["input_mask"][:n]}


def _batches(arrays: dict[str, np.ndarray], batch_size: int) -> Iterator[tuple[dict[str, np.ndarray], int]]:
    """(batch, how many of its rows are real) over `arrays`, every batch of one shape: the last is
    padded with copies of its final row, so that the jitted encoder compiles once, not twice."""
    n = len(arrays["input_ids"])
    size = min(batch_size, n)
    for start in range(0, n, size):
        real = min(size, n - start)
        yield {k: np.pad(v[start:start + real], [(0, size - real)] + [(0, 0)] * (v.ndim - 1), mode="edge")
               for k, v in arrays.items()}, real


def _natural(path: tuple) -> tuple:
    """A pytree path as a sort key in which `attention_10` follows `attention_9`."""
    key: list[tuple[int, int | str]] = []
    for entry in path:
        name = getattr(entry, "key", getattr(entry, "idx", getattr(entry, "name", "")))
        for part in re.split(r"(\d+)", str(name)):
            key.append((0, int(part)) if part.isdigit() else (1, part))
    return tuple(key)


def _trunk(checkpoint: str | pathlib.Path, texts: Sequence[str] | Sequence[Sequence[str]],
           max_seq_length: int) -> tuple[Any, dict, dict, int, bool]:
    """(the trunk fine-tuning builds, its variables with the checkpoint's weights, the encoded
    `texts` (sentences given as words: with their 'word_index', see `layer_states`), its number of
    layers, whether it is causal)."""
    import flax.linen as nn
    import jax

    from bertology import models
    from bertology.data.tokenizers import for_data
    from bertology.models import tasks
    from bertology.tasks.encode import encode_pair, encode_words, stack
    from bertology.train.checkpoint import load_params
    from bertology.train.finetune import merge_pretrained

    if not texts:
        raise UserError("no input sentences; give at least one non-empty line")
    if max_seq_length < 3:
        raise UserError(f"max_seq_length={max_seq_length} leaves no room for a token between [CLS] and [SEP]; use at least 3")
    params, config = load_params(checkpoint)
    cfg, encoder_params = models.pretrained_encoder(params, config["model"])
    family = models.family(config["model"]["family"])
    tasks.check_length(cfg, max_seq_length, "max_seq_length")
    tokenizer = for_data(config["data"])
    if isinstance(texts[0], str):
        arrays = stack([encode_pair(tokenizer, t, "", max_seq_length) for t in texts])
    elif family.reads_words:
        raise UserError(f"a {config['model']['family']} run reads whole words its own way; sentences given as "
                        "words are encoded into sub-word pieces, which it does not read")
    else:
        arrays = stack([encode_words(tokenizer, words, [0] * len(words), max_seq_length) for words in texts])
        del arrays["labels"]
    if family.task_inputs is not None:  # ELMo reads each word's characters; no task kind here
        arrays = family.task_inputs(cfg, tokenizer, arrays, None)
    trunk = tasks.trunk(cfg, config["model"]["family"])  # the network fine-tuning puts under its heads
    first = {k: v[:1] for k, v in arrays.items()}
    # what only fine-tuning trains (XLNet's summary) keeps an initialisation no layer reads
    fresh = nn.meta.unbox(jax.jit(trunk.init)(jax.random.key(0), first)["params"])
    variables = {"params": merge_pretrained(fresh, encoder_params, str(checkpoint))}
    n_layers = len(jax.eval_shape(lambda: trunk.apply(variables, first))["layers"])
    return trunk, variables, arrays, n_layers, getattr(trunk, "causal", False)  # a causal stack's (`Stack.causal`)


def _flags() -> flags.FlagValues:
    fv = flags.FlagValues()
    flags.DEFINE_string("checkpoint", None, "A pretraining --workdir (config.json + checkpoints/).", flag_values=fv)
    flags.DEFINE_string("input", None, "Text file, one sentence per line.", flag_values=fv)
    flags.DEFINE_string("out", "features.npz", "Where the .npz goes.", flag_values=fv)
    flags.DEFINE_list("layers", ["-1"], "Layers to average (0 = embeddings, -1 = last).", flag_values=fv)
    flags.DEFINE_integer("max_seq_length", 128, "Tokens per sentence, [CLS]/[SEP] included.", flag_values=fv)
    return fv


def _main(fv: flags.FlagValues) -> None:
    if not fv.checkpoint or not fv.input:
        raise UserError("--checkpoint and --input are required, e.g. --checkpoint runs/tiny --input sentences.txt")
    path = pathlib.Path(fv.input)
    if not path.is_file():
        raise UserError(f"input file not found: {path}; give a text file with one sentence per line")
    from bertology.data.corpus import check_text

    check_text([path])
    texts = [line.strip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    try:
        layers = [int(i) for i in fv.layers]
    except ValueError:
        raise UserError(f"--layers={','.join(fv.layers)} is not a list of layer numbers; "
                        "e.g. --layers=-1 or --layers=0,-1") from None
    out = extract(fv.checkpoint, texts, layers=layers, max_seq_length=fv.max_seq_length)
    path = fv.out if fv.out.endswith(".npz") else fv.out + ".npz"  # the name np.savez would give
    with atomic_file(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, **out)
    print(f"wrote {path}: {len(texts)} sentences, sentence vectors {out['sentence'].shape}, tokens {out['tokens'].shape}")


def main(argv: list[str] | None = None) -> int:
    """Run the command line (`argv` as sys.argv, program name first); return the exit status."""
    return cli.run_flags("bertology.features", __doc__, _flags(), _main, argv)


if __name__ == "__main__":
    sys.exit(main())
