//! The operator's notion of now, injectable so that tests of hourly work need not wait hours.

use std::sync::atomic::{AtomicI64, Ordering};

use k8s_openapi::jiff::Timestamp;

pub trait Clock: Send + Sync {
    fn now(&self) -> Timestamp;
}

/// The wall clock.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// A clock that stands still until it is set: tests move it across hour boundaries.
pub struct ManualClock {
    millis: AtomicI64,
}

impl ManualClock {
    pub fn at(now: Timestamp) -> Self {
        Self {
            millis: AtomicI64::new(now.as_millisecond()),
        }
    }

    pub fn set(&self, now: Timestamp) {
        self.millis.store(now.as_millisecond(), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_millisecond(self.millis.load(Ordering::SeqCst))
            .unwrap_or(Timestamp::UNIX_EPOCH)
    }
}
