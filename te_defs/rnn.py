"""Recurrent grads: cudnn_lstm_grad (the backward of Paddle's cuDNN LSTM).

Layout (Paddle 3.3.1, python/paddle/nn/layer/rnn.py ``flatten_parameters`` and the GPU kernels'
cudnn_lstm_utils.h; the CPU ``rnn`` op takes the same list): with D = 2 if is_bidirec else 1
directions and L = num_layers, ``weight_list`` holds first the matrices, for every layer l and
direction d: W_ih [4H, I_l] then W_hh [4H, H] (index 2·(l·D + d) + {0, 1}); then the biases in the
same order: b_ih [4H], b_hh [4H] (index 2·L·D + 2·(l·D + d) + {0, 1}). I_0 = input_size,
I_l = D·H above. Gate rows are ordered i, f, g (cell candidate), o. init_h / init_c /
last_h_grad / last_c_grad are [L·D, B, H] (row l·D + d), x is [T, B, I] (time major), out /
out_grad are [T, B, D·H] (direction d in columns d·H .. d·H + H).

Forward of one (layer, direction): gates = W_ih·x_t + b_ih + W_hh·h + b_hh; c = σ(f)·c + σ(i)·tanh(g),
h = σ(o)·tanh(c). ``sequence_length`` [B]: steps t >= len[b] are padding — the output there is 0
and the state passes through unchanged (the reverse direction therefore starts at t = len[b] − 1
from init_h/init_c, as cuDNN's padded-sequence mode and Paddle's CPU rnn compute it); last_h /
last_c are the states after the last real step.

``reserve`` and ``state_out`` are cuDNN-opaque (its workspace and dropout state): not read. The
forward activations are recomputed here instead, per layer and direction: the input projection
W_ih·x for all steps as a parallel stage, the recurrence as a sequential kernel (te.extern, one
unit per batch row, the time loop inside: it stores every step's activated gates and cell and hidden
states), then the backward recurrence (one unit per batch row, reverse step order) gives the gate
grads dG, and parallel reduction stages give dW_ih = Σ dG·x, dW_hh = Σ dG·h_prev,
db_ih = db_hh = Σ dG and the input grad dG·W_ih (which, above the first layer, is the gradient of
the lower layer's outputs). ``out`` is not read either (it is recomputed with everything else).

Dropout between layers (dropout_prob > 0, not is_test, more than one layer) uses cuDNN's random
mask, which cannot be recomputed: refused with a ValueError. Half types compute in float32.
"""

from __future__ import annotations

import numpy as np

from tvmgrad.families import tensor_op

from ._extern import scratch

__all__ = ["cudnn_lstm_grad"]


def _shape(m):
    return None if m is None else tuple(m.shape)


def _check(call, outs):
    op = call.op
    a = call.attrs
    H, L, D = a["hidden_size"], a["num_layers"], 2 if a["is_bidirec"] else 1
    if H <= 0:
        raise ValueError(f"{op}: attribute 'hidden_size' must be positive, got {H}")
    if L <= 0:
        raise ValueError(f"{op}: attribute 'num_layers' must be positive, got {L}")
    if a["dropout_prob"] < 0 or a["dropout_prob"] >= 1:
        raise ValueError(f"{op}: attribute 'dropout_prob' must be in [0, 1), got {a['dropout_prob']}")
    if a["dropout_prob"] > 0 and not a["is_test"] and L > 1:
        raise ValueError(f"{op}: attribute 'dropout_prob' = {a['dropout_prob']} in training: the "
                         f"dropout masks between layers are cuDNN's random state (reserve/"
                         f"state_out), which cannot be recomputed; only dropout_prob = 0 (or "
                         f"is_test) is supported")
    x = _shape(call.meta("x"))
    T, B, I = x
    if B == 0:
        # (cuDNN, Paddle's only kernel, rejects it too; here the kernel's batch-fused loops
        # would divide by the batch sizing their buffers: SIGFPE)
        raise ValueError(f"{op}: input 'x' has batch size 0 (shape {list(x)}): an empty batch "
                         f"is not supported")
    for name in ("init_h", "init_c", "last_h_grad", "last_c_grad"):
        s = _shape(call.meta(name))
        if s != (L * D, B, H):
            raise ValueError(f"{op}: input {name!r} must be [num_layers * directions, batch, "
                             f"hidden_size] = {[L * D, B, H]} (batch from 'x'), got {list(s)}")
    for name in ("out", "out_grad"):
        s = _shape(call.meta(name))
        if s != (T, B, D * H):
            raise ValueError(f"{op}: input {name!r} must be [seq_len, batch, directions * "
                             f"hidden_size] = {[T, B, D * H]} (seq_len and batch from 'x'), got "
                             f"{list(s)}")
    wl = call.meta("weight_list")
    if wl is None:
        raise ValueError(f"{op}: input 'weight_list' is required (the flat cuDNN weight buffer "
                         f"'w' of the forward is not an input of the grad)")
    if len(wl) != 4 * L * D:
        raise ValueError(f"{op}: input 'weight_list' must hold 4 * num_layers * directions = "
                         f"{4 * L * D} tensors, got {len(wl)}")
    for layer in range(L):
        width = I if layer == 0 else D * H
        for d in range(D):
            k = 2 * (layer * D + d)
            for j, want in ((k, (4 * H, width)), (k + 1, (4 * H, H)),
                            (2 * L * D + k, (4 * H,)), (2 * L * D + k + 1, (4 * H,))):
                if _shape(wl[j]) != want:
                    src = (" (4·hidden_size, the input_size of 'x')" if layer == 0 and j == k
                           else " (4·hidden_size, ...)")
                    raise ValueError(f"{op}: input 'weight_list[{j}]' (layer {layer}, direction "
                                     f"{d}) must be {list(want)}{src}, got {list(_shape(wl[j]))}")
    sl = call.meta("sequence_length")
    if sl is not None:
        if _shape(sl) != (B,):
            raise ValueError(f"{op}: input 'sequence_length' must be [{B}] (one per batch row "
                             f"of 'x'), got {list(_shape(sl))}")
        v = np.asarray(call.tensors["sequence_length"])
        if v.size and (v.min() < 0 or v.max() > T):
            raise ValueError(f"{op}: input 'sequence_length' must hold lengths in [0, {T}], got "
                             f"{v.tolist()}")


@tensor_op(float_inputs=("x", "init_h", "init_c", "weight_list", "out", "out_grad",
                         "last_h_grad", "last_c_grad"),
           index_dtypes=("int32", "int64", "uint8"), validate=_check, pattern="extern_units")
def cudnn_lstm_grad(x, init_h, init_c, weight_list, sequence_length, out, reserve, state_out,
                    out_grad, last_h_grad, last_c_grad, dropout_prob, is_bidirec, hidden_size,
                    num_layers, is_test, seed):
    """x, init_h, init_c and weight_list grads of the LSTM (see the module docstring)"""
    from tvm import te, tirx

    from tvmgrad.dtypes import dtype as as_dtype, to_compute

    dt = as_dtype(str(x.dtype))
    cdt = dt.compute
    L, D = int(num_layers), 2 if is_bidirec else 1
    T, B = x.shape[0], x.shape[1]
    Hn = tirx.const(int(hidden_size), "int64")
    i64 = lambda v: tirx.const(v, "int64")  # noqa: E731

    def comp(t, name):
        if dt.storage == cdt:
            return t
        return te.compute(t.shape, lambda *i: to_compute(t(*i), dt), name=name)

    xc = comp(x, "x_c")
    h0_all, c0_all = comp(init_h, "h0_c"), comp(init_c, "c0_c")
    dhT_all, dcT_all = comp(last_h_grad, "dhT_c"), comp(last_c_grad, "dcT_c")
    dout = comp(out_grad, "dout_c")
    ws = [comp(w, f"w{j}_c") for j, w in enumerate(weight_list)]

    def rows(t, r, name):
        return te.compute((B, Hn), lambda b, j: t[i64(r), b, j], name=name)

    # ---------------------------------------------------------------- forward (recompute)
    layer_in = xc
    saved = []                       # per layer: (input, [per direction: (gates, cells, hiddens)])
    for layer in range(L):
        width = layer_in.shape[2]
        dirs = []
        for d in range(D):
            k = 2 * (layer * D + d)
            w_ih, w_hh = ws[k], ws[k + 1]
            b_ih, b_hh = ws[2 * L * D + k], ws[2 * L * D + k + 1]
            kk = te.reduce_axis((i64(0), width), name=f"k{layer}{d}")
            proj = te.compute((T, B, 4 * Hn), lambda t, b, g: te.sum(
                layer_in[t, b, kk] * w_ih[g, kk], axis=kk), name=f"xproj{layer}{d}")
            r = layer * D + d
            h0, c0 = rows(h0_all, r, f"h0_{layer}{d}"), rows(c0_all, r, f"c0_{layer}{d}")
            gates, cells, hid, tcell = _forward_seq(proj, w_hh, b_ih, b_hh, h0, c0, sequence_length,
                                             reverse=d == 1, cdt=cdt, name=f"lstm_fwd{layer}{d}")
            dirs.append((gates, (cells, tcell), hid, h0, c0, w_ih, w_hh))
        saved.append((layer_in, dirs))
        if layer + 1 < L:
            layer_in = te.compute((T, B, D * Hn), _outputs(dirs, sequence_length, Hn, cdt),
                                  name=f"y{layer}")

    # ---------------------------------------------------------------- backward
    wgrads = [None] * len(ws)
    h_grads, c_grads = [None] * (L * D), [None] * (L * D)
    upper = None                                 # the input grads of the layer above, per direction
    x_grad_c = None
    for layer in range(L - 1, -1, -1):
        layer_in, dirs = saved[layer]
        width = layer_in.shape[2]
        dins = []
        for d in range(D):
            gates, cells, hid, h0, c0, w_ih, w_hh = dirs[d]
            r = layer * D + d
            if upper is None:
                dy = te.compute((T, B, Hn), lambda t, b, j: dout[t, b, i64(d) * Hn + j],
                                name=f"dy{layer}{d}")
            else:
                dy = te.compute((T, B, Hn), _sum_dirs(upper, d, Hn), name=f"dy{layer}{d}")
            dhT, dcT = rows(dhT_all, r, f"dhT{layer}{d}"), rows(dcT_all, r, f"dcT{layer}{d}")
            dg, dh0, dc0 = _backward_seq(gates, cells, c0, w_hh, dy, dhT, dcT, sequence_length,
                                         reverse=d == 1, cdt=cdt, name=f"lstm_bwd{layer}{d}")
            h_grads[r], c_grads[r] = dh0, dc0
            hprev = te.compute((T, B, Hn), _prev_state(hid, h0, T, d == 1), name=f"hprev{layer}{d}")
            k = 2 * (layer * D + d)
            tb = (te.reduce_axis((i64(0), T), name=f"t_ih{layer}{d}"),
                  te.reduce_axis((i64(0), B), name=f"b_ih{layer}{d}"))
            wgrads[k] = te.compute((4 * Hn, width), lambda g, c: te.sum(
                dg[tb[0], tb[1], g] * layer_in[tb[0], tb[1], c], axis=list(tb)),
                name=f"dw_ih{layer}{d}")
            tb2 = (te.reduce_axis((i64(0), T), name=f"t_hh{layer}{d}"),
                   te.reduce_axis((i64(0), B), name=f"b_hh{layer}{d}"))
            wgrads[k + 1] = te.compute((4 * Hn, Hn), lambda g, c: te.sum(
                dg[tb2[0], tb2[1], g] * hprev[tb2[0], tb2[1], c], axis=list(tb2)),
                name=f"dw_hh{layer}{d}")
            tb3 = (te.reduce_axis((i64(0), T), name=f"t_b{layer}{d}"),
                   te.reduce_axis((i64(0), B), name=f"b_b{layer}{d}"))
            db = te.compute((4 * Hn,), lambda g: te.sum(dg[tb3[0], tb3[1], g], axis=list(tb3)),
                            name=f"db{layer}{d}")
            wgrads[2 * L * D + k] = db
            wgrads[2 * L * D + k + 1] = db
            gg = te.reduce_axis((i64(0), 4 * Hn), name=f"g_in{layer}{d}")
            dins.append(te.compute((T, B, width), lambda t, b, c: te.sum(
                dg[t, b, gg] * w_ih[gg, c], axis=gg), name=f"din{layer}{d}"))
        upper = dins
        if layer == 0:
            x_grad_c = dins

    store = dt.storage
    x_grad = te.compute(x.shape, lambda t, b, c: _add(x_grad_c, (t, b, c)).astype(store),
                        name="x_grad")

    def stack(parts, name):
        def value(r, b, j):
            v = parts[-1][b, j]
            for q in range(len(parts) - 2, -1, -1):
                v = tirx.Select(r == i64(q), parts[q][b, j], v)
            return v.astype(store)
        return te.compute(init_h.shape, value, name=name)

    init_h_grad = stack(h_grads, "init_h_grad")
    init_c_grad = stack(c_grads, "init_c_grad")
    def cast_of(g):
        return lambda *i: g(*i).astype(store)

    w_out = [te.compute(w.shape, cast_of(g), name=f"weight_grad{j}")
             for j, (w, g) in enumerate(zip(weight_list, wgrads))]
    return x_grad, init_h_grad, init_c_grad, w_out


def _add(parts, idx):
    v = parts[0](*idx)
    for p in parts[1:]:
        v = v + p(*idx)
    return v


def _sum_dirs(upper, d, Hn):
    from tvm import tirx

    def value(t, b, j):
        col = tirx.const(d, "int64") * Hn + j
        return _add([lambda *i, u=u: u(*i[:2], col) for u in upper], (t, b))
    return value


def _valid(seq_len, b, t):
    from tvm import tirx
    if seq_len is None:
        return tirx.const(True, "bool")
    return t < seq_len[b].astype("int64")


def _outputs(dirs, seq_len, Hn, cdt):
    """A layer's output [T, B, D·H]: the hidden state of each direction, 0 on padding steps."""
    from tvm import tirx

    def value(t, b, c):
        d_idx = c // Hn
        j = c % Hn
        v = dirs[-1][2][t, b, j]
        for q in range(len(dirs) - 2, -1, -1):
            v = tirx.Select(d_idx == tirx.const(q, "int64"), dirs[q][2][t, b, j], v)
        return tirx.Select(_valid(seq_len, b, t), v, tirx.const(0.0, cdt))
    return value


def _prev_state(states, s0, T, reverse):
    """The state a step starts from: the previous step's state (states carry through padding),
    or the initial state at the first step."""
    from tvm import tirx

    one, zero = tirx.const(1, "int64"), tirx.const(0, "int64")

    def value(t, b, j):
        if reverse:
            first = t == T - one
            p = tirx.min(t + one, T - one)
        else:
            first = t == zero
            p = tirx.max(t - one, zero)
        return tirx.Select(first, s0[b, j], states[p, b, j])
    return value


def _sig(v, cdt):
    from tvm import tirx
    one = tirx.const(1.0, cdt)
    return one / (one + tirx.exp(-v))


def _tanh(v, cdt):
    """tanh through exp of −2|v| (TVM's llvm tanh loses precision near 0)."""
    from tvm import tirx
    one, two = tirx.const(1.0, cdt), tirx.const(2.0, cdt)
    e = tirx.exp(-two * tirx.abs(v))
    return (one - e) / (one + e) * tirx.Select(v < tirx.const(0.0, cdt), -one, one)


def _step(s, T, reverse):
    from tvm import tirx
    return T - tirx.const(1, "int64") - s if reverse else s


def _units(name, extent):
    """One spatial sblock per batch row (the sequential unit); yields its axis var."""
    from contextlib import contextmanager

    from tvm.script.ir_builder import tirx as T

    @contextmanager
    def ctx():
        with T.grid(extent) as lv:
            lv = lv[0] if isinstance(lv, (list, tuple)) else lv
            with T.sblock(name):
                yield T.axis.spatial(extent, lv, dtype="int64")
    return ctx()


def _seq(n):
    from tvm import tirx
    from tvm.script.ir_builder import tirx as T
    return T.serial(tirx.const(0, "int64"), n)


def _forward_seq(proj, w_hh, b_ih, b_hh, h0, c0, seq_len, *, reverse, cdt, name):
    """The recurrence of one (layer, direction): per batch row, in step order, gates (activated,
    [T, B, 4H]), cell states and hidden states [T, B, H] after each step (carried through
    padding steps, where the gates are 0)."""
    from tvm import te, tirx
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    Tn, Bn, G4 = proj.shape
    Hn = h0.shape[1]
    ins = [proj, w_hh, b_ih, b_hh, h0, c0] + ([seq_len] if seq_len is not None else [])

    def gen(ins_b, outs_b):
        P, Whh, Bi, Bh, H0, C0 = (T.buffer_proxy(q) for q in ins_b[:6])
        SL = T.buffer_proxy(ins_b[6]) if seq_len is not None else None
        Gs, Cs, Hs, TC = (T.buffer_proxy(q) for q in outs_b)
        nT, nH = ins_b[0].shape[0], ins_b[4].shape[1]
        zero = tirx.const(0.0, cdt)
        i0, i1 = tirx.const(0, "int64"), tirx.const(1, "int64")
        with IRBuilder() as ib:
            with _units(name, ins_b[0].shape[1]) as b:
                T.reads(ins_b[0][0:nT, b, 0:4 * nH], ins_b[1][0:4 * nH, 0:nH], ins_b[2][0:4 * nH],
                        ins_b[3][0:4 * nH], ins_b[4][b, 0:nH], ins_b[5][b, 0:nH],
                        *([ins_b[6][b]] if seq_len is not None else []))
                T.writes(outs_b[0][0:nT, b, 0:4 * nH], outs_b[1][0:nT, b, 0:nH],
                         outs_b[2][0:nT, b, 0:nH], outs_b[3][0:nT, b, 0:nH])
                acc = T.buffer_proxy(scratch((1,), cdt))
                act = T.buffer_proxy(scratch((4,), cdt))
                with _seq(nT) as s:
                    t = _step(s, nT, reverse)
                    if reverse:       # the state before step t: after step t + 1, or the initial
                        first, p = t == nT - i1, tirx.min(t + i1, nT - i1)
                    else:
                        first, p = t == i0, tirx.max(t - i1, i0)
                    valid = (t < SL[b].astype("int64")) if SL is not None else None

                    def hprev(k):
                        return tirx.Select(first, H0[b, k], Hs[p, b, k])

                    def cprev(k):
                        return tirx.Select(first, C0[b, k], Cs[p, b, k])

                    def body():
                        with _seq(4 * nH) as g:
                            acc[0] = P[t, b, g] + Bi[g] + Bh[g]
                            with _seq(nH) as k:
                                acc[0] = acc[0] + Whh[g, k] * hprev(k)
                            Gs[t, b, g] = acc[0]
                        with _seq(nH) as j:
                            # activate into registers first: an expression over Gs[...] would
                            # re-read the buffer after it is overwritten below
                            act[0] = _sig(Gs[t, b, j], cdt)
                            act[1] = _sig(Gs[t, b, nH + j], cdt)
                            act[2] = _tanh(Gs[t, b, 2 * nH + j], cdt)
                            act[3] = _sig(Gs[t, b, 3 * nH + j], cdt)
                            Gs[t, b, j] = act[0]
                            Gs[t, b, nH + j] = act[1]
                            Gs[t, b, 2 * nH + j] = act[2]
                            Gs[t, b, 3 * nH + j] = act[3]
                            acc[0] = act[1] * cprev(j) + act[0] * act[2]
                            Cs[t, b, j] = acc[0]
                            act[0] = _tanh(acc[0], cdt)
                            TC[t, b, j] = act[0]
                            Hs[t, b, j] = act[3] * act[0]

                    if valid is None:
                        body()
                    else:
                        with T.If(valid):
                            with T.Then():
                                body()
                            with T.Else():
                                with _seq(4 * nH) as g:
                                    Gs[t, b, g] = zero
                                with _seq(nH) as j:
                                    Cs[t, b, j] = cprev(j)
                                    Hs[t, b, j] = hprev(j)
                                    TC[t, b, j] = zero
        return ib.get()

    outs = te.extern([(Tn, Bn, G4), (Tn, Bn, Hn), (Tn, Bn, Hn), (Tn, Bn, Hn)], ins, gen,
                     name=name, dtype=[cdt] * 4)
    return outs[0], outs[1], outs[2], outs[3]


def _backward_seq(gates, cells, c0, w_hh, dy, dhT, dcT, seq_len, *, reverse, cdt, name):
    """The backward recurrence of one (layer, direction) (``cells``: the cell states and their
    tanh, stored by the forward so that this kernel needs no division): per batch row, in reverse step order,
    the pre-activation gate grads dG [T, B, 4H] (0 on padding steps), and the grads of the
    initial states."""
    from tvm import te, tirx
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    Tn, Bn, G4 = gates.shape
    Hn = c0.shape[1]
    ins = [gates, cells[0], c0, w_hh, dy, dhT, dcT, cells[1]] + (
        [seq_len] if seq_len is not None else [])

    def gen(ins_b, outs_b):
        Gs, Cs, C0, Whh, DY, DHT, DCT, TC = (T.buffer_proxy(q) for q in ins_b[:8])
        SL = T.buffer_proxy(ins_b[8]) if seq_len is not None else None
        DG, DH, DC = (T.buffer_proxy(q) for q in outs_b)
        nT, nH = ins_b[0].shape[0], ins_b[2].shape[1]
        zero, one = tirx.const(0.0, cdt), tirx.const(1.0, cdt)
        i1 = tirx.const(1, "int64")
        with IRBuilder() as ib:
            with _units(name, ins_b[0].shape[1]) as b:
                T.reads(ins_b[0][0:nT, b, 0:4 * nH], ins_b[1][0:nT, b, 0:nH], ins_b[2][b, 0:nH],
                        ins_b[3][0:4 * nH, 0:nH], ins_b[4][0:nT, b, 0:nH], ins_b[5][b, 0:nH],
                        ins_b[6][b, 0:nH], ins_b[7][0:nT, b, 0:nH],
                        *([ins_b[8][b]] if seq_len is not None else []))
                T.writes(outs_b[0][0:nT, b, 0:4 * nH], outs_b[1][b, 0:nH], outs_b[2][b, 0:nH])
                acc = T.buffer_proxy(scratch((2,), cdt))
                with _seq(nH) as j:
                    DH[b, j] = DHT[b, j]
                    DC[b, j] = DCT[b, j]
                with _seq(nT) as s:
                    t = _step(s, nT, not reverse)          # the forward's steps, last first
                    if reverse:
                        first, p = t == nT - i1, tirx.min(t + i1, nT - i1)
                    else:
                        first, p = t == tirx.const(0, "int64"), tirx.max(t - i1, tirx.const(0, "int64"))
                    valid = (t < SL[b].astype("int64")) if SL is not None else None

                    def body():
                        with _seq(nH) as j:
                            gi, gf = Gs[t, b, j], Gs[t, b, nH + j]
                            gg, go = Gs[t, b, 2 * nH + j], Gs[t, b, 3 * nH + j]
                            acc[0] = DH[b, j] + DY[t, b, j]                 # dh
                            tc = TC[t, b, j]
                            acc[1] = DC[b, j] + acc[0] * go * (one - tc * tc)  # dc
                            cprev = tirx.Select(first, C0[b, j], Cs[p, b, j])
                            DG[t, b, j] = acc[1] * gg * gi * (one - gi)
                            DG[t, b, nH + j] = acc[1] * cprev * gf * (one - gf)
                            DG[t, b, 2 * nH + j] = acc[1] * gi * (one - gg * gg)
                            DG[t, b, 3 * nH + j] = acc[0] * tc * go * (one - go)
                            DC[b, j] = acc[1] * gf
                        with _seq(nH) as k:
                            acc[0] = zero
                            with _seq(4 * nH) as g:
                                acc[0] = acc[0] + DG[t, b, g] * Whh[g, k]
                            DH[b, k] = acc[0]

                    if valid is None:
                        body()
                    else:
                        with T.If(valid):
                            with T.Then():
                                body()
                            with T.Else():
                                with _seq(4 * nH) as g:
                                    DG[t, b, g] = zero
        return ib.get()

    outs = te.extern([(Tn, Bn, G4), (Bn, Hn), (Bn, Hn)], ins, gen, name=name, dtype=[cdt] * 3)
    return outs[0], outs[1], outs[2]
