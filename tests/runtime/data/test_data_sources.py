"""Text sources (JSONL, Parquet, plain text), the token cache, long documents, factories,
and the command line on them; fixtures are built on the fly."""

from __future__ import annotations

import json

import pytest
import torch

from datacentric.cli.flags import config_from_args
from datacentric.cli.main import build_parser, main
from datacentric.data import DataConfig, open_dataset
from datacentric.data.base import DataError, epoch_pack
from datacentric.data.documents import resolve_files
from datacentric.data.sources import reads_text, skipped_samples, source_kind
from datacentric.data.tokenized import TokenizedTextDataset
from datacentric.settings import load_config
from datacentric.settings.sections import ValidationConfig


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("DATACENTRIC_CACHE", str(folder))
    return folder


def write_jsonl(path, texts, field="text"):
    path.write_text("".join(json.dumps({field: t, "id": i}) + "\n" for i, t in enumerate(texts)))
    return path


TEXTS = ["short one", "x" * 25, "", "hello world, " * 4]


def test_jsonl_bytes_samples_and_packing(tmp_path):
    ds = open_dataset(f"jsonl:{write_jsonl(tmp_path / 'a.jsonl', TEXTS)}")
    assert [s.tokens for s in ds.shapes()] == [9, 25, 52]
    assert ds.summary()["skipped_empty"] == 1 and skipped_samples(ds) == 1
    assert ds.loss_tokens(0) == 8
    batch = ds.pack([0, 2], pad_to_multiple=4)
    assert bytes(batch.inputs[:9].tolist()) == b"short one"
    assert batch.cu_seqlens.tolist() == [0, 9, 61, 64]  # documents stay separate segments
    assert int(batch.loss_mask.sum()) == ds.loss_tokens(0) + ds.loss_tokens(2)
    assert torch.equal(epoch_pack(ds, 3)([0, 2], 4).inputs, batch.inputs)


@pytest.mark.parametrize(
    ("rule", "lengths", "skipped"),
    [
        ("chunk", [9, 12, 13, 17, 17, 18], 1),
        ("truncate", [9, 20, 20], 1),
        ("skip", [9], 3),
    ],
)
def test_long_document_rules(tmp_path, rule, lengths, skipped):
    path = write_jsonl(tmp_path / "a.jsonl", TEXTS)
    ds = open_dataset(f"jsonl:{path}", DataConfig(max_tokens=20, long_docs=rule))
    assert [s.tokens for s in ds.shapes()] == lengths
    assert skipped_samples(ds) == skipped
    if rule == "chunk":  # chunks cover the document exactly, in order
        assert bytes(torch.cat([ds.sample(i) for i in (3, 4, 5)]).tolist()) == TEXTS[3].encode()


def test_long_document_error_names_the_line(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", TEXTS)
    with pytest.raises(DataError, match=r"a\.jsonl:2: document of 25 tokens .*--max-tokens 20"):
        open_dataset(f"jsonl:{path}", DataConfig(max_tokens=20, long_docs="error"))


def test_skipping_every_document_names_max_tokens_and_long_docs(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", TEXTS)  # 3 of 9, 25 and 52 tokens, 1 empty
    with pytest.raises(DataError, match=r"longer than --max-tokens 8 \(3 of 4\), and --long-docs"):
        open_dataset(f"jsonl:{path}", DataConfig(max_tokens=8, long_docs="skip"))


def test_bad_lines_and_empty_globs(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n\n{"text": oops}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:3: line is not JSON"):
        open_dataset(f"jsonl:{bad}")
    bad.write_text('{"body": "no text key"}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:1: no string field 'text' .*--text-field"):
        open_dataset(f"jsonl:{bad}")
    assert len(open_dataset(f"jsonl:{bad}", DataConfig(text_field="body"))) == 1
    with pytest.raises(DataError, match="no file matches"):
        open_dataset(f"jsonl:{tmp_path}/none-*.jsonl")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="folder has no"):
        open_dataset(f"text:{tmp_path / 'empty'}")
    with pytest.raises(DataError, match="unknown dataset"):
        open_dataset("jsonll:x.jsonl")


def test_a_jsonl_file_an_editor_started_with_a_byte_order_mark_reads_as_without(tmp_path):
    """A BOM (Notepad, PowerShell's UTF-8) before the first line, CRLF line ends: the same
    documents as the plain file (was: line 1 is not JSON); before a later line, where
    joining such files puts it, too (was: 'line 3 is not JSON (Unexpected UTF-8 BOM')."""
    plain = write_jsonl(tmp_path / "plain.jsonl", ["first line", "second"])
    marked = tmp_path / "marked.jsonl"
    marked.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes().replace(b"\n", b"\r\n"))
    want = open_dataset(f"jsonl:{plain}")
    got = open_dataset(f"jsonl:{marked}")
    assert [s.tokens for s in got.shapes()] == [s.tokens for s in want.shapes()] == [10, 6]
    assert bytes(got.sample(0).tolist()) == b"first line"
    # two such files joined (cat a.jsonl b.jsonl): the second's mark starts line 3
    joined = tmp_path / "joined.jsonl"
    joined.write_bytes(marked.read_bytes() * 2)
    got = open_dataset(f"jsonl:{joined}")
    assert [s.tokens for s in got.shapes()] == [10, 6, 10, 6]
    assert got.sample_source(2) == f"{joined}:3"


def test_cache_is_reused_and_keyed_by_file_contents(tmp_path, cache):
    path = write_jsonl(tmp_path / "a.jsonl", ["abc", "defg"])
    first = TokenizedTextDataset("jsonl", str(path))
    assert first.cache_dir.parent.parent == cache
    again = TokenizedTextDataset("jsonl", str(path))
    assert again.cache_dir == first.cache_dir and len(list((cache / "tokens").iterdir())) == 1
    write_jsonl(path, ["abc", "defgh", "ij"])
    changed = TokenizedTextDataset("jsonl", str(path))
    assert changed.cache_dir != first.cache_dir
    assert [s.tokens for s in changed.shapes()] == [3, 5, 2]


def test_glob_over_text_files_and_tokenizer(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    for name, text in (("b.txt", "beta gamma beta"), ("a.txt", "alpha beta")):
        (tmp_path / name).write_text(text)
    ds = open_dataset(f"text:{tmp_path}/*.txt")
    assert [s.tokens for s in ds.shapes()] == [10, 15]  # sorted: a.txt first
    model = tokenizers.models.WordLevel(
        {"[UNK]": 0, "alpha": 1, "beta": 2, "gamma": 3}, unk_token="[UNK]"
    )
    tok = tokenizers.Tokenizer(model)
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    settings = DataConfig(tokenizer=str(tmp_path / "tokenizer.json"))
    ds = open_dataset(f"text:{tmp_path}/*.txt", settings)
    assert ds.vocab_size == 4
    assert ds.pack([0, 1]).inputs.tolist() == [1, 2, 2, 3, 2]
    with pytest.raises(DataError, match="no such file"):
        open_dataset(f"text:{tmp_path}/*.txt", DataConfig(tokenizer=str(tmp_path / "no")))


def test_a_text_file_is_one_document_byte_for_byte(tmp_path):
    written = "\ufeffa\r\nb\rc\n\u2028d \U0001f431\n".encode()
    (tmp_path / "doc.txt").write_bytes(written)
    ds = open_dataset(f"text:{tmp_path}/doc.txt")
    assert bytes(ds.pack([0]).inputs.tolist()) == written.removeprefix(b"\xef\xbb\xbf")
    # UTF-16 with its byte-order mark (Windows PowerShell's >), UTF-32 with its own
    # (which starts with UTF-16 LE's and read as text with a NUL after each character)
    for codec in ("utf-16", "utf-16-be", "utf-32", "utf-32-be"):
        mark = "" if codec in ("utf-16", "utf-32") else "\ufeff"
        (tmp_path / "doc.txt").write_bytes((mark + written.decode("utf-8")).encode(codec))
        ds = open_dataset(f"text:{tmp_path}/doc.txt")
        got = bytes(ds.pack([0]).inputs.tolist())
        assert got == written.removeprefix(b"\xef\xbb\xbf"), codec


def test_a_folder_s_files_are_found_by_suffix_in_any_case_and_through_links(tmp_path):
    (tmp_path / "sub").mkdir()
    for name in ("a.txt", "B.TXT", "sub/c.Md", "d.json"):
        (tmp_path / name).write_text(name)
    assert resolve_files("text", str(tmp_path)) == [
        str(tmp_path / n) for n in ("B.TXT", "a.txt", "sub/c.Md")
    ]
    (tmp_path / "shard").mkdir()
    (tmp_path / "shard" / "f.txt").write_text("f")
    (tmp_path / "sub" / "linked").symlink_to(tmp_path / "shard")  # read through the link
    (tmp_path / "sub" / "up").symlink_to(tmp_path)  # a loop: walked once
    assert resolve_files("text", str(tmp_path / "sub")) == [
        str(tmp_path / n) for n in ("sub/c.Md", "sub/linked/f.txt")
    ]
    (tmp_path / "E.JSONL").write_text('{"text": "e"}\n')
    assert resolve_files("jsonl", str(tmp_path)) == [
        str(tmp_path / n) for n in ("E.JSONL", "d.json")
    ]


def test_parquet_with_text_field(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"body": ["one", "three", "fives"]}), tmp_path / "p.parquet")
    ds = open_dataset(f"parquet:{tmp_path / 'p.parquet'}", DataConfig(text_field="body"))
    assert [s.tokens for s in ds.shapes()] == [3, 5, 5]
    with pytest.raises(DataError, match=r"p\.parquet: no column 'text'"):
        open_dataset(f"parquet:{tmp_path / 'p.parquet'}")
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(DataError, match=r"bad\.parquet: not a readable Parquet"):
        open_dataset(f"parquet:{tmp_path / 'bad.parquet'}")


def test_hf_datasets_folder_saved_with_save_to_disk(tmp_path):
    datasets = pytest.importorskip("datasets")
    folder = tmp_path / "saved"
    datasets.Dataset.from_dict({"body": ["one", "", "three", "x" * 25]}).save_to_disk(folder)
    settings = DataConfig(text_field="body", max_tokens=20)
    ds = open_dataset(f"hf-datasets:{folder}", settings)
    assert [s.tokens for s in ds.shapes()] == [3, 5, 12, 13]  # the 25 bytes in two chunks
    assert ds.summary()["skipped_empty"] == 1
    assert bytes(ds.pack([1]).inputs.tolist()) == b"three"
    with pytest.raises(DataError, match=r"saved: no column 'text' \(found: body\)"):
        open_dataset(f"hf-datasets:{folder}")
    splits = tmp_path / "splits"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["a"]})}).save_to_disk(
        splits
    )
    with pytest.raises(DataError, match=r"splits: holds splits train; pass the folder"):
        open_dataset(f"hf-datasets:{splits}")
    with pytest.raises(DataError, match="not a dataset saved with save_to_disk"):
        open_dataset(f"hf-datasets:{tmp_path / 'cache'}")
    with pytest.raises(DataError, match="no such folder"):
        open_dataset(f"hf-datasets:{tmp_path / 'missing'}")


class TinyDataset:
    def __init__(self, n: int) -> None:
        self.inner = open_dataset("sft-longtail", DataConfig(dataset_limit=n))

    def __len__(self):
        return len(self.inner)

    def shapes(self):
        return self.inner.shapes()

    def loss_tokens(self, i):
        return self.inner.loss_tokens(i)

    def pack(self, ids, pad_to_multiple=1):  # written before pack took the epoch
        return self.inner.pack(ids, pad_to_multiple)


def make_tiny(limit=None, seed=0):
    return TinyDataset(limit or 5)


def make_bad():
    return []


def test_factory_dataset_gets_the_settings_it_names():
    ds = open_dataset(f"{__name__}:make_tiny", DataConfig(dataset_limit=7))
    assert len(ds) == 7
    assert epoch_pack(ds, 2)([0], 1).num_tokens == ds.shapes()[0].tokens
    with pytest.raises(DataError, match="without shapes, loss_tokens, pack"):
        open_dataset(f"{__name__}:make_bad")
    with pytest.raises(DataError, match="is a list, not a factory"):
        open_dataset(f"{__name__}:TEXTS")
    with pytest.raises(DataError, match="cannot import"):
        open_dataset("no_such_module_xyz:make")


def test_what_a_dataset_string_names_is_read_in_one_place():
    kinds = {
        "stdlib": "stdlib",
        "sft-longtail": "preset",
        "jsonl:a.jsonl": "jsonl",
        "hf-datasets:folder": "hf-datasets",
        "latents:folder": "latents",
        "my_pkg.data:make": "factory",
        "stdlib:make": "factory",
        "jsonl": None,
        "split=0.1": None,
        "pkg:not/a/name": None,
    }
    assert {spec: source_kind(spec) for spec in kinds} == kinds
    assert reads_text(DataConfig(dataset="sft-longtail"), ValidationConfig(dataset="text:a.txt"))
    assert not reads_text(DataConfig(dataset="latents:x"), ValidationConfig(dataset="split=0.1"))
    # prompts a pipeline renders are read by its text encoders; prompts to continue are text
    rendered = ValidationConfig(prompts="p.jsonl", pipeline="my-wan-pipeline")
    assert not reads_text(DataConfig(dataset="latents:x"), rendered)
    assert reads_text(DataConfig(dataset="latents:x"), ValidationConfig(prompts="p.jsonl"))
    with pytest.raises(DataError, match="unknown dataset 'pkg:not/a/name'; use stdlib"):
        open_dataset("pkg:not/a/name")


def test_schedule_cli_counts_chunked_documents(tmp_path, capsys):
    texts = [("token " * n).strip() for n in (10, 3000, 120, 9000, 40)]
    path = write_jsonl(tmp_path / "corpus.jsonl", texts)
    argv = ["schedule", "--dataset", f"jsonl:{path}", "--world", "4", "--policy", "dcp-opt"]
    argv += ["--model", "llama-7b", "--hardware", "h200-sxm", "--json", "--max-tokens", "4096"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    # 17999 and 53999 bytes exceed 4096: ceil(n / 4096) = 5 and 14 chunks.
    assert out["samples_total"] == 3 + 5 + 14
    assert out["samples_dropped"] == 0 and out["samples_skipped"] == 0
    assert main([*argv, "--long-docs", "error"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("datacentric schedule: ") and "corpus.jsonl:2: document" in err
    assert len(err.splitlines()) == 1


def test_a_dataset_opens_from_the_data_section_as_train_opens_it():
    from datacentric.data import DataConfig, DataSettings, StdlibCorpus, open_dataset

    settings = load_config(None, dataset_limit=3, max_tokens=300, seed=5)
    assert type(settings.data) is DataConfig  # the one type of [data]
    from_section = open_dataset("stdlib", settings.data, seed=5)
    assert len(from_section) == len(StdlibCorpus(max_tokens=300, limit=3))
    with pytest.warns(DeprecationWarning, match="dataset_limit"):
        older = DataSettings(limit=3, max_tokens=300, seed=5)
    assert older.dataset_limit == 3 and older.data == settings.data
    assert open_dataset("stdlib", older).shapes() == from_section.shapes()
    with pytest.warns(DeprecationWarning):
        unset = DataSettings(max_tokens=None)
    assert unset.max_tokens == DataConfig().max_tokens == 4096  # one default


def test_schedule_and_train_see_the_same_dataset(tmp_path, capsys):
    path = tmp_path / "run.toml"
    path.write_text(
        '[data]\ndataset = "stdlib"\ndataset_limit = 25\n'
        '[parallelism]\nworld = 2\n[scheduling]\npolicy = "static"\n',
        encoding="utf-8",
    )
    assert main(["schedule", "--config", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)

    from datacentric.train.build import build_dataset

    config = config_from_args(build_parser().parse_args(["train", "--config", str(path)]))
    shapes = build_dataset(config.data, config.job.seed).shapes()
    assert config.data.dataset_limit == 25
    assert report["samples_total"] == len(shapes) >= 25
    assert report["samples_scheduled"] == len(shapes)


def test_a_text_folder_copied_by_a_mac_reads_no_apple_double_file(tmp_path):
    from datacentric.data.documents import resolve_files

    (tmp_path / "notes.txt").write_text("a document")
    (tmp_path / "._notes.txt").write_bytes(b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X")
    assert resolve_files("text", str(tmp_path)) == [str(tmp_path / "notes.txt")]
