"""Sort the failures of a run.sh log (pytest -rA output) by why they fail.

    python experiments/llama_suite/classify.py suite.log > failures.md

Every failing test function of llama.cpp's suite is listed here with the reason it fails
against Tandem, found by reading the test and its assertion; a failure of a function not
listed is printed under "unexplained" (a regression to look at).
"""

import collections
import re
import sys

MODEL = "the suite's own model: expects its text, token counts or BOS"
DELIBERATE = "a deliberate difference"
WHY = {
    # expectations of the suite's tiny models (stories260K & co) that SmolLM2/Qwen cannot meet
    "test_chat_completion": MODEL, "test_chat_completion_stream": MODEL,
    "test_chat_completion_cached_tokens": MODEL, "test_chat_completion_with_openai_library": MODEL,
    "test_completion": MODEL, "test_completion_stream": MODEL,
    "test_completion_with_openai_library": MODEL,
    "test_completion_stream_with_openai_library": MODEL,
    "test_completion_stream_with_openai_library_stops": MODEL,
    "test_completion_parallel_slots": MODEL + " (SmolLM2 ends these prompts at once)",
    "test_completion_response_fields": MODEL + " (the prompt echoed with stories' '<s> ')",
    "test_nocache_long_input_prompt": MODEL + " (its tokenizer makes the prompt overflow)",
    "test_ctx_shift_disabled_short_prompt": MODEL + " (a model that never emits EOS)",
    "test_ctx_shift_disabled_stream": MODEL + " (sampled at the suite's temperature, SmolLM2 "
                                      "may end 'Once' before the slot is full: finish 'stop')",
    "test_ctx_shift_disabled_long_prompt": MODEL + " (its tokenizer makes the prompt overflow)",
    "test_embedding_pooling_none": MODEL + " (BERT's [CLS]/[SEP])",
    "test_embedding_usage_single": MODEL + " (BERT's token counts)",
    "test_embedding_usage_multiple": MODEL + " (BERT's token counts)",
    "test_embedding_error_prompt_too_long": MODEL + " (BERT keeps no KV cache, so llama-server "
                                            "cannot read its input in parts and says 'too "
                                            "large' past --ubatch-size; a causal model pooled "
                                            "last, SmolLM2 here, is read in chunks up to the "
                                            "slot's context, and past it llama-server says it "
                                            "exceeds the context size, as Tandem does)",
    "test_infill_with_input_extra": MODEL, "test_infill_without_input_extra": MODEL,
    "test_slot_save_restore": MODEL + " (its text and token counts)",
    "test_slot_erase": MODEL, "test_slot_restore_legacy_token_list":
        MODEL + " (n_saved 84, stories' token count; it would then rewrite llama.cpp's own "
        "state-file bytes)",
    "test_multi_requests_parallel": MODEL, "test_tokenize_with_bos": MODEL,
    "test_chat_template": MODEL + " (stories' BOS '<s> ' before the llama3 template)",
    "test_load_split_model": MODEL + " (and split GGUF files are not read)",
    # features that are another issue's, or not Tandem's
    # (the Jina reranker, a BERT, is replaced by SmolLM2-135M with a yes/no head: shim.py)
    "test_rerank": MODEL + " (the Jina reranker's judgement: SmolLM2-135M's yes/no head "
                   "ranks another document first)",
    "test_rerank_tei_format": MODEL + " (the Jina reranker's judgement, as test_rerank)",
    "test_rerank_usage": MODEL + " (the Jina reranker's BERT token counts, 19 and 26)",
    "test_slot_save_restore_image_payload_larger_than_context":
        "llama.cpp's own state-file format (the test reads the token payload's size from the "
        "file's bytes; Tandem's slot files are its own, images included)",
    "test_ctx_shift_enabled": MODEL + " (its tokenizer makes the prompt 226 tokens; SmolLM2's "
                              "117 and 96 more fit the slot, so nothing shifts; "
                              "tests/test_server_parity.py shifts the same way)",
    "test_completion_unified": MODEL + " (SmolLM2 ends 'A' after 73 tokens, so n_predict 80 "
                               "and 90 stop early; tests/test_server_parity.py runs the same "
                               "pool with ignore_eos)",
    "test_completion_prompt_cache": MODEL + " (its tokenizer's prompt_n for ' Hello 3' x 43)",
    "test_responses_with_openai_library": MODEL + " (stories' 'Suddenly'; ids, items and "
                                          "the text's shape pass)",
    "test_responses_stream_with_openai_library": MODEL + " (stories' 'Suddenly'; every event "
                                                 "check before it passes)",
    # where Tandem answers bad input as issue 56 asks, not as llama-server does
    "test_anthropic_tool_result_with_image": DELIBERATE + " (an image without --mmproj is the "
                                             "client's error: 400 naming the block, as the "
                                             "chat endpoint answers; llama-server says 500)",
    "test_anthropic_vision_format_accepted": DELIBERATE + " (the same: 400 naming the image "
                                             "block without a projector, not 500)",
    "test_anthropic_empty_messages": DELIBERATE + " (empty messages: 400 naming 'messages'; "
                                     "llama-server answers them)",
}


# how the reasons group (a reason belongs to the first kind it starts with)
KINDS = {
    MODEL: "expectations of the suite's own models (not the API)",
    "llama.cpp's own state-file": "llama.cpp's slot file bytes (not the API)",
    DELIBERATE: "bad input refused with a 400 where llama-server answers or says 500",
}


def main(path: str) -> None:
    log = open(path, encoding="utf-8").read()
    outcome = collections.Counter(re.findall(r"^(PASSED|FAILED|SKIPPED|ERROR) ", log, re.M))
    failed = re.findall(r"^FAILED unit/(test_\w+)\.py::(test_\w+)", log, re.M)
    by_kind: dict[str, list[str]] = collections.defaultdict(list)
    for module, fn in failed:
        why = WHY.get(fn, "unexplained")
        kind = next((k for k in KINDS if why.startswith(k)), why)
        by_kind[KINDS.get(kind, kind)].append(f"{module}::{fn}: {why}")
    print(f"# {outcome['PASSED']} passed, {outcome['FAILED']} failed, "
          f"{outcome['SKIPPED']} skipped\n")
    for kind, tests in sorted(by_kind.items(), key=lambda kv: -len(kv[1])):
        counts = collections.Counter(tests)
        print(f"## {kind}: {len(tests)}\n")
        for t, n in sorted(counts.items()):
            print(f"- {t}" + (f" (x{n})" if n > 1 else ""))
        print()


if __name__ == "__main__":
    main(sys.argv[1])
