"""tvmgrad kernels inside TVM Relax graphs: real models train end to end on them.

    import tvm, tvmgrad.relax
    from tvm import relax
    tvmgrad.relax.register_gradients()          # Gradient uses tvmgrad; tvm.compile schedules it
    mod = from_exported_program(torch.export.export(model_with_loss, args),
                                keep_params_as_input=True, unwrap_unit_return_tuple=True)
    grad_mod = relax.transform.Gradient("main", require_grads=mod["main"].params[n_inputs:])(mod)
    ex = tvm.compile(grad_mod, target=tvmgrad.targets.resolve("llvm").target)   # or "llvm", cuda
    loss, grads = relax.VirtualMachine(ex, tvm.cpu())["main_adjoint"](*inputs, *params)

* ``register_gradients(target=None)`` makes ``relax.transform.Gradient`` differentiate Relax ops
  with tvmgrad kernels: for each Relax op in ``GRADIENTS`` whose kernel is implemented, a
  gradient is registered above TVM's own (level 11; TVM registers at 10). Ops TVM has no
  gradient for (gelu, erf, rsqrt, square, clip, layer/batch/group norm, strided_slice, conv1d,
  conv2d_transpose, adaptive_avg_pool2d, max/min, ...) become differentiable. A registration
  replaces TVM's gradient for every call of the op; forms a rule does not cover go to TVM's own
  gradient where it has one (recorded in ``fallback.FALLBACKS``), else raise NotImplementedError
  saying why. Non-differentiable inputs (conditions, masks, integer labels and indices, shapes)
  get ``no_grad`` in every rule, and the integer/boolean ops TVM has no gradient for
  (``NO_GRAD``: logical_*, argmax, ...) get an all-``no_grad`` one, so the Gradient pass never
  walks into boolean or integer subgraphs. ``relu``'s gradient at exactly 0 is 0 (Paddle's and
  torch's convention; TVM's own says 1).
* Scheduled by default: ``register_gradients()`` also installs the tvmgrad steps in front of
  ``tvm.compile``'s default pipeline (``passes.install``; for modules holding tvmgrad kernels,
  on every target): the tvmgrad kernels are scheduled for the target being compiled for (with
  ``tvmgrad.build.lower``: tuned traces, else tvmgrad's rules), and on CPU targets the forward
  too: matmul/conv2d on tvmgrad's tiled contractions, TVM's other legalized kernels on
  tvmgrad's CPU rules. ``configure(forward=False)`` keeps TVM's forward kernels as TVM leaves
  them; ``pipeline(target=None, *, forward=True)`` is the same as an explicit
  ``relax_pipeline=``; ``register_gradients(target)`` schedules each kernel as it is emitted;
  ``schedule_kernels(mod, target)`` schedules a module's tvmgrad kernels by hand.
* ``emit(bb, op, inputs, attrs)`` adds one tvmgrad op to the function a ``BlockBuilder`` is
  building: a ``call_tir`` to the op's PrimFunc, with the output types from our InferMeta. Dims that
  are Relax shape variables stay symbolic (one kernel serves every size, as in ``tvmgrad.run``).
* ``coverage()``: (relax op, tvmgrad kernel or "no_grad" or None, has TVM's own gradient) for
  every Relax op either differentiates.
* ``models`` (real torch/torchvision models as Relax training graphs) and ``bench``
  (``bench_training_step``: one training step against PyTorch) need torch (and torchvision).

See ``tvmgrad/relax/README.md``.
"""
from .emit import emit, schedule_kernels
from .gradients import coverage, register_gradients
from .passes import configure, pipeline
from .rules import GRADIENTS, NO_GRAD, RelaxGrad

__all__ = ["emit", "register_gradients", "schedule_kernels", "coverage", "pipeline", "configure",
           "GRADIENTS", "NO_GRAD", "RelaxGrad"]
