"""The rows of a graph held on the device until it is assembled (linear_backward.py step 8).

On a GPU, copying each batch's block of rows to the host makes the host wait for the device once
per batch, and building the CSR arrays and solving for influence on the host leaves the device
idle. Instead:

1. Every batch writes its block `[B, n]` (the batch's reachable columns, ascending) into its own
   slice of one device buffer, allocated once for the whole graph (sizes known from the plan).
2. Logit influence and error shares are solved on the device from those blocks (`influence`),
   the same numbers as `graph.streamed_influence` (seed: circuit-tracing appendix, "Graph
   Pruning"): blocks of nodes from the last, `z_B = w_B + acc_B`, and each batch of block B adds
   `(z_t / rowsum_t) |A[t, s]|` over its rows t to `acc_s` (one matrix-vector product, float64);
   a row's error share is `sum_{s error} |A[t, s]| / rowsum_t`.
3. The CSR arrays are made on the device (`to_csr`): NaN and inf are counted there and refused
   (finite.py), each block's nonzeros and their columns are selected there, and copied straight
   into the host's arrays (csr_rows.py's `assemble_csr`). The host only copies: selecting the
   nonzeros of a Llama-1B-shaped graph's 264 M edges on the host took 5 s of one core, most of it
   writing them into its growing buffers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
import torch
from jaxtyping import Float

from attrgraph.engine.csr_rows import assemble_csr, index_dtype
from attrgraph.engine.finite import refuse_rows
from attrgraph.engine.precision import numpy_dtype
from attrgraph.errors import GraphError
from attrgraph.graph.streamed_influence import StreamedInfluence


@dataclass
class DeviceRows:
    """Rows `[n_rows, n_cols]` as dense blocks in one device buffer (module docstring, step 1)."""

    n_rows: int
    n_cols: int
    buffer: Float[torch.Tensor, " n_entries"]
    batches: list[tuple[np.ndarray, np.ndarray, int]] = field(default_factory=list)
    """Per batch: its rows, its columns (ascending), its first entry in `buffer`."""

    def block(self, i: int) -> torch.Tensor:
        """Batch i's block `[B, n]`, a view of the buffer."""
        rows, columns, at = self.batches[i]
        return self.buffer[at : at + len(rows) * len(columns)].view(len(rows), len(columns))

    def influence(
        self,
        logit_weights: Float[np.ndarray, " n_nodes"],
        blocks: list[tuple[int, int]],
        is_error: np.ndarray,
        first_node: int,
    ) -> StreamedInfluence:
        """Step 2, on the device; row r is node `first_node + r`, a column is a node index."""
        dev = self.buffer.device
        w = torch.as_tensor(np.asarray(logit_weights, np.float64), device=dev)
        err = torch.as_tensor(np.asarray(is_error, np.float64), device=dev)
        z, acc, share = w.clone(), torch.zeros_like(w), torch.zeros_like(w)
        starts = np.array([b0 for b0, _ in blocks])
        by_block: dict[int, list[int]] = {}
        for i, (rows, columns, _) in enumerate(self.batches):
            nodes = first_node + rows
            b = int(np.searchsorted(starts, nodes.min(), side="right")) - 1
            b0, b1 = blocks[b]
            if nodes.max() >= b1 or (len(columns) and columns[-1] >= b0):
                raise GraphError(
                    "a batch of rows spans two blocks or reads its own block; order nodes as graph.NODE_ORDER documents."
                )
            by_block.setdefault(b, []).append(i)
        for b in range(len(blocks) - 1, -1, -1):
            b0, b1 = blocks[b]
            z[b0:b1] = w[b0:b1] + acc[b0:b1]
            for i in by_block.get(b, []):
                rows, columns, _ = self.batches[i]
                nodes = torch.as_tensor(first_node + rows, device=dev)
                cols = torch.as_tensor(columns, device=dev)
                a = self.block(i).abs().double()  # [B, n]
                rowsum = a.sum(1)
                inv = torch.where(rowsum > 0, 1.0 / rowsum, torch.zeros_like(rowsum))
                acc.index_add_(0, cols, (z[nodes] * inv) @ a)
                share[nodes] = (a @ err[cols]) * inv
        return StreamedInfluence(influence=(z - w).cpu().numpy(), error_share=share.cpu().numpy())

    def to_csr(self) -> sp.csr_array:
        """Step 3: the rows as a host CSR matrix, its arrays selected on the device and copied once.
        The host waits for the device once for the counts, then once per batch for its copies: by
        then every batch has been computed."""
        dev, blocks = self.buffer.device, [self.block(i) for i in range(len(self.batches))]
        counts = [(block != 0).sum(1) for block in blocks]  # NaN and inf count as nonzero here
        bad = [(~torch.isfinite(block)).sum().view(1) for block in blocks]
        read = torch.cat([*counts, *bad]).cpu().numpy() if blocks else np.zeros(0, np.int64)
        counts, bad = read[: len(read) - len(blocks)], read[len(read) - len(blocks) :]
        refuse_rows(int(bad.sum()), "in the rows of this graph")
        nnz = int(counts.sum())
        itype = index_dtype(self.n_cols, nnz)
        data = np.empty(nnz, numpy_dtype(self.buffer.dtype))  # the CSR arrays, on the host
        indices = np.empty(len(data), itype)
        host_data, host_indices = torch.from_numpy(data), torch.from_numpy(indices)
        at = 0
        for block, (_, columns, _) in zip(blocks, self.batches):
            keep = block != 0
            values = torch.masked_select(block, keep)
            host_data[at : at + len(values)] = values
            host_indices[at : at + len(values)] = torch.masked_select(
                torch.from_numpy(columns.astype(itype)).to(dev), keep
            )
            at += len(values)
        order = np.concatenate([rows for rows, _, _ in self.batches]) if blocks else np.zeros(0, np.int64)
        return assemble_csr(self.n_rows, self.n_cols, order, counts, data, indices)
