 @triton.jit
 def triton_poi_fused__to_copy_clone_expand_mul_unsqueeze_view_0(in_ptr0, in_ptr1, out_ptr0, xnumel, XBLOCK : tl.constexpr):
     xnumel = 58720256
     xoffset = tl.program_id(0) * XBLOCK
     xindex = xoffset + tl.arange(0, XBLOCK)[:]
     xmask = tl.full([XBLOCK], True, tl.int1)[:]
     x2 = xindex
     tmp0 = tl.load(in_ptr0 + (x2), None)
     tmp2 = tl.load(in_ptr1 + (x2 // 128), None, eviction_policy='evict_last')
     tmp1 = tmp0.to(tl.float32)
     tmp3 = tmp1 * tmp2
     tmp4 = tmp3.to(tl.float32)
     tl.store(out_ptr0 + (x2), tmp4, None)
 ''', device_str='cuda')
