"""The tiny tokenizer every GGUF fixture writer here shares: a real gpt2-style byte-level BPE
vocabulary (special tokens, the 256 byte tokens, TINY_MERGES) with a ChatML chat template, and
the order its keys are written in (gguf_fixtures.py's doc has the id layout)."""

from __future__ import annotations

from gguf import GGUFWriter, TokenType

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
BOS_ID, EOS_ID = 1, 2
BYTE_TOKEN_OFFSET = len(SPECIAL_TOKENS)

# Merges of common English pairs, each "left right" over tokens that exist before it.
TINY_MERGES = (
    "Ġ t",
    "h e",
    "Ġt he",
    "i n",
    "e r",
    "a n",
    "o n",
    "r e",
    "Ġ a",
    "e n",
    "a t",
    "o u",
    "e d",
    "i s",
    "Ġ s",
    "Ġ w",
    "Ġ o",
    "o r",
    "e s",
    "i t",
    "Ġ b",
    "Ġ c",
    "in g",
    "Ġ f",
    "Ġ m",
    "Ġ p",
    "a r",
    "Ġt o",
    "l l",
    "Ġa n",
    "Ġan d",
    "Ġ i",
    "Ġi n",
    "Ġo f",
    "h a",
    "Ġ h",
    "Ġh e",
    "Ġ d",
    "l e",
    "Ġ is",
)

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a tiny test model.<|im_end|>\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (printable Latin-1 bytes map to
    themselves, the rest to code points from 256 upwards, in byte order)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def tiny_vocab() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token_types, merges) of the tiny tokenizer."""
    tokens = list(SPECIAL_TOKENS) + [byte_to_unicode()[b] for b in range(256)]
    types = [int(TokenType.CONTROL)] * len(SPECIAL_TOKENS) + [int(TokenType.NORMAL)] * 256
    known = set(tokens)
    for merge in TINY_MERGES:
        left, right = merge.split(" ")
        assert left in known and right in known and left + right not in known, merge
        tokens.append(left + right)
        types.append(int(TokenType.NORMAL))
        known.add(left + right)
    return tokens, types, list(TINY_MERGES)


def add_tiny_tokenizer(
    w: GGUFWriter, tokens: list[str], token_types: list[int], merges: list[str], chat_template: str | None
) -> None:
    """The tiny tokenizer's keys (tiny_vocab, or it with extra tokens), in the order every writer
    here writes them, which the recorded fixtures' sha256 depend on."""
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(token_types)
    w.add_token_merges(merges)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_unk_token_id(0)
    w.add_add_bos_token(False)
    w.add_add_space_prefix(False)
    if chat_template is not None:
        w.add_chat_template(chat_template)
