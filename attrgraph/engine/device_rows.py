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
   (finite.py, `nnz`), each block's nonzeros and their columns are selected there, and copied
   into the host's arrays (csr_rows.py's `assemble_csr`) through two page-locked buffers
   (host_copy.py: straight into pageable memory the copy ran at 2.8 GB/s on an H100). The host
   only copies: selecting the nonzeros of a Llama-1B-shaped graph's 264 M edges on the host took
   5 s of one core, most of it writing them into its growing buffers. `select` copies any chosen
   entries, rows and columns renumbered: device_prune.py copies the pruned graph alone that way.
4. The adaptive method (adaptive.py) keeps one `DeviceRows` per exploration step: step 2 over
   several of them, each row a given node (`influence_of_sets`), and its fold of the unexplored
   features into their error nodes, into one `DeviceRows` in the graph's row order (`fold_rows`).
Every batch's rows and columns go to the device in one copy, the first time they are needed
(`nodes_and_columns`): a copy to the device makes the host wait for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
import torch
from jaxtyping import Float

from attrgraph.engine.csr_rows import assemble_csr, index_dtype
from attrgraph.engine.finite import refuse_rows
from attrgraph.engine.host_copy import HostCopy
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
    _indices: list = field(default_factory=list, repr=False)
    """Per batch, its rows and columns on the device (`nodes_and_columns`)."""

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
        keep: np.ndarray | None = None,
    ) -> StreamedInfluence:
        """Step 2, on the device; row r is node `first_node + r`, a column is a node index. With
        `keep` (a mask over nodes) on the graph of the kept nodes only: the rows and columns of the
        others count as empty (device_prune.py)."""
        nodes = first_node + np.arange(self.n_rows)
        return influence_of_sets([(nodes, self)], logit_weights, blocks, is_error, keep)

    def nodes_and_columns(self, i: int, first_node: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch i's rows as node indices and its columns, on the device: every batch's are copied
        there in one go, the first time (a copy to the device makes the host wait for it)."""
        if not self._indices:
            dev, parts = self.buffer.device, [(rows, columns) for rows, columns, _ in self.batches]
            sizes = np.array([[len(r), len(c)] for r, c in parts], np.int64).reshape(-1, 2)
            flat = np.concatenate([np.concatenate([r, c]) for r, c in parts] or [np.zeros(0, np.int64)])
            on_device = torch.from_numpy(flat.astype(np.int64)).to(dev).split(sizes.sum(1).tolist())
            self._indices = [x.split(size.tolist()) for x, size in zip(on_device, sizes)]
        rows, columns = self._indices[i]
        return rows + first_node, columns

    def abs(self, i: int, keep: torch.Tensor | None = None, first_node: int = 0) -> torch.Tensor:
        """|batch i's block| `[B, n]` in float64; with `keep` (a float mask over nodes, on the
        device) zero in the rows and columns of the nodes not kept."""
        if keep is None:
            return self.block(i).abs().double()
        return _masked_abs(self.block(i), keep, *self.nodes_and_columns(i, first_node))

    def nnz(self) -> int:
        """The nonzero entries of all rows, NaN and inf refused (finite.py): one read."""
        blocks = [self.block(i) for i in range(len(self.batches))]
        counts = [torch.stack([(b != 0).sum(), (~torch.isfinite(b)).sum()]) for b in blocks]
        nonzero, bad = torch.stack(counts).sum(0).tolist() if blocks else (0, 0)
        refuse_rows(bad, "in the rows of this graph")
        return nonzero

    def to_csr(self) -> sp.csr_array:
        """Step 3: the rows as a host CSR matrix, NaN and inf refused (`nnz`)."""
        self.nnz()
        return self.select(lambda i, block: block != 0)

    def select(
        self,
        where,
        rows: np.ndarray | None = None,
        columns: np.ndarray | None = None,
        shape: tuple[int, int] | None = None,
    ) -> sp.csr_array:
        """The entries of each batch's block where `where(i, block)` (a bool tensor `[B, n]`) holds,
        as a host CSR matrix of `shape` (default `[n_rows, n_cols]`): row r goes to row `rows[r]`
        and column c to `columns[c]` (default: where they are; -1 for a row or column no entry of
        which is selected). Selected on the device and copied straight into the host's arrays: the
        host waits once for the counts, which size each batch's selection (`nonzero_static`: a
        `nonzero` would wait for the device to learn its size), then for the copies (host_copy.py:
        each for the one before last, so the device works ahead)."""
        n_rows, n_cols = shape or (self.n_rows, self.n_cols)
        dev, batches = self.buffer.device, range(len(self.batches))
        read = [where(i, self.block(i)).sum(1) for i in batches]  # `where` again below: one mask at a time
        read = torch.cat(read).cpu().numpy() if read else np.zeros(0, np.int64)
        nnz = int(read.sum())
        itype = index_dtype(n_cols, nnz)
        data = np.empty(nnz, numpy_dtype(self.buffer.dtype))  # the CSR arrays, on the host
        indices = np.empty(len(data), itype)
        copy = HostCopy(dev, (data, indices))
        index_type = torch.from_numpy(indices[:0]).dtype
        to_column = None if columns is None else torch.as_tensor(np.asarray(columns, np.int64), device=dev)
        per_batch = [
            int(x.sum()) for x in np.split(read, np.cumsum([len(r) for r, _, _ in self.batches])[:-1])
        ]
        at = 0
        for i in batches:
            block = self.block(i)
            row, col = torch.nonzero_static(where(i, block), size=per_batch[i]).unbind(1)  # row-major
            cols = self.nodes_and_columns(i, 0)[1]
            cols = cols if to_column is None else to_column[cols]
            copy.put(at, block[row, col], cols.to(index_type)[col])
            at += len(row)
        copy.finish()
        order = np.concatenate([r for r, _, _ in self.batches]) if self.batches else np.zeros(0, np.int64)
        if rows is not None:
            order = rows[order]
        written = order >= 0  # rows mapped to -1 had no entry selected
        return assemble_csr(n_rows, n_cols, order[written], read[written], data, indices)


def fold_rows(
    sets: list[tuple[np.ndarray, DeviceRows]], target: np.ndarray, shape: tuple[int, int]
) -> DeviceRows:
    """Several `(rows_to, rows)` as one `DeviceRows` of `shape`, on the device: row r of a set becomes
    row `rows_to[r]` (distinct over all sets), and each column c is added into column `target[c]`
    (step 4 of adaptive.py folds the unexplored features into their error nodes). Each batch's block
    becomes the sums of its columns by target, over its targets ascending, in one new buffer sized
    first; a column's terms are summed in column order by one thread (`torch.segment_reduce`: no
    atomics, the same sums every run). `sets` is emptied as it goes, from the last, so that each
    set's rows are freed once folded. The host waits once per set, for the copy of its batches'
    orders and run lengths to the device, and never reads from it."""
    target = np.asarray(target)
    plans = []  # per set, per batch: (order of its columns by target, new columns, run lengths)
    for _, rows in sets:
        plans.append([])
        for _, columns, _ in rows.batches:
            to = target[columns]
            order = np.argsort(to, kind="stable")
            new_columns, lengths = np.unique(to[order], return_counts=True)
            plans[-1].append((order, new_columns, lengths))
    batches, at = [], 0
    for (rows_to, rows), plan in zip(sets, plans):
        for (local, _, _), (_, new_columns, _) in zip(rows.batches, plan):
            batches.append((np.asarray(rows_to)[local], new_columns, at))
            at += len(local) * len(new_columns)
    dtype, dev = (sets[0][1].buffer.dtype, sets[0][1].buffer.device) if sets else (torch.float32, "cpu")
    out = DeviceRows(shape[0], shape[1], torch.empty(at, dtype=dtype, device=dev), batches)
    first = np.cumsum([0] + [len(rows.batches) for _, rows in sets])
    while sets:
        s = len(sets) - 1
        _, rows = sets.pop()
        parts = [np.concatenate([order, lengths]) for order, _, lengths in plans[s]]
        flat = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        on_device = torch.from_numpy(flat.astype(np.int64)).to(dev).split([len(x) for x in parts])
        for i, (order, new_columns, lengths) in enumerate(plans[s]):
            order_d, lengths_d = on_device[i].split([len(order), len(lengths)])
            moved = rows.block(i).T[order_d]  # [n, B]: the block's columns grouped by target
            if len(new_columns) < len(order):
                # unsafe: no check of the lengths (np.unique's counts), which would read them twice
                moved = torch.segment_reduce(moved, "sum", lengths=lengths_d, axis=0, unsafe=True)
            out.block(int(first[s]) + i).copy_(moved.T)
        del rows
    return out


def influence_of_sets(
    sets: list[tuple[np.ndarray, DeviceRows]],
    logit_weights: Float[np.ndarray, " n_nodes"],
    blocks: list[tuple[int, int]],
    is_error: np.ndarray | None = None,
    keep: np.ndarray | None = None,
) -> StreamedInfluence:
    """Step 2 for rows held in several `DeviceRows`: in each `(nodes, rows)`, row r is node
    `nodes[r]` (nodes of different sets distinct); nodes with no row have no inputs (the adaptive
    graph's unexplored features, adaptive.py). `keep` as in `DeviceRows.influence`."""
    if not sets:
        raise GraphError("influence_of_sets needs at least one set of rows.")
    dev = sets[0][1].buffer.device
    w = torch.as_tensor(np.asarray(logit_weights, np.float64), device=dev)
    err = (
        torch.zeros_like(w)
        if is_error is None
        else torch.as_tensor(np.asarray(is_error, np.float64), device=dev)
    )
    z, acc, share = w.clone(), torch.zeros_like(w), torch.zeros_like(w)
    mask = None if keep is None else torch.as_tensor(np.asarray(keep, np.float64), device=dev)
    starts = np.array([b0 for b0, _ in blocks])
    by_block: dict[int, list[tuple[int, int]]] = {}
    node_maps = []
    for s, (node_of_row, rows) in enumerate(sets):
        node_of_row = np.asarray(node_of_row, np.int64)
        if len(node_of_row) != rows.n_rows:
            raise GraphError(f"a set of {rows.n_rows} rows has {len(node_of_row)} nodes; give one per row.")
        node_maps.append(node_of_row)
        for i, (local, columns, _) in enumerate(rows.batches):
            nodes = node_of_row[local]
            b = int(np.searchsorted(starts, nodes.min(), side="right")) - 1
            b0, b1 = blocks[b]
            if nodes.min() < b0 or nodes.max() >= b1 or (len(columns) and columns[-1] >= b0):
                raise GraphError(
                    "a batch of rows spans two blocks or reads its own block; order nodes as graph.NODE_ORDER documents."
                )
            by_block.setdefault(b, []).append((s, i))
    maps = torch.from_numpy(np.concatenate(node_maps)).to(dev).split([len(m) for m in node_maps])
    for b in range(len(blocks) - 1, -1, -1):
        b0, b1 = blocks[b]
        z[b0:b1] = w[b0:b1] + acc[b0:b1]
        for s, i in by_block.get(b, []):
            rows = sets[s][1]
            local, cols = rows.nodes_and_columns(i, 0)
            nodes = maps[s][local]
            block = rows.block(i)
            a = block.abs().double() if mask is None else _masked_abs(block, mask, nodes, cols)  # [B, n]
            rowsum = a.sum(1)
            inv = torch.where(rowsum > 0, 1.0 / rowsum, torch.zeros_like(rowsum))
            acc.index_add_(0, cols, (z[nodes] * inv) @ a)
            share[nodes] = (a @ err[cols]) * inv
    return StreamedInfluence(influence=(z - w).cpu().numpy(), error_share=share.cpu().numpy())


def _masked_abs(
    block: torch.Tensor, keep: torch.Tensor, nodes: torch.Tensor, cols: torch.Tensor
) -> torch.Tensor:
    """|block| in float64, zero in the rows and columns of the nodes that `keep` (a float mask over
    nodes) leaves out."""
    return block.abs().double() * (keep[nodes][:, None] * keep[cols][None, :])
