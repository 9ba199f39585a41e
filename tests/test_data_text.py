"""Readers and bad-data checks of txf.data.text (and their path through the tfds builders)."""

import os

import pytest

from txf.data import builders, text
from txf.data.base import DataError

from test_data_fixtures import SHARED_DATA, write_lines


def test_mismatched_line_counts_name_both_files_and_counts(tmp_path):
  write_lines(tmp_path / "train.en", ["a", "b", "c"])
  write_lines(tmp_path / "train.de", ["x", "y"])
  with pytest.raises(DataError) as e:
    text.read_parallel(str(tmp_path / "train.en"), str(tmp_path / "train.de"), 100)
  msg = str(e.value)
  assert "train.en has 3 lines" in msg and "train.de has 2" in msg


def test_empty_and_overlong_lines_are_skipped_on_both_sides_and_counted(tmp_path):
  write_lines(tmp_path / "a.en", ["one", "", "three", "x" * 50, "five"])
  write_lines(tmp_path / "a.de", ["eins", "zwei", "  ", "vier", "fuenf"])
  pairs, stats = text.read_parallel(str(tmp_path / "a.en"), str(tmp_path / "a.de"), 20)
  assert pairs == [("one", "eins"), ("five", "fuenf")]          # still aligned
  assert stats.skipped == {"empty": 2, "longer than data.max_line_chars=20": 1}
  assert stats.lines["empty"] == [2, 3] and stats.total == 5


def test_non_utf8_names_file_and_line(tmp_path):
  (tmp_path / "b.en").write_bytes(b"fine\nalso fine\ncaf\xe9 au lait\n")
  write_lines(tmp_path / "b.de", ["a", "b", "c"])
  with pytest.raises(DataError, match=r"b\.en:3: not UTF-8 \(byte 0xe9"):
    text.read_parallel(str(tmp_path / "b.en"), str(tmp_path / "b.de"), 100)
  (tmp_path / "p.txt").write_bytes(b"line one\nline two \xff\n")
  with pytest.raises(DataError, match=r"p\.txt:2: not UTF-8"):
    text.read_plain(str(tmp_path / "p.txt"))


def test_tab_and_unicode_line_separators_stay_inside_a_line(tmp_path):
  src = ["a\tb", "form\x0cfeed", "para\u2028sep", "last"]
  write_lines(tmp_path / "t.de", src)
  write_lines(tmp_path / "t.en", ["1", "2", "3", "4"])
  pairs, _ = text.read_parallel(str(tmp_path / "t.en"), str(tmp_path / "t.de"), 100)
  assert [t for _, t in pairs] == src


def test_crlf_and_missing_final_newline(tmp_path):
  (tmp_path / "c.en").write_bytes(b"one\r\ntwo")
  assert list(text.iter_lines(str(tmp_path / "c.en"))) == [(1, "one"), (2, "two")]
  assert text.count_lines(str(tmp_path / "c.en")) == 2


def test_tsv_row_without_label_names_file_and_line(tmp_path):
  write_lines(tmp_path / "train.tsv", ["good film\t1", "no label here", "bad\t0"])
  with pytest.raises(DataError, match=r"train\.tsv:2: row has no TAB-separated label"):
    text.read_tsv(str(tmp_path / "train.tsv"), 100)
  write_lines(tmp_path / "dev.tsv", ["good film\tpositive"])
  with pytest.raises(DataError, match=r"dev\.tsv:1: label 'positive' is not"):
    text.read_tsv(str(tmp_path / "dev.tsv"), 100)


def test_tsv_header_and_empty_sentences(tmp_path):
  write_lines(tmp_path / "x.tsv", ["sentence\tlabel", "good\t1", "\t0", "bad\t0"])
  rows, stats = text.read_tsv(str(tmp_path / "x.tsv"), 100)
  assert rows == [("good", 1), ("bad", 0)] and stats.skipped == {"empty": 1}


def test_missing_file_and_missing_directory(tmp_path, monkeypatch):
  with pytest.raises(DataError, match="missing text file .*nope.en"):
    text.count_lines(str(tmp_path / "nope.en"))
  with pytest.raises(DataError) as e:
    text.resolve_text_dir("multi30k", str(tmp_path))
  assert str(tmp_path / "multi30k") in str(e.value) and "data.path" in str(e.value)
  monkeypatch.delenv("TXF_DATA", raising=False)
  with pytest.raises(DataError, match="TXF_DATA environment variable is not set"):
    text.resolve_text_dir("multi30k", "")
  (tmp_path / "multi30k").mkdir()
  monkeypatch.setenv("TXF_DATA", str(tmp_path))
  assert text.resolve_text_dir("multi30k", "") == str(tmp_path / "multi30k")


def test_missing_split_file_names_it(tmp_path):
  write_lines(tmp_path / "train.en", ["a"])
  write_lines(tmp_path / "train.de", ["b"])
  write_lines(tmp_path / "val.en", ["a"])
  with pytest.raises(DataError, match=r"missing eval split \('val'\) file .*val\.de"):
    builders.local_spec(str(tmp_path), "parallel", ["train", "val", "test"], "en", "de", 100, 0.9)


def test_plain_split_is_deterministic_in_characters_and_chunks_rejoin():
  content = "".join(f"line {i}\n" for i in range(1000))
  train, val = text.split_plain(content, 0.9)
  assert len(train) == int(len(content) * 0.9) and train + val == content
  chunks = text.chunk_text(content, 100)
  assert "".join(chunks) == content and all(c.endswith("\n") for c in chunks[:-1])
  assert max(map(len, chunks)) <= 100


def test_skips_are_kept_in_the_prepared_metadata(tmp_path):
  data = tmp_path / "d"
  data.mkdir()
  write_lines(data / "train.en", ["one", "", "three"])
  write_lines(data / "train.de", ["eins", "zwei", "drei"])
  write_lines(data / "val.en", ["v"])
  write_lines(data / "val.de", ["w"])
  spec = builders.local_spec(str(data), "parallel", ["train", "val", "test"], "en", "de", 100, 0.9)
  prepared = builders.prepare_local(str(data), spec, str(tmp_path / "tfds"))
  assert len(prepared.sources["train"]) == 2
  assert prepared.metadata["skipped"]["train"] == {"total": 3, "empty": 1}
  assert prepared.sources["train"][1]["source"] == b"three"    # file order kept


@pytest.mark.skipif(not os.path.isdir(SHARED_DATA), reason="../shared/data is absent (real-data check)")
def test_multi30k_tab_line_is_parallel_text_not_tsv():
  m30k = os.path.join(SHARED_DATA, "multi30k")
  pairs, stats = text.read_parallel(os.path.join(m30k, "train.en"), os.path.join(m30k, "train.de"),
                                    10000)
  assert len(pairs) + sum(stats.skipped.values()) == 29000
  assert "\t" in pairs[7365][1]                 # line 7366 keeps its TAB and its alignment


def test_a_preparation_logs_its_one_line_and_prints_nothing_until_a_command_shows_it(tmp_path,
                                                                                       capfd, caplog):
  import logging
  from txf.commands import common
  data = tmp_path / "d"
  data.mkdir()
  write_lines(data / "train.en", ["one", "two", "three"])
  write_lines(data / "train.de", ["eins", "zwei", "drei"])
  write_lines(data / "val.en", ["v"])
  write_lines(data / "val.de", ["w"])
  spec = builders.local_spec(str(data), "parallel", ["train", "val", "test"], "en", "de", 100, 0.9)
  with caplog.at_level(logging.INFO, logger="txf.data.prepared"):
    builders.prepare_local(str(data), spec, str(tmp_path / "tfds"))
  assert capfd.readouterr() == ("", "")      # the library prints nothing
  lines = [r.getMessage() for r in caplog.records if r.name == "txf.data.prepared"]
  assert len(lines) == 1 and lines[0].startswith("txf: prepared d: train 3, val 1 examples -> ")
  logger = logging.getLogger("txf.data.prepared")
  kept = (list(logger.handlers), logger.level, logger.propagate)
  try:
    common.show_preparations()
    common.show_preparations()                 # idempotent: still one line per preparation
    spec = builders.local_spec(str(data), "parallel", ["train", "val", "test"], "en", "de", 50, 0.9)
    builders.prepare_local(str(data), spec, str(tmp_path / "tfds"))
    err = capfd.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("txf: prepared d: train 3, val 1 examples -> "), err
  finally:
    logger.handlers[:], logger.level, logger.propagate = kept
