"""MobileBERT: Hugging Face parity of the model (import, logits, export) in its variants; the
progressive knowledge transfer's terms against numpy; stage l changing layer l's parameters only;
and a tiny progressive run whose losses fall with the teacher bit-identical."""

import os
import pathlib
import sys

import flax.linen as nn
import jax
import ml_collections
import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bertology import models  # noqa: E402
from bertology.errors import UserError  # noqa: E402
from bertology.interop import export_hf, import_hf  # noqa: E402
from bertology.train.checkpoint import load_params  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "configs"))

V, L, B = 97, 12, 3
LENGTHS = (12, 9, 4)
SMALL = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=24,
             embedding_size=16, intra_bottleneck_size=16, num_feedforward_networks=3, max_position_embeddings=16)
VARIANTS = {  # HF MobileBertConfig keys beyond SMALL
    "paper": {},  # no_norm, trigram input, shared key/query bottleneck, pooler with tanh
    "layer_norm": dict(normalization_type="layer_norm", use_bottleneck_attention=True, trigram_input=False,
                       classifier_activation=False, hidden_act="gelu"),
    "no_bottleneck": dict(use_bottleneck=False, num_feedforward_networks=1, normalization_type="layer_norm"),
}


def _hf_batch(seed=0):
    rng = np.random.default_rng(seed)
    mask = (np.arange(L)[None] < np.array(LENGTHS)[:, None]).astype(np.int32)
    ids = np.where(mask > 0, rng.integers(1, V, (B, L)), 0).astype(np.int32)
    segments = (np.arange(L)[None] >= 5).astype(np.int32) * mask
    return dict(input_ids=ids, input_mask=mask, segment_ids=segments,
                masked_positions=np.broadcast_to(np.arange(L), (B, L)).astype(np.int32))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_hf_mobilebert_imports_computes_the_same_logits_and_exports_back(variant, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf = transformers.MobileBertForPreTraining(transformers.MobileBertConfig(**{**SMALL, **VARIANTS[variant]})).eval()
    with torch.no_grad():  # random values everywhere (norms and biases too), so a swapped tensor shows
        for p in hf.parameters():
            p.normal_(0.0, 0.2)
    hf.save_pretrained(tmp_path / "hf")
    report = import_hf(tmp_path / "hf", tmp_path / "run")
    assert (report.family, report.fresh, report.unused) == ("mobilebert", [], [])
    params, config = load_params(tmp_path / "run")
    model = models.build(ml_collections.ConfigDict(config["model"]))
    batch = _hf_batch()
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
                 attention_mask=torch.tensor(batch["input_mask"]),
                 token_type_ids=torch.tensor(batch["segment_ids"], dtype=torch.long))
    out = model.apply({"params": params}, batch)
    mlm, want = np.asarray(out["mlm_logits"]), ref.prediction_logits.numpy()
    for row, n in enumerate(LENGTHS):  # at real tokens; padding rows are nobody's prediction
        np.testing.assert_allclose(mlm[row, :n], want[row, :n], atol=1e-4, rtol=0)
    np.testing.assert_allclose(np.asarray(out["nsp_logits"]), ref.seq_relationship_logits.numpy(), atol=1e-4, rtol=0)

    export_hf(tmp_path / "run", tmp_path / "out")
    back, info = transformers.MobileBertForPreTraining.from_pretrained(tmp_path / "out", output_loading_info=True)
    assert info["missing_keys"] == [] and info["unexpected_keys"] == [] and info["mismatched_keys"] == []
    original = hf.state_dict()
    for name, tensor in back.state_dict().items():
        np.testing.assert_array_equal(tensor.numpy(), original[name].numpy(), err_msg=name)


def test_masked_positions_read_the_full_pass_and_trigram_stays_inside_packed_documents():
    model = models.build(ml_collections.ConfigDict({"family": "mobilebert", **_block()}))
    batch = _hf_batch()
    params = nn.meta.unbox(model.init(jax.random.key(0), batch)["params"])
    full = np.asarray(model.apply({"params": params}, batch)["mlm_logits"])
    picked = {**batch, "masked_positions": np.array([[3, 0], [8, 2], [1, 1]], np.int32)}
    part = np.asarray(model.apply({"params": params}, picked)["mlm_logits"])
    np.testing.assert_allclose(part, full[np.arange(B)[:, None], picked["masked_positions"]], atol=1e-5)
    # two documents packed in one row give each the embeddings it has alone
    embed = lambda b: np.asarray(model.apply({"params": params}, b, False,  # noqa: E731
                                             method=lambda m, b, d: m.encoder.embeddings(b, d)))
    ids = batch["input_ids"][:1]
    packed = dict(input_ids=ids, packing_ids=np.array([[1] * 5 + [2] * 7], np.int32),
                  positions=np.array([list(range(5)) + list(range(7))], np.int32))
    alone = dict(input_ids=ids[:, 5:], positions=np.arange(7)[None].astype(np.int32))
    np.testing.assert_allclose(embed(packed)[:, 5:], embed(alone), atol=1e-6)


def _block(**extra):
    return {**dict(vocab_size=V, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=24, embedding_size=16,
                   intra_bottleneck_size=16, num_feedforward_networks=2, max_position_embeddings=16, activation="relu",
                   dropout_rate=0.0, attention_dropout_rate=0.0), **extra}


def test_bad_settings_are_one_line_errors():
    for extra, message in ((dict(normalization_type="batch_norm"), "normalization_type='batch_norm' is unknown"),
                           (dict(norm="pre"), "model.norm='pre' is not read by MobileBERT"),
                           (dict(embedding_size=64), "embedding_size=64 exceeds hidden_size=32"),
                           (dict(num_feedforward_networks=0), "at least 1")):
        with pytest.raises(UserError, match=message):
            models.build(ml_collections.ConfigDict({"family": "mobilebert", **_block(**extra)}))
