"""OutputText on a character tokenizer: stop strings cut the output where they start, streamed
deltas never run past a stop string (nor show its start while it is still possible), and the
deltas always add up to the final text."""

from __future__ import annotations

import pytest

from inference_svc.engine.output_text import OutputText


def decode(ids: list[int]) -> str:
    """One character per id, except "é", two ids (0 and any): U+FFFD until the second arrives."""
    out, i = [], 0
    while i < len(ids):
        if ids[i] == 0:
            out.append("é" if i + 1 < len(ids) else "\ufffd")
            i += 2
        else:
            out.append(chr(ids[i]))
            i += 1
    return "".join(out)


def stream(text: str, stop: tuple[str, ...] = (), max_tokens: int | None = None):
    """Feed `text` token by token as an engine would; returns (deltas, final, stopped)."""
    tokens = [t for ch in text for t in ([0, 1] if ch == "é" else [ord(ch)])]
    output, ids, deltas = OutputText(decode, stop), [], []
    for token in tokens:
        ids.append(token)
        stopped = output.add(ids)
        last = stopped or len(ids) == len(tokens) or len(ids) == max_tokens
        deltas.append(output.take(final=last))
        if last:
            return deltas, output.final, stopped
    raise AssertionError("no last token")


def test_without_stop_strings_every_character_streams_at_once():
    deltas, final, stopped = stream("hello world")
    assert deltas == list("hello world") and final == "hello world" and not stopped


def test_stop_string_is_cut_with_everything_after_it():
    deltas, final, stopped = stream("The answer is 42.\n\nMore text", stop=("\n\n",))
    assert stopped and final == "The answer is 42."
    assert "".join(deltas) == final


def test_a_possible_stop_string_is_held_back_then_released():
    deltas, final, _ = stream("a France is b", stop=("France was",))
    assert final == "a France is b"
    assert deltas[2:9] == [""] * 7          # "France " could still become "France was"
    assert deltas[9] == "France i"          # no longer possible: released
    assert "".join(deltas) == final
    streamed = ""
    for delta in deltas:
        streamed += delta
        assert "France w" not in streamed


def test_streamed_text_never_shows_the_start_of_the_stop_string():
    deltas, final, stopped = stream("The capital of France is Paris.", stop=("France is P",))
    assert stopped and final == "The capital of "
    assert "".join(deltas) == final
    assert all("F" not in d for d in deltas)


def test_the_first_stop_string_to_appear_ends_the_output():
    deltas, final, stopped = stream("abcdefgh", stop=("efg", "cdefgh", "zz"))
    assert stopped and final == "abcd"      # "efg" is complete before "cdefgh" could be
    assert "".join(deltas) == final
    _, final, _ = stream("xabcd", stop=("bc", "abc"))
    assert final == "x"                     # both complete with the same token: the earlier start


def test_once_stopped_it_stays_stopped():
    output = OutputText(decode, ("b",))
    assert output.add([ord("a"), ord("b")]) and output.final == "a"
    assert output.add([ord("a"), ord("b"), ord("c")]) and output.final == "a"


def test_incomplete_character_waits_for_its_second_byte():
    deltas, final, _ = stream("caé!")
    assert deltas == ["c", "a", "", "é", "!"]
    assert final == "caé!"


def test_held_back_text_is_flushed_by_the_last_token():
    deltas, final, stopped = stream("abc STO", stop=("STOP",))
    assert not stopped and final == "abc STO"
    assert deltas[-1] == "STO" and "".join(deltas) == final


def test_length_limit_flushes_what_was_held():
    deltas, final, stopped = stream("abc STOP", stop=("STOP",), max_tokens=6)
    assert not stopped and final == "abc ST" and "".join(deltas) == final


@pytest.mark.parametrize("stop", [("x",), ("xyz",), ("a", "b"), ("ccc",)])
def test_deltas_add_up_to_the_final_text(stop):
    text = "aaxbbcxyzcccxyd"
    deltas, final, stopped = stream(text, stop=stop)
    assert "".join(deltas) == final
    cut = min((text.find(s) for s in stop if s in text), default=len(text))
    assert final == text[:cut] and stopped == (cut < len(text))
