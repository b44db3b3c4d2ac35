"""atomic_write: a reader sees the old file or the whole new one, and a failed write leaves
neither a partial file nor its temporary behind."""

import os

import pytest

from bertology import files


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "sub" / "results.json"
    files.atomic_write(path, "old")
    assert path.read_text() == "old"

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        files.atomic_write(path, "new " * 1000)
    assert path.read_text() == "old"
    assert sorted(p.name for p in path.parent.iterdir()) == ["results.json"]


def test_text_is_written_as_utf8_and_bytes_as_given(tmp_path):
    assert files.atomic_write(tmp_path / "a.txt", "naïve\n").read_bytes() == "naïve\n".encode("utf-8")
    assert files.atomic_write(tmp_path / "b.bin", b"\x00\xff").read_bytes() == b"\x00\xff"
