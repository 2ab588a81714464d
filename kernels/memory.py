"""16-byte global loads and stores that tell L2 which lines to keep.

A kernel that streams several tensors once but reads one of them again from L2 (the Engram gate: v[t] is read
by every head's block, grad_out's rows again for grad_v) loses those re-reads to DRAM when the once-read rows
crowd them out: at H200's rates a line survives in its 50 MB of L2 for some 13 us of streaming. Loads and
stores marked evict-first (PTX ``.cs``, "likely to be accessed once") leave room for the lines that will be read
again. A kernel that uses these writes ``T.import_source(MEMORY_SOURCE)`` in its body; every address is 16-byte
aligned (the caller guarantees it, as for TileLang's own vectorized accesses).
"""

import tilelang.language as T

MEMORY_SOURCE = r"""
__device__ __forceinline__ void tkc_load_once_v4(void* dst, const void* src) {
  uint4 r;
  asm("ld.global.cs.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(src));
  *reinterpret_cast<uint4*>(dst) = r;
}
__device__ __forceinline__ void tkc_load_again_v4(void* dst, const void* src) {
  uint4 r;
  unsigned long long policy;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  asm("ld.global.L2::cache_hint.v4.b32 {%0, %1, %2, %3}, [%4], %5;"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(src), "l"(policy));
  *reinterpret_cast<uint4*>(dst) = r;
}
__device__ __forceinline__ void tkc_store_once_v4(void* dst, const void* src) {
  const uint4 r = *reinterpret_cast<const uint4*>(src);
  asm volatile("st.global.cs.v4.b32 [%0], {%1, %2, %3, %4};" :: "l"(dst), "r"(r.x), "r"(r.y), "r"(r.z), "r"(r.w)
               : "memory");
}
"""


def load_once(dst, src):
    """16 bytes from global ``src`` (an element, e.g. ``x[t, col]``) into ``dst`` (a local element), evict-first."""
    return T.call_extern("handle", "tkc_load_once_v4", T.address_of(dst), T.address_of(src))


def load_again(dst, src):
    """16 bytes from global ``src`` into ``dst``, kept in L2 ahead of evict-normal lines (other blocks read it)."""
    return T.call_extern("handle", "tkc_load_again_v4", T.address_of(dst), T.address_of(src))


def store_once(dst, src):
    """16 bytes from local ``src`` to global ``dst``, evict-first (nothing reads them back in this kernel)."""
    return T.call_extern("handle", "tkc_store_once_v4", T.address_of(dst), T.address_of(src))
