"""The tables of llama.cpp's i-quants as a C header (iq_grids.h), generated from the gguf
package's own (gguf.quants) when the kernels are built, so the numbers come from the reference
library and none is copied by hand.

A grid entry is the weights of 8 (IQ2_*, IQ1_*) or 4 (IQ3_*) consecutive positions, packed one
signed byte a weight, weight j in byte j (little-endian), e.g. IQ2_XXS's entry 1 = weights
(25, 8, 8, 8, 8, 8, 8, 8) -> 0x0808080808080819. KSIGNS maps 7 stored sign bits to 8 (the
eighth makes the count of minus signs even): bit j set = weight j negative.
"""

from __future__ import annotations

import numpy as np

# C name -> (gguf.quants class, bytes an entry)
GRIDS = {"IQ2XXS_GRID": ("IQ2_XXS", 8), "IQ2XS_GRID": ("IQ2_XS", 8), "IQ2S_GRID": ("IQ2_S", 8),
         "IQ3XXS_GRID": ("IQ3_XXS", 4), "IQ3S_GRID": ("IQ3_S", 4), "IQ1S_GRID": ("IQ1_S", 8)}


def _grid(cls_name: str) -> np.ndarray:
    """(entries, weights) int8: the grid of a gguf.quants class"""
    from gguf import quants

    cls = getattr(quants, cls_name, None)
    if cls is None or not hasattr(cls, "init_grid"):
        raise OSError(f"the gguf package has no {cls_name} grid (gguf.quants.{cls_name}); "
                      f"pip install 'gguf>=0.17'")
    cls.init_grid()
    g = np.asarray(cls.grid).reshape(cls.grid_shape)
    assert np.array_equal(g, np.round(g)) and g.min() >= -128 and g.max() <= 127, cls_name
    return g.astype(np.int8)


def header() -> str:
    """The text of iq_grids.h"""
    from gguf import quants

    lines = ["/* Written from the gguf package's tables by tandem/kernels/grids.py */",
             "#include <stdint.h>"]
    for name, (cls_name, width) in GRIDS.items():
        g = _grid(cls_name)
        assert g.shape[1] == width, (cls_name, g.shape)
        words = g.view(np.uint8).copy().view(np.uint64 if width == 8 else np.uint32).reshape(-1)
        ctype = "uint64_t" if width == 8 else "uint32_t"
        lines.append(f"static const {ctype} {name}[{len(words)}] = {{")
        per = 4 if width == 8 else 8
        for i in range(0, len(words), per):
            lines.append("    " + ", ".join(f"0x{int(w):0{2 * width}x}" for w in words[i: i + per])
                         + ",")
        lines.append("};")
    signs = np.frombuffer(quants.IQ2_XXS.ksigns, dtype=np.uint8)
    assert len(signs) == 128
    lines.append("static const uint8_t KSIGNS[128] = {")
    for i in range(0, 128, 16):
        lines.append("    " + ", ".join(f"0x{int(s):02x}" for s in signs[i: i + 16]) + ",")
    lines.append("};")
    return "\n".join(lines) + "\n"
