//! Byte comparisons on the counting path.

/// Byte equality in line: keys and the bytes around an event's values are short, and a call to
/// `memcmp` per comparison costs more than comparing a few bytes here.
#[inline(always)]
pub(crate) fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}
