"""Training EAGLE-3 draft heads (`tandem train-head`).

- `head.py`: `Eagle3Head`, the head in float32 in SpecForge's checkpoint layout: encode,
  forward, and the training-time-test unroll; the reference a runtime is compared with.
- `data.py`: the corpus (the standard library's sources), the target's features and top-k
  distributions captured to disk, the draft vocabulary.
- `loop.py`: the loss, the validation acceptance curve and the resumable training loop.
- `export.py`: the HF checkpoint and llama.cpp's EAGLE-3 GGUF.
- `cli.py`: the command.

Nothing outside this package imports it but `tandem.cli`.
"""
