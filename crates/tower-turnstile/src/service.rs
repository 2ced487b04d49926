//! [`RateLimit`]: the middleware service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;
use turnstile_core::Backend;

use crate::body::RateLimitBody;
use crate::future::ResponseFuture;
use crate::key::KeyExtractor;
use crate::limiter::{Limiter, LiveLimiter};

/// The rate-limiting middleware built by [`RateLimitLayer`](crate::RateLimitLayer).
///
/// Readiness is the inner service's: [`Service::poll_ready`](https://docs.rs/tower-service/0.3/tower_service/trait.Service.html#tymethod.poll_ready) forwards it and nothing else.
/// [`Service::call`](https://docs.rs/tower-service/0.3/tower_service/trait.Service.html#tymethod.call) checks the request and calls the inner service that was made ready
/// only if the request is admitted: at once when the backend decides inside the call (in
/// memory), else from the response future, which then takes the ready service (leaving a
/// fresh clone behind). A denial is a response (`429`), not an error, so the error type
/// is the inner service's.
///
/// The response type is the inner service's too: its body type must implement
/// [`RateLimitBody`] (axum's and tonic's bodies do, with the features of the same names), in
/// which the layer writes its own answers.
pub struct RateLimit<S, B, K> {
    pub(crate) inner: S,
    pub(crate) limiter: Arc<Limiter<B, K>>,
    pub(crate) live: Option<LiveLimiter<B, K>>,
}

impl<S: Clone, B, K> Clone for RateLimit<S, B, K> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            limiter: Arc::clone(&self.limiter),
            live: self.live.clone(),
        }
    }
}

impl<S: fmt::Debug, B, K: fmt::Debug> fmt::Debug for RateLimit<S, B, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("rules", &self.limiter.settings.rules)
            .field("key", &self.limiter.key)
            .finish_non_exhaustive()
    }
}

impl<S, B, K> RateLimit<S, B, K> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes the middleware, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, B, K, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, B, K>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    B: Backend,
    K: KeyExtractor,
    ResBody: RateLimitBody,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<B, K, S, Request<ReqBody>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // A reloadable layer: the configuration in force when the request arrives decides it
        // to the end. The service made ready is called here when the check is decided at
        // once; otherwise the future takes it (leaving a clone for the next call).
        match &self.live {
            // (A guard, not a reference count, while `call` runs: the future clones the
            // configuration only if it waits.)
            Some(live) => ResponseFuture::start(&live.load(), &mut self.inner, req),
            None => ResponseFuture::start(&self.limiter, &mut self.inner, req),
        }
    }
}
