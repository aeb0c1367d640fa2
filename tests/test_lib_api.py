"""The library's public surface: every module imports with ``*`` and every name it exports exists;
the positional functions validate their inputs with attention's validators (one implementation)."""
import importlib
import pkgutil

import pytest
import torch

import xfam_lib
from xfam_lib import positional

MODULES = sorted(m.name for m in pkgutil.iter_modules(xfam_lib.__path__))


def test_every_module_is_found():
    assert {"attention", "positional", "testing", "transformer", "utils"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_star_import_and_all_names_exist(name):
    """``from xfam_lib.<name> import *`` works, and every name in ``__all__`` (where a module has one) is defined."""
    module = importlib.import_module(f"xfam_lib.{name}")
    namespace = {}
    exec(f"from xfam_lib.{name} import *", namespace)              # raises AttributeError for a stale __all__ name
    exported = getattr(module, "__all__", None)
    if exported is None:
        assert all(not n.startswith("_") for n in namespace if n != "__builtins__")
        return
    missing = [n for n in exported if not hasattr(module, n)]
    assert not missing, f"xfam_lib.{name}.__all__ names undefined {missing}"
    assert len(set(exported)) == len(exported), f"xfam_lib.{name}.__all__ lists a name twice"
    assert set(exported) <= set(namespace)


def rand(*shape):
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("call", [
    lambda: positional.shaw_relative_attention(rand(2, 4, 8), rand(2, 4, 8), rand(3, 4, 8), rand(5, 8), None, 2),
    lambda: positional.shaw_relative_attention_reference(rand(2, 4, 8), rand(2, 4, 8), rand(3, 4, 8), rand(5, 8),
                                                         None, 2),
    lambda: positional.da_attention(rand(2, 4, 8), rand(2, 4, 8), rand(3, 4, 8), -0.1, 0.0),
    lambda: positional.da_attention_reference(rand(2, 4, 8), rand(2, 4, 8), rand(3, 4, 8), -0.1, 0.0),
])
def test_positional_attention_catches_a_leading_dim_mismatch_of_v(call):
    """q and k agree but v's batch differs: a chained ``q != k != v`` comparison misses this."""
    with pytest.raises(ValueError, match="leading dims"):
        call()


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf")])
def test_positional_attention_validates_scale(scale):
    x = rand(1, 4, 8)
    for call in (lambda: positional.da_attention(x, x, x, -0.1, 0.0, scale=scale),
                 lambda: positional.da_attention_reference(x, x, x, -0.1, 0.0, scale=scale),
                 lambda: positional.shaw_relative_attention(x, x, x, rand(5, 8), None, 2, scale=scale)):
        with pytest.raises(ValueError, match="scale"):
            call()


def test_positional_masks_are_validated_like_attentions():
    x = rand(1, 4, 8)
    with pytest.raises(TypeError, match="boolean"):
        positional.da_attention(x, x, x, -0.1, 0.0, mask=torch.ones(4, 4))
    with pytest.raises(ValueError, match="enlarging"):
        positional.da_attention(x, x, x, -0.1, 0.0, mask=torch.ones(3, 4, 4, dtype=torch.bool))


def test_one_set_of_validators_in_utils():
    """Every module that takes q, k, v validates them with `utils.check_qkv` and `utils.resolve_scale`;
    none keeps a private copy, and positional and the sparse kernels import no validator from attention."""
    import inspect

    from xfam_lib import attention, linear, sparse, utils
    from xfam_lib.sparse import content, kernels
    for module in (attention, linear, positional, kernels, content):
        assert module.check_qkv is utils.check_qkv and module.resolve_scale is utils.resolve_scale
        assert not hasattr(module, "_check_qkv") and not hasattr(module, "_resolve_scale")
    for module in (positional, kernels, content):
        imports = [line for line in inspect.getsource(module).splitlines() if ".attention import" in line]
        assert not any("_check" in line or "_resolve" in line for line in imports), imports
    x, y = rand(2, 5, 8), rand(2, 5, 4)
    messages = set()
    for call in (lambda: attention.scaled_dot_product_attention(x, y, x),
                 lambda: linear.linear_attention(x, y, x), lambda: sparse.sliding_window_attention(x, y, x, 2)):
        with pytest.raises(ValueError, match="d_k") as err:
            call()
        messages.add(str(err.value))
    assert len(messages) == 1                                          # one message, from one validator
