//! Byte comparisons and cache hints on the counting path.

/// Byte equality in line: keys and the bytes around an event's values are short, and a call to
/// `memcmp` per comparison costs more than comparing a few bytes here.
#[inline(always)]
pub(crate) fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}

/// Asks the CPU to start loading the cache line of `value`, without waiting for it: a hint that
/// changes no result, so that a miss overlaps the work done before `value` is read.
#[inline(always)]
pub(crate) fn prefetch<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing into the program and cannot fault; `value` is a live
    // reference besides. SSE is part of every x86_64 CPU.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            (value as *const T).cast(),
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}
