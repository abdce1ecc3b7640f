"""A DLPack producer for memory this process maps but no array library owns.

numpy exports DLPack for host arrays only, and the libraries that export device
memory (CuPy, PyTorch) must own it first; an exported accy buffer is a mapping
of the daemon's memory, so its capsule is built here: a legacy ``dltensor``
capsule (every consumer that reads versioned capsules still reads these) whose
deleter drops the reference that keeps the mapping alive.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import numpy as np

__all__ = ["CPU", "CUDA", "capsule"]

CPU = 1
CUDA = 2
"""``DLDeviceType`` values."""

_NAME = b"dltensor"
_KINDS = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}
"""numpy kind to ``DLDataTypeCode`` (``kDLInt``, ``kDLUInt``, ``kDLFloat``, ``kDLComplex``,
``kDLBool``)."""


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype", _DataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _Managed(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_Managed))
_Managed._fields_ = [
    ("dl_tensor", _Tensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _DELETER),
]
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
"""Takes the dying capsule as a bare pointer: as a ``py_object`` ctypes would take a reference
to an object being freed and free it twice."""

_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _CAPSULE_DESTRUCTOR]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]

_alive: dict[int, tuple[Any, ...]] = {}
"""Each capsule's structures and owner, by the managed tensor's address, until its deleter."""
_lock = threading.Lock()


def _delete(managed: Any) -> None:
    address = ctypes.cast(managed, ctypes.c_void_p).value
    with _lock:
        _alive.pop(address or 0, None)


def _destroy_capsule(capsule: int | None) -> None:
    """A capsule nobody consumed: run the tensor's deleter (a consumed one was renamed)."""
    if _api.PyCapsule_IsValid(capsule, _NAME):
        address = _api.PyCapsule_GetPointer(capsule, _NAME)
        _delete(ctypes.cast(address, ctypes.POINTER(_Managed)))


_deleter = _DELETER(_delete)
_destructor = _CAPSULE_DESTRUCTOR(_destroy_capsule)


def capsule(
    owner: object, address: int, count: int, dtype: np.dtype[Any], device: tuple[int, int]
) -> Any:
    """A ``dltensor`` capsule of ``count`` elements of ``dtype`` at ``address`` on ``device``
    (``(CUDA, ordinal)`` or ``(CPU, 0)``), one-dimensional and contiguous; ``owner`` is kept
    alive until the consumer is done with the memory."""
    code = _KINDS.get(dtype.kind)
    if code is None:
        raise TypeError(f"DLPack has no type for {dtype}")
    shape = (ctypes.c_int64 * 1)(count)
    managed = _Managed()
    tensor = managed.dl_tensor
    tensor.data = address
    tensor.device = _Device(*device)
    tensor.ndim = 1
    tensor.dtype = _DataType(code, dtype.itemsize * 8, 1)
    tensor.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    tensor.strides = None  # contiguous
    tensor.byte_offset = 0
    managed.deleter = _deleter
    key = ctypes.addressof(managed)
    with _lock:
        _alive[key] = (managed, shape, owner)
    return _api.PyCapsule_New(key, _NAME, _destructor)
