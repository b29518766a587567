"""The `lowbit` format: a low-bit-trained item table shipped at its own widths, the rest in int4.

A checkpoint trained with `model.bits` (lsan/models/rowquant.py) has a table whose rows are
exactly (c - L + 0.5) * 2^(e / 8). This format stores what defines them and nothing else:

- `codes` of the rows at each width, packed 8 / bits to a byte (low bits first), the rows of a
  width in id order (2 bits: 8 bytes a row at D = 32, against 21 in int4 with its scale and zero
  point, and 128 in fp32);
- one exponent per row, as a nibble in its width's 16-step window (the few rows outside it
  stored whole; a byte a row where that is smaller, as in tiny tables), and the entries of the
  256-step table that the rows use (a few dozen floats), gathered, not computed, so the values
  are bit for bit PyTorch's;
- with two widths, a bitmask (one bit per row) saying which rows are the hot ones.

A decoder of standard ops (a 256-entry byte table built from a Range, Gather, Concat, CumSum,
Where, Mul) rebuilds the table's exact integers 2(c - L) + 1 as one byte grid (uint8, offset
by ZERO) and each row's half step; every input is a constant, so onnxruntime folds it once
when the session loads, with no intermediate wider than the packed bytes in int32. A request
gathers its history's grid rows and scales them (`integer_lookups`, the float values bit for
bit); the tied output layer (`integer_scores`) multiplies the same grid by h rounded to 8 bits
on the fly, as the int8 format does (so a row's answer depends on its batch and the runtime answers row by row), then
rescales: 1 byte read and held per table value instead of 4. The rest of the graph (encoder weights,
positions) goes through the int4 rewrite (export/int4.py), which leaves the decoder's integer
tensors alone and stores those small tensors as one 4-bit matrix decoded at load
(`int4.ENCODER_DECODED_BELOW`); the `lowbit8` format stores that matrix in 8 bits: a few KB
more, the same graph at run time, steps 17x finer (on Beauty, LSAN's seed-42 student loses
0.0004 test NDCG@10 to its encoder in 4 bits, none in 8).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from lsan.export import ExportError
from lsan.export.fold import producers, prune, sole_reader
from lsan.export.int4 import MS, attr, declare_contrib
from lsan.models import rowquant
from lsan.models.item_tables import BIAS_BITS, LowBitTable

NEEDS_BITS = "needs a checkpoint trained with a low-bit item table (model.bits > 0)"
# What storing the exponents as nibbles adds besides them (bytes): the decoder's nine extra
# nodes and their constants, measured 480-560 B; each row outside its width's window adds 8
# (its row and step as int32). Half a byte a row saves more on Beauty's 12,102 rows (5.1-5.5 KB
# off the file) and ML-100K's 1,350 (0.2 KB); a tiny table keeps a byte a row.
NIBBLE_COST_BYTES = 560


@dataclass(frozen=True)
class PackedTable:
    """A frozen low-bit table as the export stores it (arrays over rows 0..|V|)."""

    codes: np.ndarray  # (R, D) uint8
    exps: np.ndarray  # (R,) int8
    bits: np.ndarray  # (R,) uint8
    bias_codes: np.ndarray | None = None  # (R,) uint8: the output bias at BIAS_BITS, if any
    bias_exp: int = -128  # its step's exponent

    @property
    def values(self) -> np.ndarray:
        """(R, D) float32, PyTorch's decoding: what the fp32 graph holds (and the decoder must
        rebuild), exactly the frozen table's weights."""
        return rowquant.dequantize_rows(
            torch.as_tensor(self.codes), torch.as_tensor(self.exps), torch.as_tensor(self.bits)
        ).numpy()

    @property
    def bias_values(self) -> np.ndarray | None:
        """(R,) float32, the frozen output bias as PyTorch evaluated it (None without one)."""
        if self.bias_codes is None:
            return None
        return rowquant.dequantize_rows(
            torch.as_tensor(self.bias_codes)[None], torch.tensor([self.bias_exp], dtype=torch.int8),
            torch.tensor([BIAS_BITS], dtype=torch.uint8),
        )[0].numpy()  # fmt: skip


def freeze(model: nn.Module) -> PackedTable | None:
    """Freeze a low-bit item table to its quantized values (None for any other table)."""
    table = getattr(model, "item_emb", None)
    if not isinstance(table, LowBitTable):
        return None
    bias = (
        (table.bias_codes().cpu().numpy(), int(table.bias_exp[0]))
        if table.bias is not None
        else (None, -128)
    )
    codes = table.freeze_to_grid()
    return PackedTable(
        codes.cpu().numpy(), table.row_exps.cpu().numpy(), table.row_bits.cpu().numpy(), *bias
    )


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """(R, D) codes < 2^bits -> (R, D * bits / 8) uint8, value j of a byte at bit j * bits."""
    per = 8 // bits
    rows, d = codes.shape
    if d % per:
        raise ExportError(f"a {bits}-bit row of {d} values does not fill whole bytes")
    c = codes.astype(np.uint8).reshape(rows, d // per, per)
    shifts = (np.arange(per, dtype=np.uint8) * bits).astype(np.uint8)
    return np.bitwise_or.reduce(c << shifts, axis=-1).astype(np.uint8)


class _Nodes:
    """Decoder nodes and initializers under one name prefix."""

    def __init__(self, prefix: str):
        self.prefix, self.nodes, self.inits = prefix, [], []
        self.count = 0

    def const(self, array: np.ndarray) -> str:
        name = f"{self.prefix}c{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def op(self, op: str, inputs: list[str], out: str = "", **attrs) -> str:
        out = out or f"{self.prefix}t{self.count}"
        self.count += 1
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def unpacked(self, packed: np.ndarray, bits: int) -> str:
        """Codes (rows, d) as int32 from the packed bytes, in foldable standard ops."""
        x = self.const(packed)
        if bits < 8:
            per = 8 // bits
            x = self.op("Unsqueeze", [x, self.const(np.array([-1], np.int64))])
            shifts = self.const((np.arange(per) * bits).astype(np.uint8))
            x = self.op("BitShift", [x, shifts], direction="RIGHT")
            x = self.op("BitwiseAnd", [x, self.const(np.array((1 << bits) - 1, np.uint8))])
            x = self.op("Reshape", [x, self.const(np.array([packed.shape[0], -1], np.int64))])
        return self.op("Cast", [x], to=TensorProto.INT32)

    def values(self, codes: np.ndarray, bits: int) -> str:
        """Rows (n, D) float: c - L + 0.5 for the codes of one width."""
        return self.centred(self.unpacked(pack(codes, bits), bits), bits)

    def centred(self, ints: str, bits: int) -> str:
        """Float c - L + 0.5 of int32 codes `ints` at `bits` (exact: one subtraction of halves)."""
        c = self.op("Cast", [ints], to=TensorProto.FLOAT)
        return self.op("Add", [c, self.const(np.array(0.5 - 2 ** (bits - 1), np.float32))])

    def grid(self, codes: np.ndarray, bits: int) -> str:
        """Rows (n, D) uint8: 2(c - L) + 1 + ZERO for the codes of one width (bits <= 4),
        each packed byte looked up in a 256-entry table of its values (built from a Range, so
        nothing is stored). Every intermediate is the packed bytes' size in int32 or smaller:
        unpacking through int32 / float tables of every value made a load-time peak of ~10 MB
        for Beauty's 164 KB artifact (more than an fp32 model's)."""
        per, i32 = 8 // bits, TensorProto.INT32
        byte = self.op("Unsqueeze", [self.op("Range", [self.const(np.array(0, np.int32)),
                                                       self.const(np.array(256, np.int32)),
                                                       self.const(np.array(1, np.int32))]),
                                     self.const(np.array([-1], np.int64))])  # fmt: skip
        c = self.op("Mod", [self.op("Div", [byte, self.const((2 ** (np.arange(per) * bits)).astype(np.int32))]),
                            self.const(np.array(2**bits, np.int32))])  # fmt: skip
        v = self.op("Add", [self.op("Mul", [c, self.const(np.array(2, np.int32))]),
                            self.const(np.array(1 - 2**bits + ZERO, np.int32))])  # fmt: skip
        lut = self.op("Cast", [v], to=TensorProto.UINT8)  # (256, per), offset by ZERO
        idx = self.op("Cast", [self.const(pack(codes, bits))], to=i32)  # (n, D / per)
        rows = self.op("Gather", [lut, idx], axis=0)  # (n, D / per, per)
        return self.op("Reshape", [rows, self.const(np.array([len(codes), -1], np.int64))])

    def scaled(self, grid_rows: str, halves: str, out: str = "") -> str:
        """Float rows from grid rows: grid * half step = (c - L + 0.5) * step, the same
        product as PyTorch's, rounded once (`halves` broadcast per row)."""
        ints = self.op("DequantizeLinear", [grid_rows, self.const(np.array(1.0, np.float32)),
                                            self.const(np.array(ZERO, np.uint8))])  # fmt: skip
        return self.op("Mul", [ints, halves], out)

    def vector(self, values: np.ndarray, bits: int) -> str:
        """A stored 1-D vector of values < 2^bits, packed (bits < 8), as int32 (N,)."""
        padded = np.pad(values.astype(np.uint8), (0, -len(values) % (8 // bits)))
        v = self.op("Reshape", [self.unpacked(pack(padded[None], bits), bits),
                                self.const(np.array([-1], np.int64))])  # fmt: skip
        return self.op("Slice", [v, self.const(np.array([0], np.int64)),
                                 self.const(np.array([len(values)], np.int64))])  # fmt: skip

    def order(self, is_hot: np.ndarray) -> tuple[str, str]:
        """From a stored bitmask (one bit per row): each row's position in its hot rows then
        its cold rows stacked (each part in id order), and the mask as bool."""
        m = self.op("Cast", [self.vector(is_hot, 1)], to=TensorProto.INT64)
        seen = self.op("CumSum", [m, self.const(np.array(0, np.int64))])  # hot rows up to each
        ids = self.op("Range", [self.const(np.array(0, np.int64)),
                                self.const(np.array(len(is_hot), np.int64)),
                                self.const(np.array(1, np.int64))])  # fmt: skip
        hot_at = self.op("Sub", [seen, self.const(np.array(1, np.int64))])
        cold_at = self.op("Add", [self.op("Sub", [ids, seen]),
                                  self.const(np.array(int(is_hot.sum()), np.int64))])  # fmt: skip
        hot = self.op("Cast", [m], to=TensorProto.BOOL)
        return self.op("Where", [hot, hot_at, cold_at]), hot

    def step_indices(
        self, at: np.ndarray, groups: list[np.ndarray], found: tuple, stacked: tuple | None
    ) -> str:
        """Each row's index `at` into the steps the table uses (int32, id order), stored as one
        nibble a row from its width's 16-step window (`found`, from `windows`); the few rows
        outside it are stored whole and scattered in. `groups` are the widths' row masks, the
        hot one first; `stacked` (positions, hot mask) from `order` when there are two."""
        assert (stacked is None) == (len(groups) == 1)
        bases, inside, outside = found
        off = self.vector(np.concatenate([np.where(i, at - b, 0)[g]
                                          for g, b, i in zip(groups, bases, inside, strict=True)]), 4)  # fmt: skip
        if stacked is None:
            idx = self.op("Add", [off, self.const(np.array(bases[0], np.int32))])
        else:
            where, hot = stacked
            row_base = self.op("Where", [hot, self.const(np.array(bases[0], np.int32)),
                                         self.const(np.array(bases[1], np.int32))])  # fmt: skip
            idx = self.op("Add", [self.op("Gather", [off, where], axis=0), row_base])
        if not len(outside):
            return idx
        return self.op("ScatterElements", [idx, self.const(outside), self.const(at[outside])])

    def merged(self, hot_rows: str, cold_rows: str, positions: str) -> str:
        """The table's rows in id order from its hot rows and its cold rows (each in id order):
        one Gather of the two stacked, at the `positions` that `order` computed."""
        both = self.op("Concat", [hot_rows, cold_rows], axis=0)
        return self.op("Gather", [both, positions], axis=0)


def windows(at: np.ndarray, groups: list[np.ndarray]) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Per group of rows, the start of the 16-step window holding most of its `at` values;
    (groups, rows) masks of the rows of each group inside its window; the rows outside every
    window (int32 ids), which are stored whole."""
    bases = []
    for g in groups:
        counts = np.bincount(at[g], minlength=at.max() + 16)
        bases.append(int(np.argmax(np.convolve(counts, np.ones(16, int), "valid"))))
    inside = np.stack([g & (at >= b) & (at < b + 16) for g, b in zip(groups, bases, strict=True)])
    return bases, inside, np.flatnonzero(~np.any(inside, axis=0)).astype(np.int32)


def decoder(
    t: PackedTable, out: str, prefix: str, nibbles: bool | None = None
) -> tuple[list, list]:
    """Nodes and initializers that compute table `out` (R, D) float32 from `t`'s stored form.

    A table of rows up to 4 bits also gets `out + GRID`, its integers 2(c - L) + 1 as uint8
    offset by ZERO, and `out + HALF`, each row's half step: the float table is then computed
    from them, and readers rewritten to use them instead (integer_scores, integer_lookups) leave
    it unread, so it is pruned and never held in memory."""
    n = _Nodes(prefix)
    widths = sorted(set(t.bits.tolist()))
    if len(widths) > 2:
        raise ExportError(f"the lowbit format stores at most two row widths, not {widths}")
    grid = widths[-1] <= 4  # integers |2(c - L) + 1| <= 15 fit a byte
    rows_of = n.grid if grid else n.values
    stacked = None
    if len(widths) == 1:
        rows = rows_of(t.codes, widths[0])
    else:
        is_hot = t.bits == widths[1]
        stacked = n.order(is_hot)
        rows = n.merged(rows_of(t.codes[is_hot], widths[1]), rows_of(t.codes[~is_hot], widths[0]),
                        stacked[0])  # fmt: skip
    # only the steps the rows use (a trained table spans a few octaves of the 256): the same
    # float32 values as PyTorch's step_table(), indexed from the lowest exponent used
    lo, hi = int(t.exps.min()) + 128, int(t.exps.max()) + 128
    at = t.exps.astype(np.int32) + 128 - lo
    groups = [t.bits == w for w in reversed(widths)]  # hot rows first, as stacked
    found = windows(at, groups)
    if nibbles is None:
        nibbles = len(at) - (len(at) + 1) // 2 > NIBBLE_COST_BYTES + 8 * len(found[2])
    if nibbles:
        at = n.step_indices(at, groups, found, stacked)
    else:
        at = n.op("Add", [n.op("Cast", [n.const(t.exps)], to=TensorProto.INT32),
                          n.const(np.array(128 - lo, np.int32))])  # fmt: skip
    flat = n.op("Gather", [n.const(rowquant.step_table().numpy()[lo : hi + 1]), at], axis=0)
    column = n.const(np.array([-1], np.int64))
    if not grid:
        n.op("Mul", [rows, n.op("Unsqueeze", [flat, column])], out)
        return n.nodes, n.inits
    n.op("Identity", [rows], out + GRID)
    half = n.op("Mul", [flat, n.const(np.array(0.5, np.float32))], out + HALF)
    n.scaled(out + GRID, n.op("Unsqueeze", [half, column]), out)
    return n.nodes, n.inits


GRID, HALF = "_grid", "_half"  # decoder outputs beside the float table: integers, half steps
# The grid's integers are stored as uint8 plus ZERO (their zero point), not as int8: for
# onnxruntime's DynamicQuantizeMatMul, whose A it rounds to uint8, a uint8 B takes the u8u8
# kernel; an int8 B took the u8s8 one, which on the Intel Xeon of stop 50 (AVX-512, AMX) is
# 1.7-2.2x slower at batch 1 (stop 52: 0.029 against 0.017 ms at 12,101 x 32, 4.4 against
# 2.0 ms at 1M; the same results bit for bit).
ZERO = 128


def _rewrite(model: onnx.ModelProto, tag: str, matches, build) -> int:
    """Replace each node `matches` accepts by what `build(nodes, node)` adds (writing the node's
    output), then drop what nothing reads any more; the count replaced."""
    graph = model.graph
    new, done = [], 0
    for node in list(graph.node):
        if not matches(node):
            new.append(node)
            continue
        n = _Nodes(f"{node.output[0]}_{tag}_")
        build(n, node)
        new += n.nodes
        graph.initializer.extend(n.inits)
        done += 1
    if done:
        del graph.node[:]
        graph.node.extend(new)
    prune(model)
    return done


def integer_scores(model: onnx.ModelProto, table: str, bias: str | None = None) -> int:
    """The tied output layer `h @ Transpose(table) [+ bias]` on the table's integer grid, as one
    onnxruntime DynamicQuantizeMatMul and one Mul: h rounded to uint8 on the fly (one scale per
    tensor, as the int8 format does, so a row's answer depends on its batch and the runtime
    answers row by row), times the byte grid (its zero point ZERO, transposed at load: 1 byte
    a value, no float table), times each item's half step. The output bias, when `bias` names
    it and it is added right after, rides in the product as bias / half step. Rounding each
    row of h at its own
    scale instead took 12 nodes (Abs, ReduceMax, QuantizeLinear, MatMulInteger, ...): this is 9
    fewer and 7-10% faster a request on Beauty (stop 46, interleaved; LSAN's student 0.100 ->
    0.090 ms warm). The count rewritten (0 for a table without a grid, one with 8-bit rows)."""
    made = producers(model)
    grid = table + GRID in made
    only_reader = sole_reader(model.graph)
    biased: dict[str, onnx.NodeProto] = {}  # product -> the bias Add folded into it

    def matches(node) -> bool:
        src = made.get(node.input[1]) if node.op_type == "MatMul" else None
        return grid and src is not None and src.op_type == "Transpose" and src.input[0] == table

    for node in model.graph.node:
        add = only_reader(node.output[0], "Add") if bias and matches(node) else None
        if add is not None and set(add.input) == {node.output[0], bias}:
            biased[node.output[0]] = add
    for add in biased.values():
        model.graph.node.remove(add)

    def build(n: _Nodes, node) -> None:
        grid_t = n.op("Transpose", [table + GRID], perm=[1, 0])  # folded at load
        inputs = [node.input[0], grid_t, n.const(np.array(1.0, np.float32)),
                  n.const(np.array(ZERO, np.uint8))]  # fmt: skip
        add = biased.get(node.output[0])
        if add is not None:
            inputs.append(n.op("Div", [bias, table + HALF]))
        dots = n.op("DynamicQuantizeMatMul", inputs, domain=MS)
        n.op("Mul", [dots, table + HALF], (add or node).output[0])

    done = _rewrite(model, "is", matches, build)  # prunes the float Transpose
    declare_contrib(model)
    return done


def integer_lookups(model: onnx.ModelProto, table: str) -> int:
    """Row lookups `Gather(table, ids)` decoded from the integer grid per request: the gathered
    grid rows times their half steps (the float table's values bit for bit).
    With the scores on the grid too, no float copy of the table is held: 1 byte a value in
    memory instead of 5. The count rewritten (0 for a table without a grid)."""
    grid = table + GRID in producers(model)

    def matches(node) -> bool:
        return (
            grid
            and node.op_type == "Gather"
            and node.input[0] == table
            and attr(node, "axis", 0) == 0
        )

    def build(n: _Nodes, node) -> None:
        ids = node.input[1]
        halves = n.op("Unsqueeze", [table + HALF, n.const(np.array([-1], np.int64))])
        n.scaled(n.op("Gather", [table + GRID, ids], axis=0),
                 n.op("Gather", [halves, ids], axis=0), node.output[0])  # fmt: skip

    return _rewrite(model, "il", matches, build)  # prunes the float table once unread


def replace_table(model: onnx.ModelProto, t: PackedTable) -> str:
    """Swap the float initializer holding `t.values` for its decoder; the initializer's name."""
    return _swap(model, t.values, "item table", lambda name: decoder(t, name, f"{name}_lb_"))


def _swap(model: onnx.ModelProto, values: np.ndarray, what: str, build) -> str:
    """Swap the float initializer holding `values` for the nodes and initializers that
    `build(name)` returns (computing it); the initializer's name."""
    graph = model.graph
    for i, init in enumerate(graph.initializer):
        if list(init.dims) != list(values.shape) or init.data_type != TensorProto.FLOAT:
            continue
        if np.array_equal(numpy_helper.to_array(init), values):
            nodes, inits = build(init.name)
            del graph.initializer[i]
            graph.initializer.extend(inits)
            rest = list(graph.node)
            del graph.node[:]
            graph.node.extend(nodes + rest)
            return init.name
    raise ExportError(f"the low-bit {what} was not found in the exported graph")


def replace_bias(model: onnx.ModelProto, t: PackedTable) -> str | None:
    """Swap the float output bias for its BIAS_BITS codes (packed) and one step, decoded at load
    as (c - L + 0.5) * step: PyTorch's values bit for bit. None without a bias."""
    codes, values = t.bias_codes, t.bias_values
    if codes is None or values is None:
        return None

    def build(name: str) -> tuple[list, list]:
        n = _Nodes(f"{name}_lb_")
        c = n.centred(n.vector(codes, BIAS_BITS), BIAS_BITS)
        step = rowquant.step_table().numpy()[t.bias_exp + 128]
        n.op("Mul", [c, n.const(np.array(step, np.float32))], name)
        return n.nodes, n.inits

    return _swap(model, values, "output bias", build)


def quantize_lowbit(fp32: Path, out: Path, t: PackedTable | None, encoder_bits: int = 4) -> None:
    """Write the lowbit format of the fp32 graph `fp32` to `out`; `encoder_bits` 8: the
    encoder's one stored matrix in 8 bits (the `lowbit8` format)."""
    if t is None:
        raise ExportError(f"the lowbit format {NEEDS_BITS}")
    from lsan.export.int4 import ENCODER_DECODED_BELOW, quantize_int4

    model = onnx.load(str(fp32))
    table = replace_table(model, t)
    integer_scores(model, table, replace_bias(model, t))
    integer_lookups(model, table)
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / "table.onnx"
        onnx.save(model, str(staged))
        report = quantize_int4(
            staged, out, decode_below=ENCODER_DECODED_BELOW, decode_bits=encoder_bits
        )
    if encoder_bits == 8 and not report["rewritten"].get("decoded at load (blob)"):
        raise ExportError(  # the same file as lowbit: not a format of its own
            "lowbit8 would equal lowbit: no encoder weight is quantized (each has fewer than "
            "1024 values and stays float)"
        )
