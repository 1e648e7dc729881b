"""Both grads of a channel-first 2-D depthwise convolution (one input and one output channel per
group) in one pass over each (sample, channel) plane: a ``te.extern`` (te_defs/_extern.py).

The contraction form (te_defs/conv.py: a zero-inserted, padded copy of dy and a padded copy of x,
each made for the whole batch, then a data grad and a filter grad reading them) moved each
activation through memory three times: on the bench shape (8 x 128 x 56², 3 x 3) 37 % of the
time went to filling and copying the padded operands, the op ran at 16 % of the copy bandwidth
while doing 9 multiply-adds per element. Here a task takes one plane, makes both copies in its
own scratch (they stay in L1/L2), and computes from them

    dx[i]      = Σ_j w[K−1−j] · dyz[i + j·d]
    dw[K−1−j] += Σ_i x[i] · dyz[i + j·d]           (dyz: see conv.zero_inserted_dy)

a strip of ``LANES`` columns at a time, walking down the plane: each load of dyz serves both
grads, and the strip's K0·K1 filter-grad partials (one vector per tap) stay in registers down
the whole column of strips. x's copy is zero beyond the row (its padded lanes add nothing to
dw); dx's padded lanes are computed and dropped. Each plane writes its filter partial sums
(compute dtype), summed over the samples after. Every load comes from the task's own copies, so
the CPU loop has no bounds check.

Measured on the bench shape (2 threads, best of ~2000 calls): walking the strips along each row
instead, the partials went through memory at every step (3.0 ms AVX-512); down the plane with
16-lane strips, 1.8 ms on AVX-512 but 3.0 ms on AVX2 (9 partials of two ymm each need 18 of its
16 registers: spills); with 8 lanes, 1.75 / 1.8 ms (9 of 16 ymm, and a 56-wide row is 7 whole
strips instead of 64 columns). A 7 x 7 filter's 49 partials spill to the stack, and it still
runs no slower than the contraction form (8 x 96 x 56²: 7.9 / 7.5 ms against 8.2 / 8.8 ms).

The CUDA form is per element instead (a thread per dx element, a thread per (sample, channel,
tap) partial), direct from the operands with guarded loads.
"""

from __future__ import annotations

from tvmgrad.infer_meta import is_symbolic
from tvmgrad.lazy import te, tirx

from ._extern import at_least_one, ceildiv, extern, i64, proxy, scratch, store_as, tc, within
from ._math import const, where

LANES = 8       # the CPU form's strip width: one AVX2 vector (half an AVX-512 one), two NEON ones


def fits(geom, sizes) -> bool:
    """Whether a call is one this kernel computes (planning: ``sizes`` has the call's channels
    per group, Cg and Og): 2-D, channel-first, one input and one output channel per group."""
    return (geom.S == 2 and not geom.last
            and all(not is_symbolic(sizes[c]) and sizes[c] == 1 for c in ("Cg", "Og")))


def plane_grads(x, w, dy, geom, dt, ctx):
    """-> (dx in x's view shape, dw summed over the samples in w's shape, compute dtype).
    ``x``/``w``/``dy``: te placeholders in the conv views (N, G, 1, spatial...) and
    (G, 1, 1, k...)."""
    N, G = x.shape[0], x.shape[1]
    I0, I1 = x.shape[3], x.shape[4]
    O0, O1 = dy.shape[3], dy.shape[4]
    (K0, K1), (s0, s1), (d0, d1), (lo0, lo1) = geom.k, geom.s, geom.d, geom.lo
    cdt = dt.compute
    zero = const(0.0, cdt)
    # dyz[t] = dy[(t − L) / s] (t − L a multiple of s), over T0 rows of TW columns
    L0, L1 = (K0 - 1) * d0 - lo0, (K1 - 1) * d1 - lo1

    def gen(ins, outs, body):
        from tvm.script.ir_builder import tirx as T
        X, Wt, DY = proxy(ins[0]), proxy(ins[1]), proxy(ins[2])
        DX, PART = proxy(outs[0]), proxy(outs[1])

        def wval(g, a, b):
            return tc(Wt[g, 0, 0, a, b], dt)

        def plane(n, g):
            """CPU: one (sample, channel) plane."""
            R = ceildiv(I1, LANES) * i64(LANES)         # x's row, padded to whole strips
            T0, TW = i64(I0) + (K0 - 1) * d0, R + (K1 - 1) * d1
            xp = proxy(scratch((i64(I0), R), cdt))
            dz = proxy(scratch((T0, TW), cdt))
            dxp = proxy(scratch((i64(I0), R), cdt))
            acc = proxy(scratch((K0, K1, LANES), cdt))
            taps = proxy(scratch((K0, K1), cdt))
            lanes = tirx.Ramp(i64(0), i64(1), LANES)
            with T.serial(0, T0) as t0:
                with T.serial(0, TW) as t1:
                    dz[t0, t1] = zero
            # the dy elements that land in dyz: t = L + p·s in [0, T)
            p0_lo, p1_lo = max(0, -(L0 // s0)), max(0, -(L1 // s1))
            p0_hi = tirx.min(i64(O0), ceildiv(i64(I0) + lo0, s0))
            p1_hi = tirx.min(i64(O1), ceildiv(R + lo1, s1))
            with T.serial(i64(p0_lo), tirx.max(p0_hi, i64(p0_lo))) as p0:
                with T.serial(i64(p1_lo), tirx.max(p1_hi, i64(p1_lo))) as p1:
                    dz[L0 + p0 * s0, L1 + p1 * s1] = tc(DY[n, g, 0, p0, p1], dt)
            with T.serial(0, i64(I0)) as i0:
                with T.serial(0, i64(I1)) as j:
                    xp[i0, j] = tc(X[n, g, 0, i0, j], dt)
                with T.serial(i64(I1), R) as j:
                    xp[i0, j] = zero
            taps_ = [(a, b) for a in range(K0) for b in range(K1)]
            wf = {(a, b): T.bind(wval(g, K0 - 1 - a, K1 - 1 - b)) for a, b in taps_}
            for a, b in taps_:
                taps[a, b] = zero
            # a strip of columns down the plane: its filter-grad partials stay in registers
            with T.serial(0, tirx.truncdiv(R, i64(LANES))) as js:
                for a, b in taps_:
                    acc[a, b, lanes] = tirx.Broadcast(zero, LANES)
                with T.serial(0, i64(I0)) as i0:
                    col = tirx.Ramp(js * LANES, i64(1), LANES)
                    xv = T.bind(xp[i0, col])
                    total = None
                    for a, b in taps_:
                        tap = T.bind(dz[i0 + a * d0, tirx.Ramp(js * LANES + b * d1, i64(1), LANES)])
                        total = wf[a, b] * tap if total is None else total + wf[a, b] * tap
                        acc[a, b, lanes] = acc[a, b, lanes] + xv * tap
                    dxp[i0, col] = total
                for a, b in taps_:
                    lane_sum = acc[a, b, 0]
                    for lane in range(1, LANES):
                        lane_sum = lane_sum + acc[a, b, lane]
                    taps[a, b] = taps[a, b] + lane_sum
            with T.serial(0, i64(I0)) as i0:
                with T.serial(0, i64(I1)) as j:
                    DX[n, g, 0, i0, j] = store_as(dxp[i0, j], dt)
            for a, b in taps_:
                PART[n, g, K0 - 1 - a, K1 - 1 - b] = taps[a, b]

        def guarded(i, k, pad, s, d, O):
            """(valid, p) of dy's position p meeting x's i through tap k: i = p·s + k·d − lo."""
            u = i + pad - k * d
            p = tirx.floordiv(u, s) if s > 1 else u
            ok = tirx.all(u >= 0, p < i64(O), *([tirx.floormod(u, s) == 0] if s > 1 else []))
            return ok, tirx.max(tirx.min(p, i64(O) - 1), i64(0))

        def dx_element(Pv, _S):
            """CUDA: one dx element from the dy positions its taps meet."""
            n, g, i0, i1 = Pv
            total = zero
            for a in range(K0):
                ok0, p0 = guarded(i0, a, lo0, s0, d0, O0)
                for b in range(K1):
                    ok1, p1 = guarded(i1, b, lo1, s1, d1, O1)
                    term = wval(g, a, b) * tc(DY[n, g, 0, p0, p1], dt)
                    total = total + where(tirx.all(ok0, ok1), term, zero)
            DX[n, g, 0, i0, i1] = store_as(total, dt)

        def dw_partial(Pv, _S):
            """CUDA: one tap's partial over one plane."""
            n, g, a, b = Pv
            acc = proxy(scratch((1,), cdt, word_aligned=True))
            acc[0] = zero
            with T.serial(0, i64(O0)) as p0:
                with T.serial(0, i64(O1)) as p1:
                    i0, i1 = p0 * s0 + a * d0 - lo0, p1 * s1 + b * d1 - lo1
                    ok = tirx.all(i0 >= 0, i0 < i64(I0), i1 >= 0, i1 < i64(I1))
                    xv = tc(X[n, g, 0, tirx.max(tirx.min(i0, i64(I0) - 1), i64(0)),
                              tirx.max(tirx.min(i1, i64(I1) - 1), i64(0))], dt)
                    acc[0] = acc[0] + where(ok, xv * tc(DY[n, g, 0, p0, p1], dt), zero)
            PART[n, g, a, b] = acc[0]

        on_cuda = ctx.on_cuda()
        everything = dict(reads=list(ins), writes=list(outs))
        body.block("depthwise_planes", within([N, G], plane),
                   par=[at_least_one(N), at_least_one(G)], when=on_cuda == 0, **everything)
        body.block("depthwise_dx", dx_element, par=[N, G, I0, I1], when=on_cuda == 1,
                   **everything)
        body.block("depthwise_dw", dw_partial, par=[N, G, K0, K1], when=on_cuda == 1,
                   **everything)

    dx, part = extern("depthwise", [(x.shape, dt.storage), ([N, G, K0, K1], cdt)],
                      [x, w, dy], gen, lanes=False)
    rn = te.reduce_axis((0, N), name="depthwise_n")
    total = te.compute(w.shape, lambda g, o, c, a, b: te.sum(part[rn, g, a, b], axis=rn),
                       name="depthwise_dw_sum")
    return dx, total
