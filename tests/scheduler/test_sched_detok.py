"""Incremental detokenization: partial UTF-8 held back, stop strings across token boundaries."""

from __future__ import annotations

import codecs

from hypothesis import given, settings
from hypothesis import strategies as st
from slotserve.scheduler.detok import Detokenizer

TABLE = [b"a", b"b", b"c", b"\xc3", b"\xa9", b" ", b"\xe2\x82", b"\xac", b"\xff", b"ab"]


def run(ids, stop=()):
    d = Detokenizer(TABLE, stop)
    pieces = [d.push(i) for i in ids]
    return pieces, d.flush(), d.stopped


def test_split_character_is_held_until_complete():
    pieces, tail, _ = run([0, 3, 4, 6, 7])
    assert pieces == ["a", "", "é", "", "€"] and tail == ""


def test_stop_string_across_tokens_is_never_emitted():
    pieces, tail, stopped = run([0, 1, 2, 0], stop=("bc",))
    assert pieces == ["a", "", "", ""] and stopped and tail == ""


def test_held_stop_prefix_is_released_when_disproved():
    pieces, tail, stopped = run([0, 1, 0], stop=("bc",))
    assert pieces == ["a", "", "ba"] and not stopped
    pieces, tail, stopped = run([0, 1], stop=("bc",))
    assert pieces == ["a", ""] and tail == "b"


def test_invalid_bytes_become_replacement_characters():
    pieces, tail, _ = run([8, 0, 3])
    assert pieces == ["\ufffd", "a", ""] and tail == "\ufffd"


def test_earliest_of_several_stop_strings_wins():
    d = Detokenizer(TABLE, ("ca", "bc"))
    pieces = [d.push(i) for i in (9, 2, 0)]
    assert "".join(pieces) == "a" and d.stopped
    assert d.matched_stop == "bc"  # reported as the FinishEvent's stop_sequence
    plain = Detokenizer(TABLE, ("ca",))
    plain.push(0)
    assert plain.matched_stop is None and not plain.stopped


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, len(TABLE) - 1), max_size=30),
    st.lists(st.text(alphabet="abcé€ ", min_size=1, max_size=3), max_size=2),
)
def test_streamed_text_equals_the_whole_decode_cut_at_the_first_stop(ids, stops):
    """The stream stops after the first token whose text completes a stop string (generation
    ends there, as in vLLM: a longer stop string that began earlier cannot complete any more);
    the released text is that text cut at the earliest stop string in it."""
    pieces, tail, stopped = run(ids, stops)
    want, hit = b"".join(TABLE[i] for i in ids).decode("utf-8", errors="replace"), False
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    text = ""
    for i in ids:  # the complete characters decoded after each token
        text += decoder.decode(TABLE[i])
        hits = [text.find(s) for s in stops if text.find(s) >= 0]
        if hits:
            want, hit = text[: min(hits)], True
            break
    assert "".join(pieces) + tail == want
    assert stopped == hit
    for s in stops:  # nothing past a stop string was ever streamed
        assert s not in "".join(pieces)


def test_a_stop_string_completed_first_wins_over_a_longer_one_begun_earlier():
    # "ab " began at the "a", but "b" completed first: generation stops at the "b"
    pieces, tail, stopped = run([0, 1, 5], stop=("b", "ab "))
    assert "".join(pieces) + tail == "a" and stopped
