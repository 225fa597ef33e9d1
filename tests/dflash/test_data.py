"""dflash.data and dflash.batching: JSONL formats, error locations, truncation, and the
resumable BatchLoader."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from dflash.batching import BatchLoader
from dflash.data import (
    Example,
    drop_short,
    read_examples,
    read_prompts,
    write_jsonl_atomic,
)
from dflash.errors import DataError

BOS, EOS = 1, 2


class ByteTokenizer:
    """Token = byte + 3; chat template ``<|role|>content<|end|>``, generation prompt
    ``<|assistant|>``. ``as_dict`` mimics transformers 5 (a BatchEncoding-like dict)."""

    bos_token_id, eos_token_id = BOS, EOS

    def __init__(self, *, as_dict: bool = False, think: bool = False) -> None:
        self.as_dict = as_dict
        self.think = think  # Qwen3-like: only a final assistant turn gets a think block

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = [b + 3 for b in text.encode()]
        return [BOS, *ids] if add_special_tokens else ids

    def decode(self, ids: list[int]) -> str:
        return bytes(i - 3 for i in ids if i >= 3).decode()

    def apply_chat_template(self, messages: list[dict[str, str]], *, tokenize: bool = True,
                            add_generation_prompt: bool = False) -> Any:
        assert tokenize
        text = ""
        for i, m in enumerate(messages):
            think = self.think and m["role"] == "assistant" and i == len(messages) - 1
            text += f"<|{m['role']}|>" + ("<think></think>" if think else "") + m["content"]
            text += "<|end|>"
        if add_generation_prompt:
            text += "<|assistant|>"
        ids = self.encode(text, add_special_tokens=False)
        return {"input_ids": ids, "attention_mask": [1] * len(ids)} if self.as_dict else ids


CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"}, {"role": "user", "content": "again"},
        {"role": "assistant", "content": "ok"}]


def write_lines(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def masked_runs(tok: ByteTokenizer, ex: Example) -> list[str]:
    runs: list[list[int]] = []
    prev = 0
    for t, m in zip(ex.input_ids, ex.loss_mask, strict=True):
        if m and not prev:
            runs.append([])
        if m:
            runs[-1].append(t)
        prev = m
    return [tok.decode(r) for r in runs]


# -- formats ------------------------------------------------------------------------------
def test_pretokenized_and_prompt_response_ids(tmp_path: Path):
    f = write_lines(tmp_path / "d.jsonl", [
        {"input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]}, "",
        {"prompt_ids": [9, 8], "response_ids": [7], "response": "decoded text is ignored"}])
    assert read_examples(f, max_length=100) == [Example((5, 6, 7), (0, 1, 1)),
                                                Example((9, 8, 7), (0, 0, 1))]


@pytest.mark.parametrize("as_dict", [False, True])
def test_chat_mask_is_exactly_the_assistant_turns(tmp_path: Path, as_dict: bool):
    tok = ByteTokenizer(as_dict=as_dict)
    f = write_lines(tmp_path / "d.jsonl", [{"messages": CHAT}])
    (ex,) = read_examples(f, tokenizer=tok, max_length=1000)
    assert tok.decode(list(ex.input_ids)) == (
        "<|system|>be brief<|end|><|user|>hi<|end|><|assistant|>yo<|end|>"
        "<|user|>again<|end|><|assistant|>ok<|end|>")
    assert masked_runs(tok, ex) == ["yo<|end|>", "ok<|end|>"]
    assert sum(ex.loss_mask) == len("yo<|end|>ok<|end|>")


def test_prompt_response_and_text(tmp_path: Path):
    tok = ByteTokenizer()
    f = write_lines(tmp_path / "d.jsonl", [{"prompt": "ab", "response": "c"}, {"text": "xy"}])
    a, b = read_examples(f, tokenizer=tok, max_length=100)
    assert a == Example((BOS, ord("a") + 3, ord("b") + 3, ord("c") + 3, EOS), (0, 0, 0, 1, 1))
    assert b == Example((BOS, ord("x") + 3, ord("y") + 3), (1, 1, 1))


def test_mixed_file(tmp_path: Path):
    tok = ByteTokenizer()
    f = write_lines(tmp_path / "d.jsonl", [
        {"text": "t"}, {"input_ids": [4], "loss_mask": [1]}, {"messages": CHAT[1:3]},
        {"prompt_ids": [4], "response_ids": [5]}, {"prompt": "p", "response": "r"}])
    exs = read_examples(f, tokenizer=tok, max_length=100)
    assert [sum(e.loss_mask) for e in exs] == [2, 1, len("yo<|end|>"), 1, 2]


def test_template_that_is_not_prefix_stable_is_refused(tmp_path: Path):
    f = write_lines(tmp_path / "d.jsonl", [{"messages": CHAT[1:3]}, {"messages": CHAT}])
    tok = ByteTokenizer(think=True)
    with pytest.raises(DataError, match=r"d\.jsonl:2: .*messages\[2\]"):
        read_examples(f, tokenizer=tok, max_length=1000)
    (ex,) = read_examples(write_lines(tmp_path / "one.jsonl", [{"messages": CHAT[1:3]}]),
                          tokenizer=tok, max_length=1000)
    assert masked_runs(tok, ex) == ["<think></think>yo<|end|>"]


# -- errors -------------------------------------------------------------------------------
GOOD = {"prompt_ids": [1], "response_ids": [2]}


@pytest.mark.parametrize(("bad", "reason"), [
    ('{"prompt_ids": [1], ', "malformed JSON"),
    ("[1, 2]", "expected a JSON object, got array"),
    ({"input_ids": [1, True], "loss_mask": [1, 1]}, "'input_ids'[1] is True, not an int"),
    ({"prompt_ids": [1, -4], "response_ids": [2]}, "'prompt_ids'[1] is -4"),
    ({"input_ids": [1, 2], "loss_mask": [1, 2]}, "'loss_mask'[1] is 2"),
    ({"input_ids": [1, 2], "loss_mask": [1]}, "'input_ids' has 2 tokens but 'loss_mask' has 1"),
    ({"input_ids": [1, 2]}, "needs 'loss_mask'"),
    ({"prompt_ids": "12", "response_ids": [2]}, "'prompt_ids' must be an array"),
    ({"input": [1]}, "unknown row format (keys: 'input'); expected one of"),
    ({"messages": [{"role": "user"}]}, "messages[0] must be an object"),
    ({"messages": [{"role": "user", "content": "q"}]}, "no assistant message"),
    ({"prompt": "p"}, "needs 'response'"),
    ({"prompt_ids": [], "response_ids": []}, "no tokens"),
])
def test_bad_row_reports_file_and_line(tmp_path: Path, bad: Any, reason: str):
    f = write_lines(tmp_path / "d.jsonl", [GOOD, GOOD, bad, GOOD])
    with pytest.raises(DataError) as err:
        read_examples(f, tokenizer=ByteTokenizer(), max_length=10)
    msg = str(err.value)
    assert msg.startswith(f"{f}:3: ") and reason in msg and "\n" not in msg


@pytest.mark.parametrize("row", [{"messages": CHAT}, {"prompt": "a", "response": "b"},
                                 {"text": "a"}])
def test_text_formats_need_a_tokenizer(tmp_path: Path, row: dict[str, Any]):
    f = write_lines(tmp_path / "d.jsonl", [GOOD, row])
    key = next(iter(row))
    with pytest.raises(DataError, match=rf"d\.jsonl:2: '{key}' rows need a tokenizer"):
        read_examples(f, max_length=10)
    with pytest.raises(DataError, match=r"d\.jsonl:2: .* need a tokenizer"):
        read_prompts(f)


def test_hostile_values_are_escaped_and_short(tmp_path: Path):
    f = write_lines(tmp_path / "d.jsonl", [{"\x1b[2J" + "k" * 500: 1}])
    with pytest.raises(DataError) as err:
        read_examples(f, max_length=10)
    assert "\x1b" not in str(err.value) and "\\x1b" in str(err.value)
    assert len(str(err.value)) < len(str(f)) + 200


def test_template_exception_is_one_line(tmp_path: Path):
    class Broken(ByteTokenizer):
        def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("roles must alternate\nTraceback (most recent call last): ...")

    f = write_lines(tmp_path / "d.jsonl", [{"messages": CHAT}])
    with pytest.raises(DataError) as err:
        read_examples(f, tokenizer=Broken(), max_length=10)
    assert str(err.value) == f"{f}:1: tokenizer apply_chat_template failed: 'roles must alternate'"


def test_file_level_errors(tmp_path: Path):
    missing = tmp_path / "missing.jsonl"
    with pytest.raises(DataError, match="No such file or directory") as err:
        read_examples(missing, max_length=10)
    assert str(err.value).startswith(f"{missing}: ")
    with pytest.raises(DataError, match="is a folder, not a file"):
        read_prompts(tmp_path)
    empty = write_lines(tmp_path / "empty.jsonl", ["", "  "])
    for reader in (lambda: read_examples(empty, max_length=10), lambda: read_prompts(empty)):
        with pytest.raises(DataError) as err:
            reader()
        assert str(err.value) == f"{empty}: no examples"
    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(json.dumps(GOOD).encode() + b'\n{"text": "\xff\xfe"}\n')
    with pytest.raises(DataError, match=r"bin\.jsonl:2: not UTF-8"):
        read_examples(binary, max_length=10)


def test_utf8_bom_and_crlf_are_accepted(tmp_path: Path):
    f = tmp_path / "d.jsonl"
    f.write_bytes(b"\xef\xbb\xbf" + json.dumps(GOOD).encode() + b"\r\n\r\n")
    assert read_examples(f, max_length=10) == [Example((1, 2), (0, 1))]


# -- truncation and filtering ----------------------------------------------------------------
def test_truncation_keeps_the_front_and_drop_short(tmp_path: Path):
    f = write_lines(tmp_path / "d.jsonl", [{"prompt_ids": [1, 2, 3], "response_ids": [4, 5, 6]},
                                           {"prompt_ids": [1] * 6, "response_ids": [7]}])
    a, b = read_examples(f, max_length=5)
    assert a == Example((1, 2, 3, 4, 5), (0, 0, 0, 1, 1))
    assert b == Example((1,) * 5, (0,) * 5)
    assert drop_short([a, b], 1) == [a]
    assert drop_short([a, b], 2) == [a] and drop_short([a, b], 3) == []
    assert drop_short([a, b], 0) == [a, b]


def test_example_validates():
    with pytest.raises(ValueError, match="loss_mask"):
        Example((1, 2), (1,))
    with pytest.raises(ValueError, match="at least one token"):
        Example((), ())
    with pytest.raises(ValueError, match="not an int"):
        Example((1, False), (1, 1))
    with pytest.raises(ValueError, match="0 or 1"):
        Example((1, 2), (1, 3))


# -- prompts --------------------------------------------------------------------------------
def test_read_prompts_every_format(tmp_path: Path):
    tok = ByteTokenizer()
    f = write_lines(tmp_path / "p.jsonl", [
        {"prompt_ids": [4, 5], "response_ids": [6]}, {"prompt_ids": [7]},
        {"input_ids": [4, 5, 6, 7], "loss_mask": [0, 0, 1, 0]}, {"input_ids": [8, 9]},
        {"messages": CHAT}, {"messages": CHAT[:2]}, {"prompt": "ab", "response": "zz"},
        {"prompt": "ab"}, {"text": "q"}])
    got = read_prompts(f, tokenizer=tok)
    history = "<|system|>be brief<|end|><|user|>hi<|end|><|assistant|>yo<|end|><|user|>again<|end|>"
    assert got[:4] == [[4, 5], [7], [4, 5], [8, 9]]
    assert tok.decode(got[4]) == history + "<|assistant|>"
    assert tok.decode(got[5]) == "<|system|>be brief<|end|><|user|>hi<|end|><|assistant|>"
    assert got[6] == got[7] == [BOS, ord("a") + 3, ord("b") + 3]
    assert got[8] == [BOS, ord("q") + 3]


@pytest.mark.parametrize("row", [{"prompt_ids": []}, {"input_ids": [4], "loss_mask": [1]},
                                 {"text": ""}])
def test_read_prompts_rejects_empty_prompt(tmp_path: Path, row: dict[str, Any]):
    class NoBos(ByteTokenizer):
        def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
            return super().encode(text, add_special_tokens=False)

    tok = NoBos()
    f = write_lines(tmp_path / "p.jsonl", [GOOD, row])
    with pytest.raises(DataError, match=r"p\.jsonl:2: empty prompt"):
        read_prompts(f, tokenizer=tok)


# -- writing --------------------------------------------------------------------------------
def test_write_jsonl_atomic_round_trip(tmp_path: Path):
    out = tmp_path / "sub" / "gen.jsonl"
    rows = [{"prompt_ids": [1, 2], "response_ids": [3], "response": "é\x1b"},
            {"prompt_ids": [4], "response_ids": []}]
    write_jsonl_atomic(out, (r for r in rows))
    assert [json.loads(x) for x in out.read_text().splitlines()] == rows
    assert read_prompts(out) == [[1, 2], [4]]
    assert [p.name for p in out.parent.iterdir()] == ["gen.jsonl"]
    write_jsonl_atomic(out, rows[:1])
    assert len(out.read_text().splitlines()) == 1
    assert [p.name for p in out.parent.iterdir()] == ["gen.jsonl"]


# -- batching -------------------------------------------------------------------------------
BUCKETS = (8, 16, 32)


def make_examples(n: int = 23) -> list[Example]:
    """Lengths 2..41 spread over every bucket (and past the largest); all ids >= 1."""
    out = []
    for i in range(n):
        length = 2 + (i * 7) % 40
        ids = tuple(1 + (i * 31 + k) % 97 for k in range(length))
        out.append(Example(ids, tuple((k + i) % 2 for k in range(length))))
    return out


def expected_epoch_len(examples: list[Example], batch_size: int) -> int:
    counts = Counter(next(b for b in BUCKETS if min(len(e.input_ids), 32) <= b) for e in examples)
    return sum(-(-c // batch_size) for c in counts.values())


def loader(examples: list[Example], seed: int = 0, batch_size: int = 4) -> BatchLoader:
    return BatchLoader(examples, batch_size=batch_size, buckets=BUCKETS, seed=seed, pad_id=0)


def test_shapes_are_fixed_and_every_example_once_per_epoch():
    exs = make_examples()
    ld = loader(exs)
    n = expected_epoch_len(exs, 4)
    assert ld.batches_per_epoch == n
    assert ld.shapes() == [(4, 8), (4, 16), (4, 32)]
    want = Counter((e.input_ids[:32], e.loss_mask[:32]) for e in exs)
    for _ in range(2):
        seen: Counter[tuple[tuple[int, ...], tuple[int, ...]]] = Counter()
        pad_rows = 0
        for _ in range(n):
            b = ld.next_batch()
            assert (b.input_ids_BS.shape[0], b.bucket) in ld.shapes()
            assert b.input_ids_BS.shape == b.loss_mask_BS.shape == (4, b.bucket)
            assert b.input_ids_BS.dtype == b.loss_mask_BS.dtype == torch.long
            pads = b.input_ids_BS == 0
            assert not b.loss_mask_BS[pads].any()
            for ids, mask in zip(b.input_ids_BS.tolist(), b.loss_mask_BS.tolist(), strict=True):
                real = [i for i in ids if i]
                if not real:
                    pad_rows += 1
                    continue
                assert ids[len(real):] == [0] * (len(ids) - len(real))
                seen[(tuple(real), tuple(mask[: len(real)]))] += 1
        assert seen == want
        assert pad_rows == 4 * n - len(exs)


def test_shapes_skip_empty_buckets_and_short_buckets_only():
    ld = BatchLoader([Example((1,) * 3, (1,) * 3)], batch_size=2, buckets=(16, 4), seed=0,
                     pad_id=7)
    assert ld.shapes() == [(2, 4)]
    b = ld.next_batch()
    assert b.input_ids_BS.tolist() == [[1, 1, 1, 7], [7, 7, 7, 7]]
    assert b.loss_mask_BS.tolist() == [[1, 1, 1, 0], [0, 0, 0, 0]]
    with pytest.raises(ValueError, match="no examples"):
        BatchLoader([], batch_size=2, buckets=(4,), seed=0, pad_id=0)


def batches(ld: BatchLoader, k: int) -> list[torch.Tensor]:
    out = []
    for _ in range(k):
        b = ld.next_batch()
        out.append(torch.cat([b.input_ids_BS, b.loss_mask_BS], dim=1))
    return out


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and torch.equal(x, y)
                                    for x, y in zip(a, b, strict=True))


def test_order_depends_on_seed_only():
    exs = make_examples()
    n = expected_epoch_len(exs, 4)
    assert same(batches(loader(exs, seed=3), 2 * n), batches(loader(exs, seed=3), 2 * n))
    assert not same(batches(loader(exs, seed=3), n), batches(loader(exs, seed=4), n))
    two = batches(loader(exs, seed=3), 2 * n)
    assert not same(two[:n], two[n:])  # a new shuffle each epoch


def test_batches_of_different_buckets_are_interleaved():
    exs = make_examples()
    n = expected_epoch_len(exs, 4)
    orders = []
    for seed in range(4):
        ld = loader(exs, seed=seed)
        orders.append([ld.next_batch().bucket for _ in range(n)])
    assert any(o != sorted(o) and o != sorted(o, reverse=True) for o in orders)


@pytest.mark.parametrize("where", ["start", "second", "last", "next_epoch"])
def test_resume_matches_an_uninterrupted_run(where: str):
    exs = make_examples()
    n = expected_epoch_len(exs, 4)
    k = {"start": 0, "second": 1, "last": n - 1, "next_epoch": n + 2}[where]
    a = loader(exs, seed=5)
    batches(a, k)
    state = a.state_dict()
    b = loader(exs, seed=5)
    b.load_state_dict(state)
    assert b.state_dict() == state
    assert same(batches(a, 2 * n), batches(b, 2 * n))


def test_state_dict_is_plain_and_fresh(tmp_path: Path):
    exs = make_examples()
    ld = loader(exs)
    batches(ld, 3)
    state = ld.state_dict()
    torch.save(state, tmp_path / "s.pt")
    loaded = torch.load(tmp_path / "s.pt", weights_only=True)
    assert loaded == state and loaded["position"] == 3 and loaded["epoch"] == 0
    state["buckets"].append(99)
    state["position"] = 0
    assert ld.state_dict()["buckets"] == list(BUCKETS)
    assert ld.state_dict()["position"] == 3
    assert ld.state_dict() is not ld.state_dict()


def test_load_state_dict_rejects_other_data_or_settings():
    exs = make_examples()
    state = loader(exs).state_dict()
    fewer = loader(exs[:-1])
    with pytest.raises(ValueError, match="num_examples"):
        fewer.load_state_dict(state)
    longer = [Example((*exs[0].input_ids, 5), (*exs[0].loss_mask, 1)), *exs[1:]]
    with pytest.raises(ValueError, match="fingerprint"):
        loader(longer).load_state_dict(state)
    with pytest.raises(ValueError, match="batch_size"):
        loader(exs, batch_size=3).load_state_dict(state)
    with pytest.raises(ValueError, match="seed"):
        loader(exs, seed=9).load_state_dict(state)
    with pytest.raises(ValueError, match="position"):
        loader(exs).load_state_dict({**state, "position": 10_000})
    with pytest.raises(ValueError, match="epoch"):
        loader(exs).load_state_dict({**state, "epoch": True})


def test_an_id_outside_the_targets_vocabulary_is_one_line_naming_it(tmp_path: Path):
    """A file tokenized for another model: FILE:LINE and the id, before any forward."""
    f = write_lines(tmp_path / "other.jsonl", [
        json.dumps({"input_ids": [1, 2, 3, 4], "loss_mask": [0, 1, 1, 1]}),
        json.dumps({"input_ids": [1, 2, 600, 4], "loss_mask": [0, 1, 1, 1]})])
    assert len(read_examples(f, max_length=10, vocab_size=601)) == 2  # 600 is the last row
    with pytest.raises(DataError, match=r"other\.jsonl:2: token id 600 is outside the "
                                        r"target's vocabulary \(512 ids\)"):
        read_examples(f, max_length=2, vocab_size=512)  # checked before the cut, too
    prompts = write_lines(tmp_path / "prompts.jsonl", [json.dumps({"prompt_ids": [5, 512]})])
    assert read_prompts(prompts) == [[5, 512]]  # no target given: nothing to check against
    with pytest.raises(DataError, match=r"prompts\.jsonl:1: token id 512 is outside"):
        read_prompts(prompts, vocab_size=512)
