//! Epoch-aligned bucket arithmetic. A bucket `i` of width `b` covers `[i*b, (i+1)*b)`.

/// Index of the bucket holding `time_ms`.
pub fn bucket_index(time_ms: i64, bucket_ms: i64) -> i64 {
    time_ms.div_euclid(bucket_ms)
}

/// Latest bucket boundary at or before `watermark_ms`: the end of the newest window whose
/// buckets are all closed.
pub fn closed_boundary(watermark_ms: i64, bucket_ms: i64) -> i64 {
    watermark_ms.div_euclid(bucket_ms).saturating_mul(bucket_ms)
}

/// First bucket boundary strictly after `time_ms`: where a window is cut at end of input.
pub fn boundary_after(time_ms: i64, bucket_ms: i64) -> i64 {
    (time_ms.div_euclid(bucket_ms) + 1).saturating_mul(bucket_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_align_to_the_epoch_including_before_it() {
        assert_eq!(bucket_index(0, 10), 0);
        assert_eq!(bucket_index(9, 10), 0);
        assert_eq!(bucket_index(10, 10), 1);
        assert_eq!(bucket_index(-1, 10), -1);
        assert_eq!(closed_boundary(25, 10), 20);
        assert_eq!(closed_boundary(-5, 10), -10);
        assert_eq!(boundary_after(20, 10), 30);
        assert_eq!(boundary_after(19, 10), 20);
    }
}
