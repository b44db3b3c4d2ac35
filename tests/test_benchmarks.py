"""The benchmark harness runs end to end on toy shapes and counts what it claims to count."""

import json

import flax.linen as nn
import jax
import pytest

from benchmarks import memory, padding, pipeline, reference, train_step, train_step_gpt, train_step_seq2seq
from bertology import models, objectives
from bertology.errors import UserError
from bertology.interop import export_hf
from bertology.interop.hf import write_run
from bertology.models import flops
from bertology.train.step import param_init


def test_flops_per_token_of_bert_base_with_the_gathered_head():
    config = train_step.bert_config("base", 30522, "float32", "none")
    config.data.max_seq_length, config.data.max_predictions_per_seq = 128, 20
    ours = models.flops_per_token(config)
    # The last layer's queries, attention and MLP, per query row; they run at the 20 gathered rows + [CLS].
    last_layer_rows = 2 * 2 * 768 * 768 + 2 * 2 * 768 * 3072 + 2 * 2 * 128 * 768
    skipped = 3 * (107 / 128) * last_layer_rows
    # The figure: ~546 MFLOPs/token for BERT-base, seq 128, 20 gathered predictions (full last layer).
    assert ours + skipped == pytest.approx(546.3e6, rel=1e-3)
    # Hugging Face's model runs the last layer and the MLM head at every position.
    full = flops.masked_lm(models.encoder_config(config.model), 128, 128, nominal=False, rows=128, sentence=True)
    head = 3 * (108 / 128) * (2 * 768 * 768 + 2 * 768 * 30522)
    assert full - ours == pytest.approx(head + skipped)
    # The nominal count (the equal-FLOP sweep's) is the paper-style formula: full stack + MLM head.
    nominal = 6 * (12 * 12 * 768**2 + 2 * 12 * 128 * 768) + 6 * (768 * 768 + 768 * 30522) * 20 / 128
    assert models.flops_per_token(config, nominal=True) == pytest.approx(nominal)


@pytest.mark.slow
def test_train_step_against_hugging_face_writes_json_and_markdown(tmp_path, hf_flax):
    row = train_step.main(["--preset", "tiny", "--batch_size", "2", "--seq_len", "16", "--predictions", "2",
                           "--vocab_size", "128", "--steps", "1", "--peak_flops", "1e12", "--out", str(tmp_path)])
    assert row["tokens_per_s"] > 0 and row["hf_tokens_per_s"] > 0
    assert row["ratio"] == pytest.approx(row["tokens_per_s"] / row["hf_tokens_per_s"])
    assert row["mfu"] == pytest.approx(row["tokens_per_s"] * row["flops_per_token"] / 1e12)
    (line,) = (tmp_path / "train_step.jsonl").read_text().splitlines()
    assert json.loads(line) == row
    header, rule, cells = (tmp_path / "train_step.md").read_text().splitlines()
    assert header.startswith("| preset | batch_size") and cells.startswith("| tiny | 2 | 16 | float32 |")


def test_gpt2_flops_per_token_is_palms_formula():
    config = train_step.recipe_config("gpt", "gpt2", 50257, "float32", "none")
    config.data.max_seq_length = 1024
    # PaLM (Chowdhery et al. 2022, app. B): 6N + 12·L·H·Q·T, N the weights every token multiplies
    # (12 layers of 12·d² and the tied 50257 x 768 output layer), full (non-causal) attention.
    n = 12 * 12 * 768**2 + 768 * 50257
    assert models.flops_per_token(config) == pytest.approx(6 * n + 12 * 12 * 12 * 64 * 1024)


def test_gpt_batch_makes_our_loss_hugging_faces_shifted_loss_on_the_same_shapes(hf_flax):
    config = train_step.recipe_config("gpt", "tiny", 128, "float32", "none")
    batch = train_step_gpt.causal_batch(128, 3, 16, seed=1)
    model = models.build(config.model)
    params = nn.meta.unbox(jax.jit(param_init(model, batch))(jax.random.key(0)))
    ours, _ = objectives.get(config.objective)(params, batch, None, model)
    logits = model.apply({"params": params}, batch)["logits"]
    assert float(ours) == pytest.approx(float(reference.shifted_cross_entropy(logits, batch["input_ids"])), rel=1e-5)
    # The reference is the same network: GPT-2's GPT2Config from our block, parameter for parameter.
    hf = reference.hf_gpt2_model(dict(config.model))
    assert (hf.config.n_layer, hf.config.n_embd, hf.config.activation_function) == (2, 128, "gelu_new")
    sizes = [sum(x.size for x in jax.tree.leaves(p)) for p in (params, hf.params)]
    assert sizes[0] == sizes[1]


def test_gpt_benchmark_refuses_what_it_cannot_compare(tmp_path, hf_flax):
    with pytest.raises(UserError, match="model.norm='pre'"):  # GPT-1 is post-LN: no FlaxGPT2 counterpart
        reference.hf_gpt2_model(dict(train_step.recipe_config("gpt", "gpt1", 40478, "float32", "none").model))
    with pytest.raises(UserError, match="--seq_len 256 exceeds preset tiny's 128 positions"):
        train_step_gpt.main(["--preset", "tiny", "--seq_len", "256", "--vocab_size", "128", "--out", str(tmp_path)])


def test_gpt_train_step_against_hugging_face_writes_its_own_table(tmp_path, hf_flax):
    row = train_step_gpt.main(["--preset", "tiny", "--batch_size", "2", "--seq_len", "16", "--vocab_size", "128",
                               "--steps", "1", "--peak_flops", "1e12", "--out", str(tmp_path)])
    assert row["tokens_per_s"] > 0 and row["hf_tokens_per_s"] > 0
    assert row["ratio"] == pytest.approx(row["tokens_per_s"] / row["hf_tokens_per_s"])
    assert row["mfu"] == pytest.approx(row["tokens_per_s"] * row["flops_per_token"] / 1e12)
    (line,) = (tmp_path / "train_step_gpt.jsonl").read_text().splitlines()
    assert json.loads(line) == row
    header, rule, cells = (tmp_path / "train_step_gpt.md").read_text().splitlines()
    assert header.startswith("| preset | batch_size") and cells.startswith("| tiny | 2 | 16 | float32 |")
    assert not (tmp_path / "train_step.md").exists()  # BERT's table stays BERT's


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["t5", "bart"])
def test_seq2seq_reference_is_the_same_network_with_the_same_loss(recipe, tmp_path, hf_flax):
    config = train_step.recipe_config(recipe, "tiny", 96, "float32", "none")
    block = dict(config.model)
    if recipe == "t5":  # T5's one dropout rate covers the feed-forward hidden layer too, as HF's T5
        assert config.model.activation_dropout_rate == config.model.dropout_rate > 0
    batch = train_step_seq2seq.seq2seq_batch(96, 4, 12, 7, train_step_seq2seq.START[recipe], seed=1)
    assert batch["input_mask"][3].sum() == 6 and batch["target_weights"][3].sum() == 3  # padding in both inputs
    model = models.build(config.model)
    params = nn.meta.unbox(jax.jit(param_init(model, batch))(jax.random.key(0)))
    hf, hf_params = reference.hf_seq2seq_model(dict(config.model))
    sizes = [sum(x.size for x in jax.tree.leaves(p)) for p in (params, hf_params)]
    assert sizes[0] == sizes[1]
    # Our parameters in transformers' Flax model (through our HF export) give our loss.
    write_run(tmp_path / "run", block, params)  # the exportable block (equal when deterministic)
    (out,) = export_hf(tmp_path / "run", tmp_path / "hf")
    converted = type(hf).from_pretrained(out, from_pt=True)
    # jitted: run eagerly, the two forwards compiled some 300 one-op programs (13 of the test's 20 s)
    ours = jax.jit(lambda p: objectives.get(config.objective)(p, batch, None, model)[0])(params)
    theirs = jax.jit(lambda p: reference.hf_seq2seq_loss(p, batch, None, converted)[0])(converted.params)
    assert float(ours) == pytest.approx(float(theirs), rel=1e-5)
    assert float(ours) > 0


def test_seq2seq_train_step_against_hugging_face_writes_its_own_table(tmp_path, hf_flax):
    row = train_step_seq2seq.main(["--recipe", "bart", "--preset", "tiny", "--batch_size", "2", "--seq_len", "16",
                                   "--vocab_size", "128", "--steps", "1", "--peak_flops", "1e12", "--out", str(tmp_path)])
    assert row["target_len"] == 16  # BART reconstructs the whole source
    assert row["ratio"] == pytest.approx(row["tokens_per_s"] / row["hf_tokens_per_s"])
    assert row["mfu"] == pytest.approx(row["tokens_per_s"] * row["flops_per_token"] / 1e12)
    (line,) = (tmp_path / "train_step_seq2seq.jsonl").read_text().splitlines()
    assert json.loads(line) == row
    header, rule, cells = (tmp_path / "train_step_seq2seq.md").read_text().splitlines()
    assert cells.startswith("| bart:tiny | 2 | 16 | float32 |")
    with pytest.raises(UserError, match="--seq_len 256 / target 256 exceeds preset tiny's 128 positions"):
        train_step_seq2seq.main(["--recipe", "bart", "--preset", "tiny", "--seq_len", "256", "--out", str(tmp_path)])
    with pytest.raises(UserError, match="has no Flax seq2seq reference"):
        reference.hf_seq2seq_model(dict(train_step.recipe_config("gpt", "tiny", 128, "float32", "none").model))


def tiny_batch(config):
    return train_step.random_batch(models.encoder_config(config.model), 8, 64, 4)


def test_memory_per_strategy():
    config = train_step.bert_config("tiny", 1024, "float32", "none")
    dp, fsdp = (memory.state_mib_per_device(memory.abstract_state(config, tiny_batch(config), memory.mesh_config(s, (8, 1)))[1])
                for s in ("dp", "fsdp"))
    assert fsdp == pytest.approx(dp / 8, rel=0.01)
    assert memory.compiled_mib(config, tiny_batch(config))["temporaries"] > 0


def test_remat_keeps_fewer_activations():
    temps = {}
    for remat in ("none", "full"):  # mini at 32 x 128: activations dominate the temporaries
        config = train_step.bert_config("mini", 1024, "float32", remat)
        batch = train_step.random_batch(models.encoder_config(config.model), 32, 128, 20)
        temps[remat] = memory.compiled_mib(config, batch)["temporaries"]
    assert 0 < temps["full"] < temps["none"]  # remat keeps fewer activations for the backward pass


@pytest.mark.slow
def test_pipeline_and_padding_on_the_embedded_corpus(capsys):
    out = pipeline.main(["--batch_size", "64", "--passes", "1"])
    assert out["examples"] >= out["instances_per_pass"] and out["examples_per_s"] > 0
    fractions = padding.main([])
    assert fractions["packed"] < fractions["one document per row"] / 4


@pytest.mark.slow
def test_accelerator_smoke_measures_ours_against_pytorch(tmp_path):
    """`python -m benchmarks.accelerator --smoke`: every case trains, taking turns with the
    PyTorch reference, and the row's MFU arithmetic is what it says."""
    from benchmarks import accelerator

    rows = accelerator.main(["--smoke", "--out", str(tmp_path), "--peak_flops", "1e12", "--cases", "gpt2,bert128,t5",
                             "--hlo", str(tmp_path / "hlo"), "--variant", "exact:xla_cpu_enable_fast_math=false",
                             "--variant", "ln:model.norm_backward=written_out", "--variant_cases", "gpt2"])
    assert [r["case"] for r in rows] == ["gpt2", "gpt2[exact]", "gpt2[ln]", "bert128", "t5"]  # in the order asked for
    exact, ln = rows.pop(1), rows.pop(1)
    for variant in (exact, ln):
        assert variant["ran"] == "xla" and variant["step_ms"] > 0, variant  # compiled and timed, not "failed: ..."
    assert exact["options"] == {"xla_cpu_enable_fast_math": False}
    assert ln["options"] == {"model.norm_backward": "written_out"}
    hlo = {name: (tmp_path / "hlo" / f"{name}.hlo.txt").read_text() for name in ("gpt2", "gpt2[ln]")}
    assert hlo["gpt2"] != hlo["gpt2[ln]"]  # the setting reached the compiled program
    for row in rows:
        assert row["ran"] == "xla", row  # auto on a CPU
        assert row["tokens_per_s"] > 0 and row["hf_tokens_per_s"] > 0
        assert row["mfu"] == pytest.approx(row["tokens_per_s"] * row["flops_per_token"] / 1e12)
        assert row["ratio"] == pytest.approx(row["tokens_per_s"] / row["hf_tokens_per_s"])
        assert row["ours_bytes"] > 0
        assert "fusion" in (tmp_path / "hlo" / f"{row['case']}.hlo.txt").read_text()  # the compiled program
    table = (tmp_path / "accelerator.md").read_text()
    assert table.count("| bert128 |") == 1 and '"backend": "cpu"' in table
    assert accelerator.peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert accelerator.peak_flops("NVIDIA H100 PCIe") == 756e12


def test_device_timeline_counts_overlapping_kernels_once():
    """`accelerator.timeline`: the busy time is the union of the kernels' intervals (two streams
    overlapping count once), so the idle share is the gaps between them."""
    from benchmarks.accelerator import timeline

    # [0, 4) and [2, 6) overlap (6 busy), a gap to [10, 12) and [11, 12) inside it, unsorted
    span, busy = timeline([(10.0, 12.0), (2.0, 6.0), (0.0, 4.0), (11.0, 12.0)])
    assert (span, busy) == (12.0, 8.0)
    assert timeline([(5.0, 7.0)]) == (2.0, 2.0)


def test_kernels_smoke_formulations_compute_the_same_function(tmp_path):
    """`python -m benchmarks.kernels --smoke`: every piece's formulations (the written-out
    LayerNorm and GELU backward passes, the bias gradients) agree with the first (flax's, or
    autodiff's) to bf16 rounding, for every output."""
    from benchmarks import kernels

    rows = kernels.main(["--smoke", "--out", str(tmp_path)])
    assert {r["piece"] for r in rows} == set(kernels.PIECES)
    assert {(r["piece"], r["formulation"]) for r in rows} >= {("layer_norm", "written_out"), ("gelu", "written_out"),
                                                            ("dense", "ones_matmul"), ("bias_grad", "two_stage")}
    for row in rows:
        assert row["difference"] < 2e-2, row  # bf16 outputs: a few units in their last place
        assert row["us"] > 0
    assert (tmp_path / "kernels.md").read_text().count("| gelu |") == 2



def test_every_pre_bert_row_fine_tunes_in_its_pretraining_vocabulary():
    """A from-scratch row builds the network and tokenizer its family pretrains with (GPT: the
    byte-level BPE, not the fine-tuning default WordPiece), so it differs from its family's
    pretrained row by the initialisation alone (a pretrained row's come from its checkpoint)."""
    from benchmarks import pre_bert_table as table

    scratch_rows = [row for row in table.ROWS if row[2] is None]
    assert {row[4] for row in scratch_rows} == {"lstm_lm", "gpt", "bert"}
    for name, _, _, mode, scratch, encoder, file in scratch_rows:
        c, pre = table.finetune_config(None, mode, scratch, 1, 64, encoder, file), table.pretrain_config(scratch, 1, 16, 32)
        assert (c.data.vocab, c.model.to_dict()) == (pre.data.vocab, pre.model.to_dict()), name
