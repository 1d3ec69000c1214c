"""``pypto_pro.language`` stand-in: an eager interpreter of the tile-language subset that seed 03's kernel
uses (jit, Tensor annotations, TileType / make_tile_group / current, section_vector, load, quant, store).

Tiles are CPU tensors of their declared shape and dtype; ``load`` / ``store`` copy a window of a global
tensor into / out of a tile; ``quant`` is xquant.npu.quant. Unified-buffer addresses and mutex ids are
accepted and ignored (there is no on-chip memory to share), and a jit kernel runs eagerly when called.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import types

import torch

from .. import _args
from .. import npu as _xnpu
from .._args import QuantMode

DT_FP32 = torch.float32
DT_FP16 = torch.float16
DT_BF16 = torch.bfloat16
DT_INT8 = torch.int8
DT_UINT8 = torch.uint8
DT_INT32 = torch.int32


class MemorySpace:
    Vec = "Vec"


class _TensorType:
    def __init__(self, shape, dtype):
        self.shape, self.dtype = [int(d) for d in shape], dtype

    def __repr__(self):
        return f"Tensor[{self.shape}, {self.dtype}]"


class Tensor:
    """Annotation only: ``pl.Tensor[[rows, cols], pl.DT_FP32]``."""

    def __class_getitem__(cls, item):
        shape, dtype = item
        return _TensorType(shape, dtype)


class TileType:
    def __init__(self, shape, dtype, target_memory=MemorySpace.Vec):
        self.shape, self.dtype, self.target_memory = [int(d) for d in shape], dtype, target_memory


class Tile:
    def __init__(self, type: TileType):
        self.type = type
        self.data = torch.zeros(type.shape, dtype=type.dtype)

    @property
    def shape(self):
        return list(self.data.shape)


class TileGroup:
    def __init__(self, type: TileType, addrs=0, mutex_ids=None):
        self._tile = Tile(type)
        self.addrs, self.mutex_ids = addrs, mutex_ids

    def current(self) -> Tile:
        return self._tile


def make_tile_group(type: TileType, addrs=0, mutex_ids=None) -> TileGroup:
    return TileGroup(type, addrs, mutex_ids)


def section_vector():
    return contextlib.nullcontext()


def _fail(name: str, msg: str) -> ValueError:
    return _args.fail_value(f"pypto.{name}", msg)


def _window(name: str, tile: Tile, tensor: torch.Tensor, offsets):
    if not isinstance(tile, Tile):
        raise _args.fail_type(f"pypto.{name}",
                              f"tile is {_args.describe(tile)} but expected a Tile (TileGroup.current())")
    if not isinstance(tensor, torch.Tensor) or tensor.dim() != len(tile.shape):
        raise _args.fail_type(f"pypto.{name}", f"tensor is {_args.describe(tensor)} but expected a "
                                               f"{len(tile.shape)}-D torch.Tensor")
    if tensor.dtype != tile.data.dtype:
        raise _fail(name, f"tensor has dtype {tensor.dtype} but the tile holds {tile.data.dtype}")
    offs = [int(o) for o in offsets]
    if len(offs) != tensor.dim() or any(o < 0 or o + n > d for o, n, d in zip(offs, tile.shape, tensor.shape)):
        raise _fail(name, f"offsets {offs} with tile shape {tile.shape} fall outside tensor shape {list(tensor.shape)}")
    return tensor[tuple(slice(o, o + n) for o, n in zip(offs, tile.shape))]


def load(tile: Tile, tensor: torch.Tensor, offsets) -> None:
    """Copies the window of ``tensor`` at ``offsets`` into ``tile``."""
    tile.data.copy_(_window("load", tile, tensor, offsets))


def store(tensor: torch.Tensor, tile: Tile, offsets) -> None:
    """Copies ``tile`` into the window of ``tensor`` at ``offsets``."""
    _window("store", tile, tensor, offsets).copy_(tile.data)


def quant(out: Tile, src: Tile, scale: Tile, *, mode=QuantMode.SYM, offset=None) -> None:
    """pypto_pro.language.quant (seed 03) on tiles: xquant.npu.quant(out, src, scale, mode, offset)."""
    tiles = (("out", out), ("src", src), ("scale", scale)) + ((("offset", offset),) if offset is not None else ())
    for name, t in tiles:
        if not isinstance(t, Tile):
            raise _args.fail_type("pypto.quant", f"{name} is {_args.describe(t)} but expected a Tile")
    _xnpu.quant(out.data, src.data, scale.data, mode, None if offset is None else offset.data)


def jit(fn=None, **options):
    """``@pl.jit`` / ``@pl.jit(...)``: the kernel runs eagerly; arguments annotated ``pl.Tensor[shape, dtype]``
    are checked against their annotation."""
    def wrap(f):
        sig = inspect.signature(f)

        @functools.wraps(f)
        def kernel(*args, **kwargs):
            bound = sig.bind(*args, **kwargs)
            for name, value in bound.arguments.items():
                ann = sig.parameters[name].annotation
                if isinstance(ann, _TensorType):
                    if not isinstance(value, torch.Tensor):
                        raise _args.fail_type(f"pypto.jit({f.__name__})",
                                              f"{name} is {_args.describe(value)} but expected a torch.Tensor")
                    if list(value.shape) != ann.shape or value.dtype != ann.dtype:
                        raise _fail(f"jit({f.__name__})", f"{name} has shape {list(value.shape)} and dtype "
                                                          f"{value.dtype} but the kernel declares {ann}")
            return f(*args, **kwargs)

        kernel.jit_options = dict(options)
        return kernel

    return wrap(fn) if fn is not None else wrap


def make_modules() -> tuple[types.ModuleType, types.ModuleType]:
    """(pypto_pro, pypto_pro.language) module objects."""
    lang = types.ModuleType("pypto_pro.language", __doc__)
    for name in ("DT_FP32", "DT_FP16", "DT_BF16", "DT_INT8", "DT_UINT8", "DT_INT32", "MemorySpace", "QuantMode",
                 "Tensor", "TileType", "Tile", "TileGroup", "make_tile_group", "section_vector", "load", "store",
                 "quant", "jit"):
        setattr(lang, name, globals()[name])
    lang.__xquant_compat__ = True
    pkg = types.ModuleType("pypto_pro", "xquant.compat stand-in for pypto_pro (the language module only).")
    pkg.__path__ = []  # a package, so that `import pypto_pro.language` resolves through sys.modules
    pkg.language = lang
    pkg.__xquant_compat__ = True
    return pkg, lang
