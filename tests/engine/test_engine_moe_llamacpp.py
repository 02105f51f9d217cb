"""Mixture of experts against llama.cpp itself: the greedy ids and top-5 log-probabilities
llama.cpp computed on qwen3moe, qwen2moe and olmoe files (tests/fixtures/moe_llamacpp.json,
recorded once by tests/fixtures/record_moe_llamacpp.py with the llama.cpp version it names; CI
needs no llama.cpp): the tiny qwen3moe fixture in F32 and in its Q4_K/Q6_K mix, the tiny
qwen2moe (shared expert and its sigmoid gate, untied output) in F32 and in its Q5_0/Q8_0 mix,
the tiny olmoe in F32, bench/synthetic.py's qwen3-moe-tiny (8 experts of 256, 2 per token), and
a mid-sized file at qwen3-30b-a3b's real widths (hidden 2048, 32/4 heads of 128, 32 experts of
768 with 8 per token, its Q4_K_M mix, 2 layers: the record script's MID). The files are
rewritten here from their seeds and checked byte for byte against the record first. The engine
is fed llama.cpp's tokens, and every step's top-5 log-probabilities are compared, with the same
greedy choice wherever llama.cpp's top two are further apart than the tolerance. (The tiny
fixtures' routers tie two experts on every token; where that tie decides the last chosen
expert, llama.cpp's sort may choose the other one: the tolerances cover what was measured.)"""

from __future__ import annotations

from llamacpp_compare import record_tests

RECORD = "moe_llamacpp.json"

# Largest |ours - llama.cpp| of a top-5 log-probability, and the top-2 gap of llama.cpp's above
# which our greedy choice must be the same. F32: measured 0.019 (greedy 61 of 61 agree; olmoe
# 0.0196, 61 of 61; qwen2moe 0.0079, 61 of 61). The tiny qwen2moe mix (Q5_0/Q8_0): 0.057, 48
# of 48. The other block-type files:
# - the tiny qwen3moe mix and qwen3-moe-tiny: NOT bounded: measured largest differences 9.3 and
#   6.8 while every clear greedy step agrees (43 of 43, 10 of 10). On the tiny mix the
#   difference is llama.cpp's: against the float64 reference ours are within 0.45 at worst
#   (mean 0.21) and llama.cpp's within 9.2 (mean 0.42), so some of its rows leave the reference
#   (a suspect, not verified: its rounding, or its sort on the tied router rows, changing a
#   row's chosen experts); the test holds ours at least as close to the reference as llama.cpp's.
# - the mid-sized file (MID): measured largest 1.58 (median 0.36, 90th percentile 0.58): its
#   logits are steep (top-2 gaps up to 16), so the 8-bit activations both engines use move a
#   log-probability by tenths. Against the float32 reference (measured once, not in CI: the
#   reference takes minutes on this file) ours are 0.117 off on average over the top-5 and
#   llama.cpp's 0.151, at worst 1.31 and 0.80. Greedy: 42 of 42 steps with a gap above 2 agree;
#   the one step that does not agree has gap 1.24 there (case 3, step 4), where ours and the
#   reference pick the same token and llama.cpp another.
LOGPROB_ATOL: dict[str, float | None] = {
    "qwen3moe-f32": 0.05,
    "qwen3moe-mix": None,
    "qwen3-moe-tiny": None,
    "olmoe-f32": 0.05,
    "qwen2moe-f32": 0.05,
    "qwen2moe-mix": 0.1,
    "qwen3-30b-a3b-mid": 2.0,
}
CLEAR_GAP = {
    "qwen3moe-f32": 0.1,
    "qwen3moe-mix": 2.0,
    "qwen3-moe-tiny": 4.0,
    "olmoe-f32": 0.1,
    "qwen2moe-f32": 0.1,
    "qwen2moe-mix": 0.2,
    "qwen3-30b-a3b-mid": 2.0,
}
CLOSER_TO_REFERENCE = "qwen3moe-mix"


SCRIPT = "record_moe_llamacpp.py"


test_record_names_its_source, test_engine_matches_llamacpp = record_tests(
    RECORD, SCRIPT, LOGPROB_ATOL, CLEAR_GAP, CLOSER_TO_REFERENCE
)
