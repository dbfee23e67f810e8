"""The CUDA driver's VMM structs and a current context, by ctypes, for the probes under sessionN/
(each puts this folder on sys.path: run from anywhere as `python3 .../sessionN/probe.py`)."""
import ctypes as C
import torch

torch.cuda.init(); torch.empty(1, device="cuda")  # a current context for the driver calls
cu = C.CDLL("libcuda.so.1")
def ck(r, what):
    if r: raise RuntimeError(f"{what}: CUresult {r}")
class Loc(C.Structure): _fields_ = [("type", C.c_int), ("id", C.c_int)]
class AllocFlags(C.Structure): _fields_ = [("compressionType", C.c_ubyte), ("gpuDirectRDMACapable", C.c_ubyte), ("usage", C.c_ushort), ("reserved", C.c_ubyte * 4)]
class Prop(C.Structure): _fields_ = [("type", C.c_int), ("requestedHandleTypes", C.c_int), ("location", Loc), ("win32HandleMetaData", C.c_void_p), ("allocFlags", AllocFlags)]
class Access(C.Structure): _fields_ = [("location", Loc), ("flags", C.c_int)]
prop = Prop(); prop.type = 1; prop.location = Loc(1, 0)  # PINNED, DEVICE 0
acc = Access(Loc(1, 0), 3)  # READWRITE
def create(n):
    h = C.c_ulonglong(); ck(cu.cuMemCreate(C.byref(h), C.c_size_t(n), C.byref(prop), C.c_ulonglong(0)), "create"); return h
def reserve(n):
    """A new reservation of n bytes: its address (c_ulonglong)."""
    p = C.c_ulonglong(); ck(cu.cuMemAddressReserve(C.byref(p), C.c_size_t(n), C.c_size_t(0), C.c_ulonglong(0), C.c_ulonglong(0)), "reserve"); return p
def driver_version():
    v = C.c_int(); cu.cuDriverGetVersion(C.byref(v)); return v.value
def mapped(h, n):
    """h mapped at a new reservation of n bytes, read-write: its address."""
    p = reserve(n)
    ck(cu.cuMemMap(p, C.c_size_t(n), C.c_size_t(0), h, C.c_ulonglong(0)), "map")
    ck(cu.cuMemSetAccess(p, C.c_size_t(n), C.byref(acc), C.c_size_t(1)), "access"); return p
def unmap(p, n):
    ck(cu.cuMemUnmap(p, C.c_size_t(n)), "unmap"); ck(cu.cuMemAddressFree(p, C.c_size_t(n)), "free")
