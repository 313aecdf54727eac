"""The vocabulary matrix (token embedding, tied lm_head) of one lean generate call, read by rows or by blocks.

Why: an ES lane's copy of SmolLM2 holds its 49152 x 576 vocabulary matrix (108 MiB in fp32) through every member's
generation, yet a decode step reads one row per live sequence, the screened lm_head a few candidate rows, and the
whole matrix is read only once per call: streamed block by block (the screen's bf16 copy, the prefill's head
slices), or written whole to be packed as the unscreened lm_head (`VocabRows.whole`). Where the owner
of the lane's weights can compute any rows of it (`esft.generation.releasing(rows=...)`, i.e.
`esft.es.noise.MasterWeights.rows`: round(master + sigma * eps) of those rows), the matrix is freed and its rows
computed when read. They are the bits the whole-matrix write gives: the arithmetic is elementwise and a row's
elements meet the same vector lanes when rows are a multiple of 64 elements (tests/test_lane_memory.py).
"""

from __future__ import annotations

from typing import Iterator

import torch

from esft.generation.packed import fill_released, release_packed, released_rows

#: Row length (elements) that keeps each element in the same SIMD lane position in a gathered row as in the whole
#: matrix, for every vector width up to AVX-512's two-register unroll (32 floats), with room to spare.
ROW_ALIGNMENT = 64


class VocabRows:
    """Rows of one [V, D] weight for the lean engine. Without a `rows` source (`releasing`), or where D is not a
    multiple of ROW_ALIGNMENT, reads come from the weight itself (written first if a lane had freed it); with
    one, every read is computed by the source and `free()` drops the weight's storage for the rest of the call."""

    def __init__(self, weight: torch.Tensor):
        self.weight = weight
        self.shape = weight.shape
        aligned = weight.dim() == 2 and weight.shape[1] % ROW_ALIGNMENT == 0
        self._rows = released_rows(weight) if aligned else None
        if self._rows is None:
            self.whole()  # read in place: a lane's deferred write happens now

    @property
    def computed(self) -> bool:
        """True when rows are computed by the weights' owner instead of read from the weight."""
        return self._rows is not None

    def _read_weight(self) -> bool:
        # a weight that holds its values (nothing freed it yet in this call) is read: the same bits, no arithmetic
        return self._rows is None or self.weight.untyped_storage().nbytes() > 0

    def take(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` (1-D int64) as a new [len(ids), D] tensor."""
        return self.weight.index_select(0, ids) if self._read_weight() else self._rows(self.weight, ids, None)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """The embedding of token ids of any shape: ids.shape + (D,) (`F.embedding` without gradients)."""
        return self.take(ids.reshape(-1)).view(*ids.shape, self.shape[1])

    def blocks(self, size: int) -> Iterator[tuple[int, torch.Tensor]]:
        """(start, rows start..start+size-1) over the whole matrix. Read-only, and only until the next block:
        computed blocks share one buffer (whole-matrix-sized blocks would be fresh mappings, faulted in each)."""
        buffer = None
        for start in range(0, self.shape[0], size):
            stop = min(self.shape[0], start + size)
            if self._read_weight():
                yield start, self.weight[start:stop]
                continue
            if buffer is None:
                buffer = torch.empty((min(size, self.shape[0]), self.shape[1]), dtype=self.weight.dtype,
                                     device=self.weight.device)
            yield start, self._rows(self.weight, slice(start, stop), buffer[:stop - start])

    def whole(self) -> torch.Tensor:
        """The weight itself, written (a freed one comes back): for packing it whole."""
        if self.weight.untyped_storage().nbytes() == 0:
            fill_released(self.weight)
        return self.weight

    def free(self) -> None:
        """Drop the weight's storage when rows are computed (a no-op otherwise): nothing reads it in this call."""
        if self._rows is not None:
            release_packed(self.weight)
