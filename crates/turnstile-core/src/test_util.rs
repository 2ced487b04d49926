//! Helpers for the crate's unit tests.

use std::future::Future;

/// The output of a future that is ready at once (every in-memory operation, and the wrappers
/// around a backend that answers at once).
pub(crate) fn now<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    match f
        .as_mut()
        .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
    {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => unreachable!("the future answers at once"),
    }
}
