"""Detection grads: yolo_loss (YOLOv3 loss).

Semantics of Paddle 3.3.1 (phi/kernels/cpu/yolo_loss_grad_kernel.cc; the forward,
yolo_loss_kernel.cc, produced ``objectness_mask`` and ``gt_match_mask``). With
x [N, M·(5 + C), H, W] (M = len(anchor_mask) anchors per cell, entries tx, ty, tw, th,
objectness, C class scores), lg = loss_grad[n]:

* objectness entry of anchor a at cell (k, l): obj = objectness_mask[n, a, k, l];
  obj > 1e-5 (a matched cell; obj is the gt score): (σ(x) − 1)·obj·lg;  −0.5 < obj <= 1e-5
  (negative): σ(x)·lg;  obj <= −0.5 (ignored: IoU above ignore_thresh): 0.
* every gt box t with a = gt_match_mask[n, t] >= 0 writes its cell gi = ⌊x_t·W⌋, gj = ⌊y_t·H⌋,
  anchor a: with s = score_t (gt_score, or 1), an = anchor_mask[a], input_size =
  downsample_ratio·H, scale = (2 − w_t·h_t)·s:
  tx: (σ(x) − (x_t·H − gi))·scale·lg,  ty: (σ(x) − (y_t·H − gj))·scale·lg  (Paddle uses H as the
  grid size for both),  tw: sign(x − log(w_t·input_size/anchors[2an]))·scale·lg (sign(0) = −1),
  th likewise with h_t and anchors[2an+1];  class k: (σ(x) − (k == label_t ? pos : neg))·s·lg with
  pos/neg = 1/0, or 1 − δ/δ with δ = min(1/C, 1/40) when use_label_smooth.

Difference from Paddle: Paddle *assigns* a gt's entries, so when two gt boxes match the same
anchor of the same cell only the last one's gradient survives, although the forward loss adds
both terms. The grad of that loss is the sum, which is computed here (identical whenever no two
matched boxes share an anchor cell; tests/test_detection.py checks it against central differences
of Paddle's own forward, which Paddle's kernel misses by ~0.4 on such cells). Labels of matched
boxes must lie in [0, class_num). ``scale_x_y`` and ``ignore_thresh`` only enter the forward
(through objectness_mask). Paddle never writes gt_box_grad, gt_label_grad or gt_score_grad (the
ground truth is not differentiated): not produced. Matched boxes whose cell lies outside the grid
(Paddle writes out of bounds there) are rejected, and so is a non-square grid (H != W: Paddle's
yolo_loss InferMeta refuses it, and the kernels use H as the grid size of both axes).

The kernel gathers: each x_grad element sums, over the N·B gt boxes of its image, the terms of
the boxes matched to it (a reduction over the small gt axis), so it needs no scatter or atomics.
"""

from __future__ import annotations

import numpy as np

from tvmgrad.families.tensor import tensor_op


def _check(call, outs):
    """Attributes and shapes (always, graphs included), then the values (with data)."""
    _check_shapes(call)
    if call.has_data:
        _check_values(call)


def _check_shapes(call):
    op = call.op
    a = call.attrs
    x = call.meta("x")
    anchors, mask, C = list(a["anchors"]), list(a["anchor_mask"]), a["class_num"]
    if C <= 0:
        raise ValueError(f"{op}: attribute 'class_num' must be positive, got {C}")
    if not anchors or len(anchors) % 2:
        raise ValueError(f"{op}: attribute 'anchors' must hold (width, height) pairs, got {anchors}")
    if any(v <= 0 for v in anchors):
        raise ValueError(f"{op}: attribute 'anchors' must be positive, got {anchors}")
    if not mask or any(m < 0 or m >= len(anchors) // 2 for m in mask):
        raise ValueError(f"{op}: attribute 'anchor_mask' must index the {len(anchors) // 2} "
                         f"anchors, got {mask}")
    if a["downsample_ratio"] <= 0:
        raise ValueError(f"{op}: attribute 'downsample_ratio' must be positive")
    M = len(mask)
    N, ch, H, W = x.shape
    if ch != M * (5 + C):
        raise ValueError(f"{op}: input 'x' must have len(anchor_mask)·(5 + class_num) = "
                         f"{M * (5 + C)} channels, got {ch}")
    if H != W:
        raise ValueError(f"{op}: input 'x' must have a square grid (H == W; Paddle's yolo_loss "
                         f"uses H as the grid size for both axes), got {H}x{W}")
    gt_box = call.meta("gt_box")
    if gt_box.ndim != 3 or gt_box.shape[0] != N or gt_box.shape[2] != 4:
        raise ValueError(f"{op}: input 'gt_box' must be [{N}, boxes, 4], got {list(gt_box.shape)}")
    B = gt_box.shape[1]
    for name in ("gt_label", "gt_score", "gt_match_mask"):
        m = call.meta(name)
        if m is not None and tuple(m.shape) != (N, B):
            raise ValueError(f"{op}: input {name!r} must be [{N}, {B}], got {list(m.shape)}")
    om = call.meta("objectness_mask")
    if tuple(om.shape) != (N, M, H, W):
        raise ValueError(f"{op}: input 'objectness_mask' must be [{N}, {M}, {H}, {W}], got "
                         f"{list(om.shape)}")
    if tuple(call.meta("loss_grad").shape) != (N,):
        raise ValueError(f"{op}: input 'loss_grad' must be [{N}], got "
                         f"{list(call.meta('loss_grad').shape)}")


def _check_values(call):
    op, a, x = call.op, call.attrs, call.meta("x")
    C, M = a["class_num"], len(a["anchor_mask"])
    N, ch, H, W = x.shape
    match = np.asarray(call.tensors["gt_match_mask"])
    if match.size and (match.min() < -1 or match.max() >= M):
        raise ValueError(f"{op}: input 'gt_match_mask' must hold -1 or an anchor_mask index "
                         f"in [0, {M})")
    hit = match >= 0
    label = np.asarray(call.tensors["gt_label"])
    bad = hit & ((label < 0) | (label >= C))
    if bad.any():
        n, t = np.argwhere(bad)[0]
        raise ValueError(f"{op}: input 'gt_label' holds {label[n, t]} at [{n}, {t}] (a matched box), "
                         f"out of range: class labels lie in [0, {C})")
    box = np.asarray(call.tensors["gt_box"]).astype(np.float64)
    if hit.any():
        dt = np.float32 if str(x.dtype.name) != "float64" else np.float64
        gi = (box[..., 0].astype(dt) * dt(W)).astype(np.int64)
        gj = (box[..., 1].astype(dt) * dt(H)).astype(np.int64)
        bad = hit & ((gi < 0) | (gi >= W) | (gj < 0) | (gj >= H))
        if bad.any():
            n, t = np.argwhere(bad)[0]
            raise ValueError(f"{op}: input 'gt_box' [{n}, {t}] is matched (gt_match_mask "
                             f"{match[n, t]}) but its centre {box[n, t, :2].tolist()} lies "
                             f"outside the {H}x{W} grid")


@tensor_op(float_inputs=("x", "gt_box", "gt_score", "objectness_mask", "loss_grad"),
           pattern="separate_stages", index_dtypes=("int32", "int64"), validate=_check,
           validate_always=True)
def yolo_loss_grad(x, gt_box, gt_label, gt_score, objectness_mask, gt_match_mask, loss_grad,
                   anchors, anchor_mask, class_num, ignore_thresh, downsample_ratio,
                   use_label_smooth, scale_x_y):
    """x_grad: objectness entries from objectness_mask, location and class entries summed over
    the gt boxes matched to their anchor cell (see the module docstring)"""
    from tvm import te, tirx

    from tvmgrad.dtypes import dtype as as_dtype, to_compute

    dt = as_dtype(str(x.dtype))
    cdt = dt.compute
    i64 = lambda v: tirx.const(v, "int64")  # noqa: E731
    f = lambda v: tirx.const(v, cdt)  # noqa: E731
    C, M = int(class_num), len(anchor_mask)
    E = 5 + C
    N, _, H, W = x.shape
    B = gt_box.shape[1]
    # Paddle: T smooth = min(1.0 / C, 1.0 / 40); pos = 1.0 - smooth (double, rounded to T)
    rnd = (lambda v: float(np.float32(v))) if cdt == "float32" else float
    neg = rnd(min(1.0 / C, 1.0 / 40)) if use_label_smooth else 0.0
    pos = rnd(1.0 - neg)

    def load(t, *idx):
        return to_compute(t[idx], dt)

    def sig(v):
        return f(1.0) / (f(1.0) + tirx.exp(-v))

    def anchor(a, k):
        """anchors[2·anchor_mask[a] + k] for a (static-count) mask index expression a."""
        v = f(float(anchors[2 * anchor_mask[-1] + k]))
        for j in range(M - 2, -1, -1):
            v = tirx.Select(a == i64(j), f(float(anchors[2 * anchor_mask[j] + k])), v)
        return v

    Hc, Wc = H.astype(cdt), W.astype(cdt)
    input_size = (H * i64(downsample_ratio)).astype(cdt)

    # per gt box: gi, gj, tx, ty, tw, th, scale, score, label, matched anchor (as numbers)
    GI, GJ, TX, TY, TW, TH, SCALE, SCORE, LABEL, MATCH = range(10)

    def gt_info(n, t, q):
        bx, by = load(gt_box, n, t, i64(0)), load(gt_box, n, t, i64(1))
        bw, bh = load(gt_box, n, t, i64(2)), load(gt_box, n, t, i64(3))
        gi = (bx * Wc).astype("int64").astype(cdt)
        gj = (by * Hc).astype("int64").astype(cdt)
        a = gt_match_mask[n, t].astype("int64")
        ac = tirx.max(a, i64(0))
        score = f(1.0) if gt_score is None else load(gt_score, n, t)
        vals = [gi, gj, bx * Hc - gi, by * Hc - gj,
                tirx.log(bw * input_size / anchor(ac, 0)), tirx.log(bh * input_size / anchor(ac, 1)),
                (f(2.0) - bw * bh) * score, score, gt_label[n, t].astype(cdt), a.astype(cdt)]
        v = vals[-1]
        for j in range(len(vals) - 2, -1, -1):
            v = tirx.Select(q == i64(j), vals[j], v)
        return v

    gt = te.compute((N, B, i64(10)), gt_info, name="yolo_gt")
    t = te.reduce_axis((i64(0), B), name="t")

    def box_terms(n, c, k, l):
        a, e = c // i64(E), c % i64(E)
        g = lambda q: gt[n, t, i64(q)]  # noqa: E731
        matched = tirx.all(g(MATCH) == a.astype(cdt), g(GI) == l.astype(cdt),
                           g(GJ) == k.astype(cdt), e != i64(4))
        xv = load(x, n, c, k, l)
        s = sig(xv)
        cls = (s - tirx.Select(e.astype(cdt) - f(5.0) == g(LABEL), f(pos), f(neg))) * g(SCORE)
        v = tirx.Select(e == i64(0), (s - g(TX)) * g(SCALE),
            tirx.Select(e == i64(1), (s - g(TY)) * g(SCALE),
            tirx.Select(e == i64(2), tirx.Select(xv > g(TW), f(1.0), f(-1.0)) * g(SCALE),
            tirx.Select(e == i64(3), tirx.Select(xv > g(TH), f(1.0), f(-1.0)) * g(SCALE), cls))))
        return te.sum(tirx.Select(matched, v, f(0.0)), axis=t)

    boxes = te.compute(x.shape, box_terms, name="yolo_box_terms")

    def total(n, c, k, l):
        a, e = c // i64(E), c % i64(E)
        lg = load(loss_grad, n)
        obj = load(objectness_mask, n, a, k, l)
        s = sig(load(x, n, c, k, l))
        o64 = obj.astype("float64")           # Paddle compares T with double literals
        objg = tirx.Select(o64 > tirx.const(1e-5, "float64"), (s - f(1.0)) * obj * lg,
                           tirx.Select(o64 > tirx.const(-0.5, "float64"), s * lg, f(0.0)))
        return tirx.Select(e == i64(4), objg, boxes[n, c, k, l] * lg).astype(dt.storage)

    x_grad = te.compute(x.shape, total, name="x_grad")
    return x_grad, None, None, None
