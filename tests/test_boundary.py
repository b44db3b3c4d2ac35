"""The family boundary: shared code never imports a family's package or compares anything with a
family's name; it asks the family's `Family` record (`bertology.models`).

Shared code is every module outside `bertology/families/` (one package per family), the core in
`bertology/models/` included. The check reads the source (AST): an import of
`bertology.families.<family>`, or a comparison (`==`, `!=`, `in`, `not in`) with a string constant
that names a family.

No module does either: what shared code needs to know of a family is in its record (or in what
the family contributes to a registry: its data transforms, its Hugging Face records).
"""

import ast
import dataclasses
import importlib
import pathlib

import pytest

from bertology import models

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "bertology"
FAMILY_HOMES = ("families",)

def _families() -> set[str]:
    from bertology.models import Family

    names = set()
    for path in (SRC / "families").iterdir():
        if (path / "__init__.py").is_file():
            assert isinstance(importlib.import_module(f"bertology.families.{path.name}").FAMILY, Family), path
            names.add(path.name)
    return names


def _violations(path: pathlib.Path, families: set[str]) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            parts = node.module.split(".")
            if parts[:2] == ["bertology", "families"]:
                if len(parts) > 2 and parts[2] in families:
                    found.add(f"import {parts[2]}")
                found |= {f"import {a.name}" for a in node.names if len(parts) == 2 and a.name in families}
        elif isinstance(node, ast.Import):
            found |= {f"import {a.name.split('.')[2]}" for a in node.names
                      if a.name.startswith("bertology.families.") and a.name.split(".")[2] in families}
        elif isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                values = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                found |= {f"compares {v.value}" for v in values
                          if isinstance(v, ast.Constant) and isinstance(v.value, str) and v.value in families}
    return found


def test_shared_code_asks_the_family_record_not_the_family():
    families = _families()
    assert {"bert", "bart", "t5", "unilm", "xlnet", "elmo", "mobilebert", "megatron_bert"} <= families
    seen = set()
    for path in sorted(SRC.rglob("*.py")):
        relative = path.relative_to(SRC).as_posix()
        if relative.split("/")[0] in FAMILY_HOMES:
            continue
        seen |= {(relative, what) for what in _violations(path, families)}
    assert seen == set(), f"shared code names a family; ask its Family record instead: {sorted(seen)}"


def test_a_task_inputs_hook_declares_the_arrays_it_adds():
    """Only the ids and the arrays a family's record declares reach its trunk (`input_keys`), so a
    hook whose arrays were not declared would be dropped without a word: the record refuses it."""
    from bertology.models import tasks

    record = models.family("longformer")
    assert tasks.input_keys("longformer") == (*tasks.INPUTS, "global_attention_mask")
    assert tasks.input_keys("bert") == tasks.INPUTS == ("input_ids", "input_mask", "segment_ids")
    with pytest.raises(TypeError, match="has a task_inputs hook but no task_input_keys"):
        dataclasses.replace(record, task_input_keys=())
    with pytest.raises(TypeError, match=r"names task_input_keys \('char_ids',\) but has no task_inputs hook"):
        dataclasses.replace(models.family("bert"), task_input_keys=("char_ids",))
