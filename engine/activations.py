"""The MLP activations a Llama config.json may name (`hidden_act`), computed as transformers'
activations.py computes them, so a non-SiLU checkpoint gives transformers' tokens."""
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F


def _gelu_tanh_formula(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def _gelu_fast(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_new": _gelu_tanh_formula,
    "gelu_fast": _gelu_fast,
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "relu": F.relu,
    "relu2": lambda x: torch.square(F.relu(x)),
    "relu6": F.relu6,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
}

# transformers' ACT2CLS names (5.24): the ones above plus those specgate refuses by name.
TRANSFORMERS_ACTIVATIONS = set(ACTIVATIONS) | {
    "gelu_10", "gelu_python", "gelu_python_tanh", "gelu_accurate", "hardswish", "laplace",
    "leaky_relu", "linear", "mish", "sqrtsoftplus", "prelu", "xielu"}
