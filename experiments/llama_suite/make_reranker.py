#!/usr/bin/env python3
"""A reranker GGUF for the suite's reranking tests, made from a chat model the way llama.cpp's
convert_hf_to_gguf makes one from Qwen3-Reranker: a `cls.output` head of the output rows of
the tokens "yes" and "no", pooling type rank, labels ["yes", "no"], and Qwen3-Reranker's
"rerank" prompt (ChatML, which SmolLM2-Instruct speaks too). Every other key and tensor is
copied unchanged. The suite's own reranker (jina-reranker-v1-tiny-en, a BERT) cannot be read
or fetched here.

Usage: make_reranker.py SOURCE.gguf OUT.gguf
"""
import sys

import numpy as np

import gguf

RERANK = ("<|im_start|>system\nJudge whether the Document meets the requirements based on the "
          "Query and the Instruct provided. Note that the answer can only be \"yes\" or \"no\"."
          "<|im_end|>\n<|im_start|>user\n<Instruct>: Given a web search query, retrieve "
          "relevant passages that answer the query\n<Query>: {query}\n<Document>: {document}"
          "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")


def main(src: str, dst: str) -> None:
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch)
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, field.contents(), kind, sub_type=field.types[-1])
        else:
            w.add_key_value(key, field.contents(), kind)
    w.add_pooling_type(gguf.PoolingType.RANK)
    w.add_classifier_output_labels(["yes", "no"])
    w.add_string("tokenizer.chat_template.rerank", RERANK)
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    names = {t.name: t for t in r.tensors}
    head = names.get("output.weight", names["token_embd.weight"])
    rows = gguf.quants.dequantize(head.data, head.tensor_type)
    ids = [tokens.index("yes"), tokens.index("no")]
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.add_tensor("cls.output.weight", np.ascontiguousarray(rows[ids], dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main(*sys.argv[1:3])
