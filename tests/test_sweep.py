"""The sweep's variants: step counts at equal FLOPs from the FLOP counter, and a seq2seq-scored
sweep end to end whose table holds the fine-tuning runs' ROUGE."""

import json
import pathlib
import re
import shutil

import ml_collections
import numpy as np
import pytest
from helpers import REPO

from bertology import models, sweep, validation
from bertology.data.noising import random_spans_lengths
from bertology.errors import UserError
from bertology.models import flops

T5_VOCAB = 8000 + 100  # the shipped unigram plus T5's 100 sentinels


def config(**kw) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict(dict(
        configs_dir=str(REPO / "configs"), families=("t5",), reference="t5", budgets=(0.5, 1.0),
        reference_steps=100, batch_size=8, max_seq_length=64, mesh_shape=(-1, 1), scratch="t5",
        variants=(dict(name="deshuffle", config="t5.py:tiny",
                       overrides=dict(data=dict(noise=dict(kind="deshuffle"), max_target_length=64))),),
        finetune=dict(seq2seq=dict(total_steps=2, batch_size=8, eval_examples=8, eval_batch_size=8,
                                   data=dict(max_seq_length=32, max_target_length=12),
                                   generation=dict(max_new_tokens=6)))))
    c.update(kw)
    return c


def t5_step_flops(source: int, target: int, batch: int) -> float:
    """One training step of tiny T5 (L2/H128, 2 heads of 64, ReLU 512) by the encoder-decoder count."""
    cfg = models.TransformerConfig(vocab_size=T5_VOCAB, hidden_size=128, num_layers=2, num_heads=2, head_size=64,
                                   intermediate_size=512, activation="relu")
    return flops.encoder_decoder(cfg, source, target) * batch * source


def test_two_variants_of_one_family_get_the_steps_their_flops_buy():
    """T5's span corruption (decoder rows of 14 at 64 tokens) against deshuffling (rows of 64):
    the reference buys exactly budget x reference_steps, deshuffling the steps its dearer
    decoder allows for the same FLOPs."""
    span_target = random_spans_lengths(64, 0.15, 3.0)[1]
    assert span_target == round(29 / 128 * 64) == 14  # at 64 the sweep's scaled 128 -> 29 is the exact length
    span, shuffle = t5_step_flops(64, span_target, 8), t5_step_flops(64, 64, 8)
    assert shuffle > 2 * span  # the output layer over 8,100 tokens at every target position dominates
    runs = {(r["variant"], r["budget"]): r for r in sweep.plan(config())}
    for budget in (0.5, 1.0):
        assert runs["t5", budget]["steps"] == 100 * budget
        assert runs["t5", budget]["flops"] == pytest.approx(100 * budget * span)
        expected = round(100 * budget * span / shuffle)
        assert runs["deshuffle", budget]["steps"] == expected
        assert runs["deshuffle", budget]["flops"] == pytest.approx(expected * shuffle)
        assert abs(runs["deshuffle", budget]["flops"] - runs["t5", budget]["flops"]) <= shuffle / 2


def test_a_variant_started_from_another_run_splits_its_budget():
    """bert2bert: init_share of the budget buys tiny-BERT steps, the rest its own; the total
    stays the budget within a step of each."""
    c = config(budgets=(1.0,), variants=(dict(name="b2b", config="bert2bert.py:tiny", init_from="bert.py:tiny",
                                              init_share=0.25),))
    runs = {r["variant"]: r for r in sweep.plan(c)}
    budget = runs["t5"]["flops"]
    bert = sweep._per_step(sweep._pretrain_config(c, "bert.py:tiny", 1))
    own = sweep._per_step(sweep._pretrain_config(c, "bert2bert.py:tiny", 1))
    assert runs["b2b"]["init_steps"] == round(0.25 * budget / bert)
    assert runs["b2b"]["steps"] == round(0.75 * budget / own)
    assert runs["b2b"]["flops"] == pytest.approx(budget, abs=(bert + own) / 2)


@pytest.mark.parametrize("change, message", [
    (dict(reference="gpt9"), "reference='gpt9'"),
    (dict(variants=(dict(name="t5", config="t5.py:tiny"),)), "repeat"),
    (dict(variants=(dict(name="x", config="t5.py:tiny", overide={}),)), "must have"),
])
def test_bad_variants_are_refused(change, message):
    with pytest.raises(UserError, match=message):
        sweep.plan(config(**change))


@pytest.mark.slow
def test_seq2seq_sweep_end_to_end(tmp_path):
    """Tiny T5 pretrained and fine-tuned, against T5 from scratch; the table's ROUGE columns are
    the fine-tuning runs' own results, and the steps are the plan's. (A variant's overrides
    reaching its run are checked in the bookkeeping test below, which trains nothing.)"""
    c = config(budgets=(1.0,), reference_steps=2, variants=())
    rows = sweep.sweep(c, tmp_path)
    assert [r["variant"] for r in rows] == ["scratch", "t5"]
    table = (tmp_path / "table.md").read_text().splitlines()
    assert table[0].split("|")[-5:-1] == [" perplexity ", " ROUGE-1 ", " ROUGE-2 ", " ROUGE-L "]
    planned = {r["variant"]: r["steps"] for r in sweep.plan(c)}
    for row, line in zip(rows, table[2:], strict=True):
        tag = "scratch" if row["variant"] == "scratch" else f"{row['variant']}_x1"
        result = json.loads((tmp_path / "finetune" / tag / "seq2seq" / "results.json").read_text())["scores"]
        cells = [c.strip() for c in line.split("|")[1:-1]]
        assert cells[0] == row["variant"]
        assert cells[2] == str(planned.get(row["variant"], 0))
        assert [float(x) for x in cells[4:]] == [round(result[k], 2) for k in ("perplexity", "rouge1", "rouge2", "rougeL")]
        assert all(re.fullmatch(r"\d+\.\d\d", x) for x in cells[4:])
    saved = json.loads((tmp_path / "pretrain" / "t5_x1" / "config.json").read_text())
    assert saved["total_steps"] == planned["t5"]
    assert (tmp_path / "score_vs_flops.png").stat().st_size > 0


def test_a_failed_run_is_recorded_and_the_sweep_goes_on(tmp_path, monkeypatch):
    """Pretraining is replaced by a stand-in that writes the checkpoint directory `train` would
    (or fails for one variant), fine-tuning by fixed scores: the sweep's bookkeeping alone."""
    from bertology.errors import Diverged, Preempted
    from bertology.train import loop

    c = config(budgets=(1.0,), reference_steps=4)
    steps = {r["variant"]: r["steps"] for r in sweep.plan(c)}
    trained, failing = [], {"deshuffle"}

    def fake_train(pc, workdir):
        name = pathlib.Path(workdir).name
        trained.append(name)
        assert pc.total_steps == steps[name.removesuffix("_x1")]
        # the variant's overrides, applied over the sweep's shapes
        noise = pc.data.get("noise") or {}
        assert (noise.get("kind"), pc.data.max_target_length) == (
            ("deshuffle", 64) if name == "deshuffle_x1" else (None, 14))
        if name.removesuffix("_x1") in failing:
            raise Diverged("loss was nan at steps 3-7; lower the learning rate")
        (pathlib.Path(workdir) / "checkpoints" / str(pc.total_steps)).mkdir(parents=True)

    monkeypatch.setattr(loop, "train", fake_train)
    monkeypatch.setattr(sweep, "_finetune", lambda c, family, init, workdir, seed: dict(
        perplexity=9.0, rouge1=1.0, rouge2=2.0, rougeL=3.0))
    with pytest.raises(UserError, match=r"1 of 3 sweep runs failed \(deshuffle x1: Diverged: loss was nan"):
        sweep.sweep(c, tmp_path)
    assert trained == ["t5_x1", "deshuffle_x1"]
    rows = json.loads((tmp_path / "sweep.json").read_text())
    assert [r.get("failed") for r in rows] == [None, None, "Diverged: loss was nan at steps 3-7; lower the learning rate"]
    assert rows[1]["rougeL"] == 3.0
    table = (tmp_path / "table.md").read_text()
    assert "| deshuffle | 1 | " in table and table.rstrip().endswith("- deshuffle × 1: Diverged: loss was nan at "
                                                                      "steps 3-7; lower the learning rate")
    # the rerun retries the failed run only; a run preempted before its last step is trained on
    failing.clear()
    trained.clear()
    shutil.rmtree(tmp_path / "pretrain" / "t5_x1" / "checkpoints" / str(steps["t5"]))
    (tmp_path / "pretrain" / "t5_x1" / "checkpoints" / "1").mkdir()
    rows = sweep.sweep(c, tmp_path)
    assert trained == ["t5_x1", "deshuffle_x1"] and not any("failed" in r for r in rows)
    assert "Failed runs" not in (tmp_path / "table.md").read_text()
    # a preemption is not a failed run: it ends the sweep (to be requeued)
    monkeypatch.setattr(loop, "train", lambda pc, workdir: (_ for _ in ()).throw(Preempted("SIGTERM")))
    with pytest.raises(Preempted):
        sweep.sweep(c, tmp_path / "again")


def test_several_seeds_run_every_run_once_each_and_the_table_gives_medians(tmp_path, monkeypatch):
    """With `seeds`, each pretraining and fine-tuning run happens once per seed (the seed in its
    config, its own workdir); table.md gives each score's median over the seeds with the lowest
    and highest, and a failed seed is left out of its median."""
    from bertology.errors import Diverged
    from bertology.train import loop

    c = config(budgets=(1.0,), reference_steps=4, seeds=(0, 1, 2))
    trained, tuned = [], []

    def fake_train(pc, workdir):
        trained.append((pathlib.Path(workdir).name, pc.seed))
        if pathlib.Path(workdir).name == "deshuffle_x1_seed2":
            raise Diverged("loss was nan")
        (pathlib.Path(workdir) / "checkpoints" / str(pc.total_steps)).mkdir(parents=True)

    def fake_finetune(c, family, init, workdir, seed=0):
        tuned.append((pathlib.Path(workdir).name, seed))
        return dict(perplexity=10.0 - seed, rouge1=1.0, rouge2=2.0, rougeL=10.0 * (seed + 1) + (init is not None))

    monkeypatch.setattr(loop, "train", fake_train)
    monkeypatch.setattr(sweep, "_finetune", fake_finetune)
    with pytest.raises(UserError, match=r"1 of 9 sweep runs failed \(deshuffle x1 seed 2: Diverged"):
        sweep.sweep(c, tmp_path)
    assert trained == [(f"{v}_x1_seed{s}", s) for v in ("t5", "deshuffle") for s in range(3)]
    assert tuned[:3] == [(f"scratch_seed{s}", s) for s in range(3)] and ("t5_x1_seed1", 1) in tuned
    rows = json.loads((tmp_path / "sweep.json").read_text())
    assert [r["seed"] for r in rows] == [0, 1, 2] * 3
    table = (tmp_path / "table.md").read_text()
    assert "| seeds |" in table.splitlines()[0]
    assert "| scratch | 0 | 0 | 0.00e+00 | 3 | 9.00 [8.00–10.00] | 1.00 [1.00–1.00] | 2.00 [2.00–2.00] | " \
           "20.00 [10.00–30.00] |" in table
    assert "| 3 | 9.50 [9.00–10.00] | 1.00 [1.00–1.00] | 2.00 [2.00–2.00] | 16.00 [11.00–21.00] |" in table  # deshuffle
    assert table.rstrip().endswith("- deshuffle × 1 seed 2: Diverged: loss was nan")


def test_the_electra_efficiency_sweep_is_the_papers_ablation():
    c = sweep.load_config(REPO / "configs/sweep/electra_efficiency.py")
    names = [v.name for v in sweep.variants(c)]
    assert names == ["bert", "electra_15", "replace_mlm", "all_tokens_mlm", "electra"] and len(c.seeds) >= 3
    objectives = [sweep._load(c, v.config).objective.get("variant") for v in sweep.variants(c)[1:]]
    assert objectives == ["electra_15", "replace_mlm", "all_tokens_mlm", "electra"]


def test_the_spanbert_masking_sweep_compares_the_papers_schemes():
    """Five variants that differ in their masking alone; on the same rows, the masked runs of
    random spans are longer than those of whole words, which are at least those of subwords,
    and the entity and phrase schemes mask their lexicon's entries whole."""
    from bertology.data import transforms
    from bertology.data.embedded import LEXICONS
    from bertology.data.lexicon import LexiconMatcher
    from bertology.data.tokenizers import for_data

    c = sweep.load_config(REPO / "configs/sweep/spanbert_masking.py")
    names = [v.name for v in sweep.variants(c)]
    assert names == ["roberta", "whole_word", "named_entity", "noun_phrase", "geometric_span"] and len(c.seeds) >= 3
    text = ("the sys.path list names the directories searched for modules, and the os.environ mapping holds the "
            "environment of the process; the standard library compiles a regular expression once and reuses it")
    runs, configs = {}, {}
    for v in sweep.variants(c):
        pc = configs[v.name] = sweep._pretrain_config(c, v.config, 10, v.overrides)
        validation.check(pc)
        tok = for_data(pc.data)
        ids = np.array([[tok.cls_id, *tok.encode(text), tok.sep_id]] * 200, np.int32)
        out = transforms.make(pc.data, tok).corrupt({"input_ids": ids}, np.random.default_rng(0))
        lexicon = pc.data.get("lexicon")
        entries = LexiconMatcher(LEXICONS[lexicon], tok).spans(ids[0]) if lexicon else []
        assert len(entries) == {"entities": 2, "phrases": 2, None: 0}[lexicon]
        lengths = []
        for r in range(len(ids)):
            chosen = np.zeros(ids.shape[1] + 1, bool)
            chosen[out["masked_positions"][r][out["masked_weights"][r] > 0]] = True
            edges = np.flatnonzero(np.diff(np.concatenate([[0], chosen.astype(np.int8)])))
            lengths += (edges[1::2] - edges[::2]).tolist()
            for a, b in entries:
                assert chosen[a:b].sum() in (0, b - a), (v.name, tok.decode(ids[r, a:b].tolist()))
        runs[v.name] = np.mean(lengths)
    assert {k: (pc.objective, pc.data.instances, pc.data.masking) for k, pc in configs.items()} == {
        k: ("roberta", "full_sentences", "dynamic") for k in names}
    assert [(configs[k].data.mask_unit, configs[k].data.get("lexicon")) for k in names] == [
        ("token", None), ("whole_word", None), ("entity", "entities"), ("entity", "phrases"), ("span", None)]
    assert runs["geometric_span"] > runs["whole_word"] + 0.5 and runs["whole_word"] >= runs["roberta"], runs


def test_the_roberta_batch_sweep_trades_steps_for_batch_at_equal_rows(tmp_path):
    """RoBERTa's Table 3 in miniature: each variant's own batch_size buys steps × batch equal to
    the reference's rows (so equal FLOPs) at the paper's rate ratios (× 7 at × 8 the batch, × 10
    at × 32); the run's config gets that batch, rate and a 10% warm-up, and the table shows steps × batch."""
    c = sweep.load_config(REPO / "configs/sweep/roberta_batch.py")
    runs = sweep.plan(c)
    assert [(r["variant"], r["batch"], r["steps"]) for r in runs] == [
        ("batch_16", 16, 1200), ("batch_128", 128, 150), ("batch_512", 512, round(1200 * 16 / 512))]
    assert [r["flops"] for r in runs] == pytest.approx([runs[0]["flops"]] * 3, rel=0.02)  # 38 steps for 37.5
    configs = [sweep._pretrain_config(c, v.config, r["steps"], v.overrides) for v, r in zip(sweep.variants(c), runs)]
    for pc, r in zip(configs, runs):
        validation.check(pc)
        assert (pc.batch_size, pc.total_steps, pc.optimizer.warmup_steps) == (r["batch"], r["steps"], r["steps"] // 10)
    rates = [pc.optimizer.learning_rate / configs[0].optimizer.learning_rate for pc in configs]
    assert rates == pytest.approx([1, 7, 10]) and [pc.batch_size // 16 for pc in configs] == [1, 8, 32]
    scratch = {"variant": "scratch", "budget": 0.0, "steps": 0, "init_steps": 0, "flops": 0.0}
    sweep.write_report([{**r, "accuracy": 50.0} for r in [scratch, *runs]], ["classification"], c.reference, tmp_path)
    table = (tmp_path / "table.md").read_text().splitlines()
    assert "| pretraining steps × batch |" in table[0]
    assert [line.split("|")[3].strip() for line in table[2:]] == ["0", "1200 × 16", "150 × 128", "38 × 512"]


def test_the_roberta_masking_sweep_repeats_static_masks_within_its_budget():
    """RoBERTa's Table 1 in miniature: the variants differ in masking alone, and the budget covers
    four passes over the embedded corpus or more, so the single static copy shows every row with
    the same mask four times (as the paper's static masks were each seen), while BERT's 10 copies
    never repeat one within it."""
    from bertology.data import corpus as corpus_lib
    from bertology.data.pipeline import make_instances
    from bertology.train import loop

    c = sweep.load_config(REPO / "configs/sweep/roberta_masking.py")
    runs = sweep.plan(c)
    configs = {v.name: sweep._pretrain_config(c, v.config, r["steps"], v.overrides)
               for v, r in zip(sweep.variants(c), runs)}
    masking = {name: (pc.data.masking, pc.data.dupe_factor if pc.data.masking == "static" else None)
               for name, pc in configs.items()}
    assert masking == {"bert": ("static", 10), "static_1": ("static", 1), "dynamic": ("dynamic", None)}
    for pc in configs.values():
        validation.check(pc)
        pc.data.masking, pc.data.dupe_factor = "static", 10  # otherwise the same config
    assert len({json.dumps(pc.to_dict(), sort_keys=True) for pc in configs.values()}) == 1
    pc, tok, _, _ = loop.resolved(configs["bert"])
    (corpus, _), = loop.corpora(pc.data)
    docs = corpus_lib.load_documents(corpus, tok, pathlib.Path(pc.data.vocab), pc.data.cache_dir, log=lambda m: None)["train"]
    rows_per_pass = len(make_instances(docs, pc.data, tok, np.random.default_rng(0))["input_ids"])
    passes = runs[0]["steps"] * runs[0]["batch"] / rows_per_pass
    assert 4 <= passes < pc.data.dupe_factor, (rows_per_pass, passes)


@pytest.mark.slow
def test_the_roberta_input_formats_train(tmp_path):
    """The two new formats of configs/sweep/roberta_formats.py pretrain a few steps: the sentence
    pairs with NSP labels, the document sentences with masked LM alone (RoBERTa's objective on
    BERT's network); the loss falls for each. (FULL-SENTENCES is RoBERTa's own, trained elsewhere.)"""
    from bertology.train.loop import train

    c = sweep.load_config(REPO / "configs/sweep/roberta_formats.py")
    for v in sweep.variants(c)[1:]:
        if v.name == "full_sentences":
            continue
        pc = sweep._pretrain_config(c, v.config, 10, v.overrides)
        pc.batch_size, pc.log_every, pc.mesh.shape = 8, 1, (1, 1)
        train(pc, tmp_path / v.name)
        rows = [json.loads(line) for line in (tmp_path / v.name / "metrics.jsonl").read_text().splitlines()]
        losses = [r["loss"] for r in rows if "loss" in r]
        assert ("nsp_loss" in rows[0]) == (v.name == "sentence_pair"), (v.name, rows[0])
        assert losses[-1] < losses[0], (v.name, losses)
