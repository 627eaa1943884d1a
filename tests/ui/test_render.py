"""HTML helpers: the log-prob colour scale, escaping, token texts, files under the roots."""

import re

from ui.files import find_checkpoints, find_jsonl, is_under, save_upload
from ui.render import inert, logprob_colour, token_spans
from ui.tokens import token_texts
from workers.api import model_roots


def hue(colour: str) -> int:
    return int(re.match(r"hsl\((\d+),", colour).group(1))


def test_colours_run_from_red_to_green_on_a_log_scale():
    assert hue(logprob_colour(0.0)) == 120
    assert hue(logprob_colour(-6.0)) == 0 == hue(logprob_colour(-50.0))
    hues = [hue(logprob_colour(-k / 2)) for k in range(13)]
    assert hues == sorted(hues, reverse=True) and len(set(hues)) == 13


def test_token_spans_escape_text_and_titles():
    html = token_spans([7, 8, 9], [-0.1, -2.0, -9.0], ['<a href="x">', "&", "\n"])
    assert "<a href" not in html and "&lt;a href=&quot;x&quot;&gt;" in html
    assert ">&amp;</span>" in html and ">↵\n</span>" in html
    assert html.count('class="tok"') == 3 and 'data-token-id="9"' in html
    assert token_spans([5], [-1.0], [""]).endswith(">∅</span>")


def test_token_texts_follow_the_tokenizer(world):
    from tests.ui.helpers import encode

    ids = encode(world["model"], "12+7")
    assert token_texts(ids, [world["model"] / "missing", world["model"]]) == ["1", "2", "+", "7"]
    assert token_texts(ids, [world["model"] / "missing"]) is None


def test_checkpoints_and_prompt_sets_are_found_under_the_roots(tmp_path, monkeypatch):
    model = tmp_path / "a" / "b" / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"")
    (tmp_path / ".hidden" / "m").mkdir(parents=True)
    (tmp_path / "a" / "set.jsonl").write_text("")
    assert find_checkpoints([tmp_path]) == [model]
    assert find_jsonl([tmp_path]) == [tmp_path / "a" / "set.jsonl"]
    assert is_under(model, [tmp_path]) and not is_under(tmp_path / ".." / "x", [tmp_path])
    monkeypatch.setenv("RLWB_MODEL_ROOTS", f"{tmp_path}:/opt/models")
    assert model_roots() == (tmp_path, tmp_path.__class__("/opt/models"))
    monkeypatch.delenv("RLWB_MODEL_ROOTS")
    monkeypatch.setenv("RLWB_DATA_DIR", str(tmp_path / "data"))
    assert model_roots() == (tmp_path / "data",)


def test_uploads_never_overwrite(tmp_path):
    source = tmp_path / "p.jsonl"
    source.write_text("{}")
    first, second = save_upload(source, tmp_path / "d"), save_upload(source, tmp_path / "d")
    assert first.name == "p.jsonl" and second.name == "p-1.jsonl"


def test_stored_text_shown_as_markdown_is_inert():
    text = "see [x](http://e.vil) ![i](http://a/b.png) <img src=x> `code` *bold*"
    shown = inert(text)
    for mark in ("[", "]", "(", ")", "!", "`", "*"):
        assert shown.count(mark) == shown.count("\\" + mark)
    assert "<" not in shown and "&lt;img" in shown
