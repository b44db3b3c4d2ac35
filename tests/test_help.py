"""`bertology COMMAND --help` explains every command; for those that take a config it lists the
config's keys with the comments that document them in the source; `bertology --version`."""

import importlib.metadata
import importlib.util
import io
import pathlib
import sys
import tokenize

from helpers import REPO

from bertology import __main__ as entry
from bertology import config_help, pretrain, recipes
from bertology.train import finetune as finetune_lib


def comment_on(path: str | pathlib.Path, code: str) -> str:
    """The comment ending the first line of a source file that holds `code`."""
    tokens = tokenize.generate_tokens(io.StringIO(pathlib.Path(path).read_text()).readline)
    return next(t.string.lstrip("# ") for t in tokens if t.type == tokenize.COMMENT and code in t.line)


def shown_keys(text: str) -> dict[str, str]:
    """{key: its line} of the config keys a --help printed (`  key (value): comment`)."""
    return {line.split(" (")[0].strip(): line for line in text.splitlines() if line.startswith("  ") and " (" in line
            and not line.lstrip().startswith("--")}


def flat(tree: dict, prefix: str = "") -> list[str]:
    return [k for key, value in tree.items()
            for k in (flat(value, f"{prefix}{key}.") if isinstance(value, dict) and value else [f"{prefix}{key}"])]


def test_every_command_prints_its_usage(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", sys.argv)  # the dispatcher sets sys.argv, as `python -m` would
    for command in entry.COMMANDS:
        for flag in ("--help", "-h"):
            try:
                status = entry.main([command, flag])
            except SystemExit as e:  # argparse's --help (convert, tokenizer, analyze)
                status = e.code
            out = capsys.readouterr().out
            assert status == 0 and out.startswith(f"usage: bertology.{command}"), (command, flag, out[:200])


def test_pretrain_help_lists_every_key_with_its_comment(capsys):
    """Without --config: the default pretraining config's keys, each comment read from where its key
    is defined, and only from the functions that built this config (not fine-tuning's recipe)."""
    assert pretrain.main(["bertology pretrain", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--workdir: Checkpoints, metrics.jsonl and TensorBoard files go here." in out
    keys = shown_keys(out)
    assert set(flat(pretrain.help_config().to_dict())) <= set(keys)
    assert keys["data.text_column"] == f"  data.text_column ('text'): {comment_on(recipes.__file__, 'text_column=')}"
    assert keys["model.scan_layers"].endswith(comment_on(recipes.__file__, "scan_layers="))
    assert keys["optimizer.schedule_steps"].endswith("resumes it).")  # the comment lines above the key
    assert keys["mesh.strategy"] == "  mesh.strategy ('tp')"  # mesh_config() builds the block
    assert keys["total_steps"] == "  total_steps (600)"  # fine-tuning's own total_steps has a comment
    assert comment_on(finetune_lib.__file__, "c.total_steps =")


def test_help_with_a_config_shows_its_values(capsys):
    """--config with --help: that config's keys (ELECTRA's own) at its values, overrides applied."""
    argv = ["bertology pretrain", f"--config={REPO}/configs/electra.py:tiny", "--config.total_steps=7", "--help"]
    assert pretrain.main(argv) == 0
    keys = shown_keys(capsys.readouterr().out)
    assert keys["total_steps"] == "  total_steps (7)" and keys["objective.disc_weight"] == "  objective.disc_weight (50.0)"
    assert keys["data.text_column"].endswith(comment_on(recipes.__file__, "text_column="))


def test_comments_in_every_form(tmp_path):
    """Each way a config states a key's comment: after `c.key = v`, after `key=v,` in ConfigDict(dict(...)),
    ConfigDict({...}) or `.update(...)`, and on the lines right above; nested blocks; a line's comment
    belongs to its outermost key."""
    source = tmp_path / "conf.py"
    source.write_text('''import ml_collections


def get_config():
    c = ml_collections.ConfigDict()
    c.seed = 0  # the seed
    # above, first line
    # above, second line
    c.steps = 10
    c.model = ml_collections.ConfigDict(dict(
        width=8,  # the width
        files=ml_collections.ConfigDict(dict(train="a", test="b")),  # the files
        table=ml_collections.ConfigDict({"rows": 2}),
    ))
    c.model.update(depth=2)  # after an update
    c.bare = 1
    return c
''')
    spec = importlib.util.spec_from_file_location("conf", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config, docs = config_help.documented(module.get_config, str(source))
    keys = shown_keys(config_help.describe(config, docs))
    assert keys["seed"].endswith("(0): the seed") and keys["steps"].endswith("(10): above, first line above, second line")
    assert keys["model.width"].endswith(": the width") and keys["model.depth"].endswith(": after an update")
    assert keys["model.files.train"] == "  model.files.train ('a')"  # the comment is model.files'
    assert docs["model.files"] == "the files" and keys["model.table.rows"] == "  model.table.rows (2)"
    assert keys["bare"] == "  bare (1)"


def test_version(capsys):
    assert entry.main(["--version"]) == 0
    assert capsys.readouterr().out == f"bertology {importlib.metadata.version('bertology')}\n"
