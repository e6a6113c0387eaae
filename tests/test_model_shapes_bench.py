"""benchmarks/model_shapes.py: the GPU benchmarks' hard-written shapes are zerofit's catalog's."""

from __future__ import annotations

from conftest import load_benchmark

from zerofit.models.resolve import builtin_config

SHAPES = load_benchmark("model_shapes")


def test_qwen25_05b_is_the_catalog_shape():
    catalog = builtin_config("qwen2.5-0.5b")
    assert {key: catalog[key] for key in SHAPES.QWEN25_05B} == SHAPES.QWEN25_05B
    assert set(catalog) - set(SHAPES.QWEN25_05B) == {"model_type"}


def test_qwen25_15b_and_7b_are_the_catalog_shapes():
    for name, shape in (("qwen2.5-1.5b", SHAPES.QWEN25_15B), ("qwen2.5-7b", SHAPES.QWEN25_7B)):
        catalog = builtin_config(name)
        assert {key: catalog[key] for key in shape} == shape
        assert set(catalog) - set(shape) == {"model_type"}
