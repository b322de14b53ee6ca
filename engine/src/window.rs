//! Epoch-aligned bucket arithmetic. A bucket `i` of width `b` covers `[i*b, (i+1)*b)`.

use crate::config::WindowConfig;

/// Which closed buckets a window holds at the end `e` (a bucket index: buckets before `e` are
/// closed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Span {
    /// The newest `n`: `[e - n, e)`. Each bucket is kept until it leaves, to be subtracted.
    Sliding(i64),
    /// Those of the current period of `n` buckets (periods are aligned to the epoch): the
    /// window grows from its period's start to its end, then starts again empty. Closed buckets
    /// are folded into the window's sum and dropped; the sum is cleared when a period starts.
    Tumbling(i64),
    /// Every bucket ever closed, folded into the sum like a tumbling window's.
    AllTime,
}

impl Span {
    pub fn of(cfg: &WindowConfig) -> Self {
        match cfg.buckets() {
            None => Span::AllTime,
            Some(n) if cfg.tumbling => Span::Tumbling(n),
            Some(n) => Span::Sliding(n),
        }
    }

    /// Whether closed buckets stay in the window one by one (rather than folded into its sum).
    pub fn keeps_buckets(self) -> bool {
        matches!(self, Span::Sliding(_))
    }

    /// The first bucket the window ending at `end_idx` holds; `None` for all-time.
    pub fn first_bucket(self, end_idx: i64) -> Option<i64> {
        match self {
            Span::Sliding(n) => Some(end_idx.saturating_sub(n)),
            Span::Tumbling(n) => Some(period_start(end_idx.saturating_sub(1), n)),
            Span::AllTime => None,
        }
    }

    /// For a tumbling window, the first bucket of the period holding bucket `idx`.
    pub fn period_of(self, idx: i64) -> Option<i64> {
        match self {
            Span::Tumbling(n) => Some(period_start(idx, n)),
            Span::Sliding(_) | Span::AllTime => None,
        }
    }
}

fn period_start(idx: i64, n: i64) -> i64 {
    idx.div_euclid(n).saturating_mul(n)
}

/// Index of the bucket holding `time_ms`.
pub fn bucket_index(time_ms: i64, bucket_ms: i64) -> i64 {
    time_ms.div_euclid(bucket_ms)
}

/// [`bucket_index`] that remembers the bounds of the last bucket it returned: nearly every
/// event falls in the same bucket as the one before (buckets last seconds to minutes), and two
/// comparisons are cheaper than a 64-bit division per event and window.
#[derive(Debug, Clone, Copy)]
pub struct BucketFinder {
    bucket_ms: i64,
    /// `[start_ms, end_ms)` of bucket `idx`; empty until a bucket's bounds fit in an i64.
    start_ms: i64,
    end_ms: i64,
    idx: i64,
}

impl BucketFinder {
    pub fn new(bucket_ms: i64) -> Self {
        Self {
            bucket_ms,
            start_ms: 0,
            end_ms: 0,
            idx: 0,
        }
    }

    #[inline]
    pub fn index(&mut self, time_ms: i64) -> i64 {
        if (self.start_ms..self.end_ms).contains(&time_ms) {
            return self.idx;
        }
        let idx = bucket_index(time_ms, self.bucket_ms);
        let start = idx.checked_mul(self.bucket_ms);
        let end = start.and_then(|start| start.checked_add(self.bucket_ms));
        // A bucket at the ends of the i64 range is not remembered rather than clamped.
        (self.start_ms, self.end_ms) = start.zip(end).unwrap_or((0, 0));
        self.idx = idx;
        idx
    }
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

    #[test]
    fn a_tumbling_window_holds_its_period_so_far() {
        let hour_of_minutes = Span::Tumbling(60);
        // At the end of a period it holds the whole period; one bucket later only that bucket.
        assert_eq!(hour_of_minutes.first_bucket(120), Some(60));
        assert_eq!(hour_of_minutes.first_bucket(121), Some(120));
        assert_eq!(hour_of_minutes.first_bucket(179), Some(120));
        assert_eq!(hour_of_minutes.first_bucket(-1), Some(-60));
        assert_eq!(hour_of_minutes.period_of(119), Some(60));
        assert_eq!(Span::Sliding(60).first_bucket(121), Some(61));
        assert_eq!(Span::AllTime.first_bucket(121), None);
        assert!(Span::Sliding(60).keeps_buckets());
        assert!(!hour_of_minutes.keeps_buckets());
    }

    mod finder {
        use proptest::prelude::*;

        use super::super::*;

        fn time() -> impl Strategy<Value = i64> {
            prop_oneof![
                -50i64..50,
                any::<i64>(),
                (0i64..20).prop_map(|d| i64::MIN + d),
                (0i64..20).prop_map(|d| i64::MAX - d),
            ]
        }

        proptest! {
            #[test]
            fn finds_what_the_division_finds(
                bucket_ms in prop_oneof![1i64..20, 1i64..=i64::MAX],
                times in prop::collection::vec(time(), 1..40),
            ) {
                let mut finder = BucketFinder::new(bucket_ms);
                for t in times {
                    prop_assert_eq!(finder.index(t), bucket_index(t, bucket_ms), "time {}", t);
                }
            }
        }
    }
}
