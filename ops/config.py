"""The SM count that persistent kernels size their grids with (TileKernels' ``tile_kernels.config``)."""

from ._runtime import get_device_num_sms, get_num_sms, set_num_sms

__all__ = ["get_device_num_sms", "get_num_sms", "set_num_sms"]
