//! Byte comparisons and cache hints on the counting path.

/// Byte equality in line for keys, which are short: a call to `memcmp` per comparison costs
/// more. From 4 to 16 bytes it compares two words taken from the ends (overlapping below twice
/// their width) instead of looping over the bytes (callgrind, zipf bench's exact contender,
/// 10-byte keys: ~32 instructions an event fewer); longer keys go to `memcmp`.
#[inline(always)]
pub(crate) fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    match a.len() {
        8..=16 => same_ends::<8>(a, b),
        4..8 => same_ends::<4>(a, b),
        0..4 => a.iter().zip(b).all(|(x, y)| x == y),
        _ => a == b,
    }
}

/// Whether the first and the last `N` bytes of `a` and `b` (of equal length, at least `N`)
/// agree, which covers them whole up to `2 * N` bytes.
#[inline(always)]
fn same_ends<const N: usize>(a: &[u8], b: &[u8]) -> bool {
    a.first_chunk::<N>() == b.first_chunk::<N>() && a.last_chunk::<N>() == b.last_chunk::<N>()
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

#[cfg(test)]
mod tests {
    use super::same_bytes;

    proptest::proptest! {
        /// Every length up to past 16, equal or differing in any one byte.
        #[test]
        fn same_bytes_is_slice_equality(
            a in proptest::collection::vec(0u8..4, 0..24),
            b in proptest::collection::vec(0u8..4, 0..24),
            flip in proptest::num::usize::ANY,
        ) {
            proptest::prop_assert_eq!(same_bytes(&a, &b), a == b);
            proptest::prop_assert!(same_bytes(&a, &a.clone()));
            if !a.is_empty() {
                let mut c = a.clone();
                let at = flip % c.len();
                c[at] ^= 1;
                proptest::prop_assert!(!same_bytes(&a, &c));
            }
        }
    }
}
