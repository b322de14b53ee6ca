//! The one way a data-plane process runs its blocking loop (counting, merging, combining): on
//! a thread of its own, until the loop returns or the shutdown signal comes; then the loop is
//! told to stop and awaited, so that it finishes its last checkpoint or commit. A loop that
//! panics is reported as a panic, with its message, not as some other error.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::Error;

/// Runs `body` on a blocking thread with a stop flag. When `shutdown` resolves first, `stopping`
/// is logged, the flag is set, and `body` is awaited. Returns what `body` returned, or
/// [`Error::Panicked`] naming `what` if it panicked.
pub async fn run_until<E>(
    what: &'static str,
    stopping: &'static str,
    shutdown: impl Future<Output = ()>,
    body: impl FnOnce(&AtomicBool) -> Result<(), E> + Send + 'static,
) -> Result<(), E>
where
    E: From<Error> + Send + 'static,
{
    let stop = Arc::new(AtomicBool::new(false));
    let stopper = stop.clone();
    let running = tokio::task::spawn_blocking(move || body(&stopper));
    tokio::pin!(running);
    let joined = tokio::select! {
        joined = &mut running => joined,
        () = shutdown => {
            tracing::info!("{stopping}");
            stop.store(true, Ordering::SeqCst);
            running.await
        }
    };
    joined.unwrap_or_else(|err| {
        let message = match err.try_into_panic() {
            Ok(panic) => panic_message(panic.as_ref()),
            Err(err) => err.to_string(),
        };
        tracing::error!(what, message, "panicked");
        Err(Error::Panicked { what, message }.into())
    })
}

/// The text a panic was raised with (`panic!` with a literal or a formatted message).
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    enum TestError {
        Loop(&'static str),
        Runtime(Error),
    }

    impl From<Error> for TestError {
        fn from(err: Error) -> Self {
            Self::Runtime(err)
        }
    }

    #[tokio::test]
    async fn a_panic_in_the_loop_is_reported_as_a_panic_with_its_message() {
        let result = run_until("counting", "stopping", std::future::pending(), |_| {
            let shard = 7;
            panic!("shard {shard} exploded")
        })
        .await;
        match result {
            Err(TestError::Runtime(err @ Error::Panicked { .. })) => {
                assert_eq!(err.to_string(), "counting panicked: shard 7 exploded")
            }
            other => panic!("not reported as a panic: {other:?}"),
        }
    }

    #[tokio::test]
    async fn the_loop_s_own_error_comes_back_as_it_is() {
        let result = run_until("merging", "stopping", std::future::pending(), |_| {
            Err(TestError::Loop("the store is full"))
        })
        .await;
        assert!(matches!(result, Err(TestError::Loop("the store is full"))));
    }

    #[tokio::test]
    async fn on_shutdown_the_loop_is_told_to_stop_and_awaited() {
        let (finished_tx, finished_rx) = std::sync::mpsc::channel();
        let result: Result<(), TestError> =
            run_until("combining", "stopping", async {}, move |stop| {
                while !stop.load(Ordering::SeqCst) {
                    std::thread::park_timeout(std::time::Duration::from_millis(5));
                }
                finished_tx
                    .send("committed")
                    .map_err(|_| TestError::Loop("no receiver"))
            })
            .await;
        assert!(result.is_ok());
        assert_eq!(finished_rx.try_recv(), Ok("committed"));
    }
}
