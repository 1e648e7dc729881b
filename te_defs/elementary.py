"""Grads of elementary functions: powers, exponentials, logarithms, trigonometry, rounding."""

from tvmgrad.families import pointwise


@pointwise(infer_meta="UnchangedInferMeta")
def scale(x, scale, bias, bias_after_scale):
    """The forward ``scale`` op (scale_grad and sign_grad invoke it): x·scale + bias."""
    return x * scale + bias if bias_after_scale else (x + bias) * scale
