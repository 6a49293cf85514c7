"""Host-side argument checks shared by the op wrappers; every error names the offending tensor."""

from __future__ import annotations

import torch


class KernelArgError(ValueError):
    """A tensor passed to a pdstack kernel has the wrong shape, dtype, device or layout."""


def check_tensor(
    name: str,
    t: object,
    *,
    dtype: torch.dtype | tuple[torch.dtype, ...] | None = None,
    ndim: int | None = None,
    shape: tuple[int | None, ...] | None = None,
    device: torch.device | None = None,
    contiguous: bool = False,
    last_dim_contiguous: bool = False,
) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise KernelArgError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtype is not None:
        dtypes = dtype if isinstance(dtype, tuple) else (dtype,)
        if t.dtype not in dtypes:
            want = " or ".join(str(d) for d in dtypes)
            raise KernelArgError(f"{name} must be {want}, got {t.dtype}")
    if ndim is not None and t.dim() != ndim:
        raise KernelArgError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    if shape is not None:
        if t.dim() != len(shape) or any(s is not None and s != ts for s, ts in zip(shape, t.shape, strict=True)):
            want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
            raise KernelArgError(f"{name} must have shape {want}, got {tuple(t.shape)}")
    if device is not None and t.device != device:
        raise KernelArgError(f"{name} is on {t.device}, expected {device} (all inputs on one device)")
    if contiguous and not t.is_contiguous():
        raise KernelArgError(f"{name} must be contiguous, got strides {t.stride()}")
    if last_dim_contiguous and t.dim() > 0 and t.stride(-1) != 1:
        raise KernelArgError(f"{name} must have a unit stride in its last dim, got strides {t.stride()}")
    return t
