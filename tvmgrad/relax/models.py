"""Real PyTorch model definitions as Relax training graphs (torch and torchvision: optional).

``MODELS`` names the models the tests and the benchmark use; none is defined here, each is a
stock ``torch.nn`` / ``torchvision`` module with cross-entropy on top:

* ``mlp``: ``nn.Sequential(Linear, ReLU, Linear, ReLU, Linear)`` on flat inputs;
* ``transformer``: one ``nn.TransformerEncoderLayer`` (batch first, no dropout), mean-pooled
  over the sequence, then a ``Linear`` head;
* ``resnet18``: ``torchvision.models.resnet18`` (batch statistics in train mode).

``torch_model(name, batch=None, seed=0)`` -> ``TorchModel`` (the module returning the loss,
example inputs, train/eval mode); ``export(tm)`` -> ``Exported``: the Relax module (``main``
takes the inputs, then every parameter; returns the scalar loss), the parameter names in that
order, and their values. ``gradient(exported)`` applies ``relax.transform.Gradient`` for the
parameters (``main_adjoint`` returns ``(loss, (grad per parameter))``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["MODELS", "DEFAULT_BATCH", "TorchModel", "Exported", "torch_model", "export", "gradient",
           "torch_grads", "relax_ops"]

MODELS = ("mlp", "transformer", "resnet18")

# (batch, feature dims) per model: the benchmark's sizes; tests pass smaller ones
DEFAULT_BATCH = {"mlp": 64, "transformer": 8, "resnet18": 2}
_MLP = (784, 256, 256, 10)
_TRANSFORMER = dict(seq=32, d_model=64, nhead=4, ff=128, classes=10)
_RESNET = dict(size=64, classes=10)


@dataclass
class TorchModel:
    name: str
    module: object                 # torch.nn.Module: forward(*inputs) -> scalar loss
    inputs: tuple                  # torch tensors
    train: bool = True

    def loss_and_grads(self):
        """The loss and each parameter's gradient (numpy), from torch autograd."""
        self.module.train(self.train)
        self.module.zero_grad(set_to_none=True)
        loss = self.module(*self.inputs)
        loss.backward()
        grads = {n: p.grad.detach().numpy().copy() for n, p in self.module.named_parameters()}
        return float(loss.detach()), grads


def _loss_module(net, torch):
    class WithLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, x, y):
            return torch.nn.functional.cross_entropy(self.net(x), y)

    return WithLoss()


def torch_model(name: str, batch: int | None = None, *, seed: int = 0, train: bool = True,
                size: int | None = None, dtype: str = "float32") -> TorchModel:
    """One of ``MODELS`` with cross-entropy, seeded parameters and inputs. ``size``: resnet18's
    image side (default 64) or the transformer's sequence length (default 32); ``dtype``:
    float32 or float64 (parameters and inputs)."""
    import torch
    torch.manual_seed(seed)
    batch = batch or DEFAULT_BATCH[name]
    if name == "mlp":
        dims = _MLP
        layers = []
        for a, b in zip(dims[:-1], dims[1:]):
            layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
        net = torch.nn.Sequential(*layers[:-1])
        x = torch.randn(batch, dims[0])
        classes = dims[-1]
    elif name == "transformer":
        cfg = _TRANSFORMER
        layer = torch.nn.TransformerEncoderLayer(cfg["d_model"], cfg["nhead"], cfg["ff"], dropout=0.0,
                                                 batch_first=True)
        head = torch.nn.Linear(cfg["d_model"], cfg["classes"])

        class Encoder(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.layer, self.head = layer, head

            def forward(self, x):
                return self.head(self.layer(x).mean(1))

        net = Encoder()
        x = torch.randn(batch, size or cfg["seq"], cfg["d_model"])
        classes = cfg["classes"]
    elif name == "resnet18":
        import torchvision
        net = torchvision.models.resnet18(num_classes=_RESNET["classes"])
        side = size or _RESNET["size"]
        x = torch.randn(batch, 3, side, side)
        classes = _RESNET["classes"]
    else:
        raise ValueError(f"unknown model {name!r} (have {', '.join(MODELS)})")
    y = torch.randint(0, classes, (batch,))
    module = _loss_module(net, torch)
    if dtype == "float64":
        module = module.double()
        x = x.double()
    module.train(train)
    return TorchModel(name, module, (x, y), train)


@dataclass
class Exported:
    mod: object                    # tvm.IRModule; main(*inputs, *params) -> loss
    param_names: list              # torch names (module.named_parameters()), in main's order
    params: list                   # numpy arrays, in that order
    inputs: list                   # numpy arrays
    extra: dict = field(default_factory=dict)


def export(tm: TorchModel) -> Exported:
    """torch.export -> ``from_exported_program(keep_params_as_input=True)``."""
    import torch
    from tvm.relax.frontend.torch import from_exported_program
    tm.module.train(tm.train)
    ep = torch.export.export(tm.module, tm.inputs)
    mod = from_exported_program(ep, keep_params_as_input=True, unwrap_unit_return_tuple=True)
    sig = ep.graph_signature
    by_name = dict(tm.module.named_parameters())
    names = [sig.inputs_to_parameters[s.arg.name] for s in sig.input_specs
             if s.arg.name in sig.inputs_to_parameters]
    # the Relax parameters after the user inputs are the torch parameters, in signature order
    n_user = len(tm.inputs)
    relax_params = [p for p in mod["main"].params[n_user:]]
    if len(relax_params) != len(names):
        raise RuntimeError(f"export: {len(relax_params)} Relax parameters for {len(names)} torch ones")
    params = [by_name[n].detach().numpy().copy() for n in names]
    inputs = [t.detach().numpy().copy() for t in tm.inputs]
    return Exported(mod, names, params, inputs)


def gradient(exp: Exported):
    """``relax.transform.Gradient`` of ``main`` for every parameter (not the inputs)."""
    from tvm import relax
    n_user = len(exp.inputs)
    params = list(exp.mod["main"].params[n_user:])
    return relax.transform.Gradient("main", require_grads=params)(exp.mod)


def torch_grads(tm: TorchModel, names) -> tuple[float, list]:
    loss, grads = tm.loss_and_grads()
    return loss, [grads[n] for n in names]


def relax_ops(mod) -> dict[str, int]:
    """How often each Relax op is called in the module's Relax functions."""
    import collections

    import tvm
    from tvm import relax
    counts: collections.Counter = collections.Counter()
    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            def visit(e):
                if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op):
                    counts[str(e.op.name)] += 1
            relax.analysis.post_order_visit(func.body, visit)
    return dict(counts)


def as_tensors(arrays):
    """Arrays as TVM tensors (64-byte aligned, as TVM kernels assume)."""
    import tvm
    return [tvm.runtime.tensor(np.ascontiguousarray(a)) for a in arrays]
