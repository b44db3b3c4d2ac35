"""lm-eval's model "bertology" (`bertology.evaluation.harness`) and `bertology harness`, on local
YAML tasks (tests/fixtures/lm_eval) with the network cut off, against computations that share no
code with it: a tiny GPT exported to Hugging Face and scored by transformers' torch model
(per-request log-likelihoods, greedy flags, accuracy, rolling windows), a tiny T5 the same way,
UniLM by full recomputation of each target token under its [MASK]; generation against the repo's
own greedy decoding."""

import json
import os
import socket
import sys

import jax
import ml_collections
import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ["HF_DATASETS_OFFLINE"] = "1"  # before datasets reads it; the tasks' data is local
lm_eval = pytest.importorskip("lm_eval")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import helpers  # noqa: E402
from flax.traverse_util import unflatten_dict  # noqa: E402
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from bertology import models  # noqa: E402
from bertology.data.embedded import BYTE_BPE_VOCAB  # noqa: E402
from bertology.data.tokenizers import for_data, load_tokenizer, tokenizer_files  # noqa: E402
from bertology.errors import UserError  # noqa: E402
from bertology.evaluation.harness import BertologyLM  # noqa: E402
from bertology.families.unilm import model as unilm  # noqa: E402
from bertology.generation import generate_text  # noqa: E402
from bertology.interop import export_hf  # noqa: E402
from bertology.interop.hf import param_shapes, write_run  # noqa: E402

TASKS = helpers.FIXTURES / "lm_eval"
CONTEXT = 32  # the tiny GPT's positions: the long fixture question and the rolling text overflow it
TOLERANCE = 1e-4
GPT = dict(family="gpt", activation="gelu_tanh", type_vocab_size=0, embedding_norm=False, pooler=False,
           layer_norm_eps=1e-5, max_position_embeddings=CONTEXT, dropout_rate=0.0, attention_dropout_rate=0.0,
           hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, norm="pre", scale_residual_init=True)
T5 = dict(family="t5", hidden_size=24, head_size=8, num_heads=3, intermediate_size=40, num_layers=2,
          relative_buckets=8, relative_max_distance=16, dropout_rate=0.0, attention_dropout_rate=0.0,
          activation_dropout_rate=0.0, layer_norm_eps=1e-6, norm="pre", norm_kind="rmsnorm", use_bias=False,
          positions="relative_bias", scale_attention=False, embedding_norm=False, type_vocab_size=0,
          activation="relu", tie_embeddings=True)


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Any connection attempt fails: the tasks, the models and the tokenizers are all local."""
    def refuse(*args, **kwargs):
        raise OSError("the network is cut off in this test")
    monkeypatch.setattr(socket.socket, "connect", refuse)


def random_run(workdir, block: dict, seed: int = 0):
    """A run of `block` with random N(0, 0.2) parameters and the shipped byte-level BPE, and the
    directory of its Hugging Face export."""
    block = {**block, "vocab_size": load_tokenizer(BYTE_BPE_VOCAB).vocab_size}
    rng = np.random.default_rng(seed)
    shapes = param_shapes(models.build(ml_collections.ConfigDict(block)))
    params = unflatten_dict({k: rng.normal(0.0, 0.2, s).astype(np.float32) for k, s in shapes.items()})
    write_run(workdir / "run", block, params, tokenizer_files(BYTE_BPE_VOCAB))
    (out,) = export_hf(workdir / "run", workdir / "hf")
    return workdir / "run", out


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    """(run directory, transformers' model of its export, its tokenizer)."""
    run, out = random_run(tmp_path_factory.mktemp("gpt"), GPT)
    return run, transformers.AutoModelForCausalLM.from_pretrained(out).eval(), transformers.AutoTokenizer.from_pretrained(out)


def reference(hf_model, ids: list[int], scored: int) -> tuple[float, bool]:
    """(sum log p, greedy) of the last `scored` of `ids` (at most CONTEXT + 1 of them) in torch."""
    with torch.no_grad():
        logits = hf_model(torch.tensor([ids[:-1]])).logits[0].double()
    logp = torch.log_softmax(logits, -1)[-scored:]
    targets = torch.tensor(ids[-scored:])
    return float(logp.gather(1, targets[:, None]).sum()), bool((logits[-scored:].argmax(-1) == targets).all())


def causal_reference(hf_model, hf_tokenizer, context: str, continuation: str) -> tuple[float, bool]:
    """lm-eval's request in Hugging Face's terms: the context's trailing spaces go to the
    continuation, whose ids are the whole text's after the context's, cut from the left to
    CONTEXT + 1 tokens."""
    stripped = context.rstrip()
    continuation, context = context[len(stripped):] + continuation, stripped
    whole = hf_tokenizer(context + continuation)["input_ids"]
    scored = len(whole) - len(hf_tokenizer(context)["input_ids"])
    return reference(hf_model, whole[-(CONTEXT + 1):], scored)


def request(kind: str, *args) -> Instance:
    return Instance(request_type=kind, doc={}, arguments=args, idx=0)


def test_tasks_match_transformers_request_for_request(gpt):
    run, hf_model, hf_tokenizer = gpt
    results = lm_eval.simple_evaluate(model="bertology", model_args={"run": str(run)}, batch_size=4,
                                      tasks=["bertology_choice", "bertology_until"], bootstrap_iters=0,
                                      task_manager=TaskManager(include_path=str(TASKS), include_defaults=False))
    samples = results["samples"]["bertology_choice"]
    assert len(samples) == 5
    correct, truncated = [], 0
    for sample in samples:
        ours = [resp[0] for resp in sample["resps"]]
        want = [causal_reference(hf_model, hf_tokenizer, *args) for args in sample["arguments"]]
        np.testing.assert_allclose([o[0] for o in ours], [w[0] for w in want], atol=TOLERANCE)
        assert [o[1] for o in ours] == [w[1] for w in want]
        correct.append(int(np.argmax([w[0] for w in want])) == sample["target"])
        truncated += len(hf_tokenizer(sample["arguments"][0][0])["input_ids"]) > CONTEXT
    assert truncated == 1  # the long question: both cut it from the left
    assert results["results"]["bertology_choice"]["acc,none"] == pytest.approx(np.mean(correct))
    # generation: the repo's greedy decoding of the prompt, cut at the task's stop strings ("\n", ".")
    prompts = [s["arguments"][0][0] for s in results["samples"]["bertology_until"]]
    greedy = generate_text(run, prompts, max_new_tokens=10)
    cut = [min([g.index(s) for s in ("\n", ".") if s in g], default=len(g)) for g in greedy]
    assert [s["resps"][0][0] for s in results["samples"]["bertology_until"]] == [g[:c] for g, c in zip(greedy, cut)]


def test_rolling_loglikelihood_sums_disjoint_windows(gpt):
    run, hf_model, hf_tokenizer = gpt
    text = "def read(path):\n    with open(path) as f:\n        return [line.strip() for line in f if line]\n" * 2
    ids = hf_tokenizer(text)["input_ids"]
    assert len(ids) > 2 * CONTEXT  # three windows, the last one partial
    full = [hf_tokenizer.eos_token_id, *ids]  # the first window reads the end-of-text token first
    want = 0.0
    for start in range(0, len(ids), CONTEXT):  # each window predicts CONTEXT new tokens from CONTEXT inputs
        end = min(start + CONTEXT, len(ids))
        want += reference(hf_model, full[max(0, end - CONTEXT):end + 1], end - start)[0]
    lm = BertologyLM(run=str(run), batch_size=2)
    (got,) = lm.loglikelihood_rolling([request("loglikelihood_rolling", text)])
    assert got == pytest.approx(want, abs=TOLERANCE)
    assert lm.loglikelihood_rolling([request("loglikelihood_rolling", text[:40])])[0] > got  # fewer tokens


def test_generation_stops_at_the_first_stop_string(gpt):
    run = gpt[0]
    prompt = "Return the value of"
    (greedy,) = generate_text(run, [prompt], max_new_tokens=12)
    stop = greedy[len(greedy) // 2:len(greedy) // 2 + 2]  # two characters from the middle of what it writes
    lm = BertologyLM(run=str(run))
    (got,) = lm.generate_until([request("generate_until", prompt, {"until": [stop, "never written"],
                                                                   "max_gen_toks": 12})])
    assert got == greedy[:greedy.index(stop)] and len(got) < len(greedy)
    (whole,) = lm.generate_until([request("generate_until", prompt, {"until": ["never written"], "max_gen_toks": 12})])
    assert whole == greedy
    # transformers' greedy tokens are greedy when scored (as ids: the text's BPE would split them
    # otherwise); with the last one changed they are not
    context = gpt[2](prompt)["input_ids"]
    with torch.no_grad():
        made = gpt[1].generate(torch.tensor([context]), do_sample=False, max_new_tokens=6)[0, len(context):].tolist()
    changed = [*made[:-1], (made[-1] + 1) % len(gpt[2])]
    (own, own_greedy), (_, changed_greedy) = lm._loglikelihood_tokens([(None, context, made), (None, context, changed)])
    assert own_greedy and not changed_greedy
    assert own == pytest.approx(reference(gpt[1], context + made, len(made))[0], abs=TOLERANCE)


def test_seq2seq_scores_the_continuation_with_the_decoder(tmp_path):
    """T5: the context, closed with EOS, is encoded; the decoder, started from the pad id, is
    teacher-forced on the continuation; transformers' T5 of the export gives the same numbers."""
    run, out = random_run(tmp_path, T5, seed=1)
    hf_model = transformers.AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    tokenizer = load_tokenizer(BYTE_BPE_VOCAB)
    pairs = [("Translate: open the file", " öffne die Datei"), ("Sum of 2 and 2 is ", "4"),
             ("A longer context that the encoder reads in full, whatever its length", " yes")]
    lm = BertologyLM(run=str(run), batch_size=2)
    got = lm.loglikelihood([request("loglikelihood", *p) for p in pairs])
    for (context, continuation), (logp, greedy) in zip(pairs, got):
        stripped = context.rstrip()  # lm-eval moves the context's trailing spaces to the continuation
        source = tokenizer.encode(stripped) + [tokenizer.eos_id]
        target = tokenizer.encode(context[len(stripped):] + continuation)
        with torch.no_grad():
            logits = hf_model(input_ids=torch.tensor([source]),
                              decoder_input_ids=torch.tensor([[tokenizer.pad_id, *target[:-1]]])).logits[0].double()
        want = float(torch.log_softmax(logits, -1).gather(1, torch.tensor(target)[:, None]).sum())
        assert logp == pytest.approx(want, abs=TOLERANCE)
        assert greedy == bool((logits.argmax(-1) == torch.tensor(target)).all())
    # a continuation that is the model's own greedy output is greedy, and scores above another
    (made,) = generate_text(run, [pairs[0][0]], sources=True, max_new_tokens=4)
    (own, own_greedy), (other, other_greedy) = lm.loglikelihood(
        [request("loglikelihood", pairs[0][0], made), request("loglikelihood", pairs[0][0], made[::-1] + "x")])
    assert own_greedy and not other_greedy and own > other


def test_unilm_scores_each_target_token_at_its_mask(tmp_path):
    """UniLM's continuation, fed step by step through its decoding against the KV cache, against a
    full recomputation of [CLS] context [SEP] + the target so far + [MASK] for each token."""
    config = helpers.config("unilm", "tiny")
    tokenizer = for_data(config.data)
    config.model.vocab_size = tokenizer.vocab_size
    model = models.build(config.model)
    params = jax.tree.map(np.asarray, helpers.random_params(config))
    run = helpers.write_run(tmp_path / "unilm", config, params)

    width = 24  # every reference sequence padded to one width: one compiled program

    @jax.jit
    def next_log_probs(params, ids, mask, source_length, at):  # params an argument: constants compile slowly
        batch = unilm.seq2seq_batch(ids, mask, np.arange(width)[None], source_length, np.arange(width))
        logits = model.apply({"params": params}, {**batch, "masked_positions": at[None, None]})["mlm_logits"]
        return jax.nn.log_softmax(logits[0, 0])

    def at_mask(source: list[int], target: list[int]) -> np.ndarray:
        """Log-probabilities of the token after `target` (of `source`): at a [MASK] after it."""
        seq = source + target + [tokenizer.mask_id]
        ids = np.zeros((1, width), np.int32)
        ids[0, :len(seq)] = seq
        mask = (np.arange(width) < len(seq)).astype(np.int32)[None]
        return np.asarray(next_log_probs(params, ids, mask, np.int32(len(source)), np.int32(len(seq) - 1)))

    def reference(context: list[int], target: list[int]) -> tuple[float, bool]:
        source = [tokenizer.cls_id, *context, tokenizer.sep_id]
        steps = [at_mask(source, target[:t]) for t in range(len(target))]
        return (sum(float(s[token]) for s, token in zip(steps, target)),
                all(int(s.argmax()) == token for s, token in zip(steps, target)))

    lm = BertologyLM(run=str(run))
    pairs = [("return the sum", " of a and b"), ("open the file", " now")]
    got = lm.loglikelihood([request("loglikelihood", *p) for p in pairs])
    for (context, continuation), (logp, greedy) in zip(pairs, got):
        want = reference(tokenizer.encode(context), tokenizer.encode(continuation))
        assert (logp, greedy) == (pytest.approx(want[0], abs=TOLERANCE), want[1])
    # the reference's own argmax tokens are greedy in the harness too
    context, made = tokenizer.encode(pairs[1][0]), []
    for _ in range(3):
        made.append(int(at_mask([tokenizer.cls_id, *context, tokenizer.sep_id], made).argmax()))
    ((logp, greedy),) = lm._loglikelihood_tokens([(None, context, made)])
    assert greedy and logp == pytest.approx(reference(context, made)[0], abs=TOLERANCE)


def test_a_family_without_a_decoder_and_a_missing_lm_eval_are_one_line(tmp_path, monkeypatch):
    bert = helpers.write_run(tmp_path / "bert", ml_collections.ConfigDict(
        {"model": {"family": "bert", "vocab_size": 64}, "data": {"vocab": None}}), {"w": np.zeros(2, np.float32)})
    with pytest.raises(UserError, match="holds a bert model, which has no decoder to score a continuation with; "
                                        "evaluate a GPT"):
        BertologyLM(run=str(bert))
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # what `import lm_eval` meets where it is not installed
    monkeypatch.delitem(sys.modules, "bertology.evaluation.harness")
    with pytest.raises(UserError, match=r'^lm-eval is not installed; pip install "bertology\[lm-eval\]"$'):
        import bertology.evaluation.harness  # noqa: F401


def test_command_prints_the_table_and_writes_the_results(gpt, tmp_path, capsys):
    from bertology import __main__, harness

    assert "harness" in __main__.COMMANDS
    out = tmp_path / "results.json"
    args = ["bertology harness", f"--run={gpt[0]}", "--tasks=bertology_choice", f"--include_path={TASKS}",
            "--limit=2", "--batch_size=4", f"--out={out}"]
    assert harness.main(args) == 0
    table = capsys.readouterr().out
    results = json.loads(out.read_text())
    acc = results["results"]["bertology_choice"]["acc,none"]
    (row,) = [line.split("|") for line in table.splitlines() if line.startswith("|bertology_choice|")]
    assert row[5].strip() == "acc" and float(row[7]) == pytest.approx(acc, abs=1e-4), table  # its Value column
    assert results["config"]["limit"] == 2 and acc in (0.0, 0.5, 1.0)
    assert harness.main(args[:2]) == 2
    assert capsys.readouterr().err == ("bertology.harness: error: --run and --tasks are required, e.g. --run "
                                       "runs/gpt_tiny --tasks lambada_openai\n")
