"""torchvision beside the real-SGLang tier's CPU build of torch: `make test` copies this into .sglang-real's
site-packages with a .pth that imports it at start-up.

PyPI's torchvision is a CUDA build: its C++ ops (_C.so, which links libtorch_cuda) don't load beside the CPU torch,
and its import then stops at a fake kernel for torchvision::nms ("operator torchvision::nms does not exist"), one of
the two ops it names without asking whether they loaded. SGLang imports torchvision only for its transforms: when the
ops did not load, those two get their schemas here, just before torchvision names them. torchvision then imports,
and calling one of its ops fails as it would have anyway (no kernel). Where the ops load, this does nothing.
"""

import importlib.abc
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
# torch drops a library's definitions when the Library object is collected.
_libraries: list[Any] = []


class _BeforeMetaRegistrations(importlib.abc.MetaPathFinder):
    """Finds nothing: it is asked first for torchvision._meta_registrations, after torchvision.extension tried _C."""

    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> ModuleSpec | None:
        if name == "torchvision._meta_registrations":
            sys.meta_path.remove(self)
            if not sys.modules["torchvision.extension"]._has_ops():
                import torch

                library = torch.library.Library("torchvision", "DEF")
                for schema in _SCHEMAS:
                    library.define(schema)
                _libraries.append(library)
        return None


sys.meta_path.insert(0, _BeforeMetaRegistrations())
